"""Bounded state: over a long steady stream, each strategy's join state stops growing.

51 files, one per micro-batch, each holding one second of event time: 4 left rows and, half a
second later, their 4 right partners. One query runs four joins of that stream side by side (a
union): state-key on 2-second windows, state-value over [0, 2 s], mixed, and the opt-in
unbounded join (no watermark, no time condition). Their per-batch state rows come from the
query's progress. The three strategies must plateau; the unbounded join must keep every row.
"""
from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F

from joins import (
    JoinSide,
    JoinStateCollector,
    StateKeyCondition,
    StateValueCondition,
    inspect_joins,
    stream_join,
)
from joins.testing import FAST_STATE_CONF, StepDriver, row, session_conf

BATCHES = 51  # at least 50 micro-batches
USERS = 4
ROWS_PER_BATCH = 2 * USERS
START_S = 10  # event time starts after the epoch: a row at 0 s would be late under W = 0


def steady_stream(driver: StepDriver) -> None:
    """Write every file up front; distinct modification times fix the order Spark reads them."""
    for k in range(BATCHES):
        rows = []
        for u in range(USERS):
            key = f"k{k}-u{u}"
            t = START_S + k + 0.2 * u
            rows += [row("L", key, t), row("R", key, t + 0.5)]
        path = driver.write(rows)
        os.utime(path, (1_700_000_000 + k, 1_700_000_000 + k))


def _thirds(values):
    n = len(values)
    return values[n // 3: 2 * n // 3], values[2 * n // 3:]


# The second tier (a scale run: 51 micro-batches); make test proves each strategy's eviction
# watermark and evicted rows step by step on small streams (tests/spark/test_joins_scenarios.py).
@pytest.mark.slow
def test_state_plateaus_for_every_strategy_and_grows_without_one(spark, tmp_path):
    driver = StepDriver(spark, tmp_path, max_files_per_trigger=1)
    steady_stream(driver)
    source = driver.source()
    window = StateKeyCondition(window="2 seconds")
    time_range = StateValueCondition(lower=0, upper="2 seconds")
    joins = {"state-key": dict(state_key=window), "state-value": dict(state_value=time_range),
             "mixed": dict(state_key=window, state_value=time_range)}
    outputs = []
    for name, condition in joins.items():
        left, right = driver.split(source)
        result = stream_join(JoinSide(left, "ts", "1 second"), JoinSide(right, "ts", "1 second"),
                             ["id"], **condition)
        outputs.append(result.df.select(F.lit(name).alias("join")))
    left, right = driver.split(source)
    unbounded = stream_join(JoinSide(left, "ts"), JoinSide(right, "ts"), ["id"],
                            allow_unbounded_state=True)
    outputs.append(unbounded.df.select(F.lit("unbounded").alias("join")))
    union = outputs[0].unionAll(outputs[1]).unionAll(outputs[2]).unionAll(outputs[3])

    with session_conf(spark, FAST_STATE_CONF):
        query = (union.writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination()
    collector = JoinStateCollector()
    collector.add_all(p for p in query.recentProgress if p["numInputRows"] > 0)
    assert [(i.left.strategy, i.right.strategy) for i in inspect_joins(query)] == [
        ("state-key", "state-key"), ("state-value", "state-value"), ("state-key", "state-key"),
        ("none", "none")]

    ingested = BATCHES * ROWS_PER_BATCH
    for index, name in enumerate(["state-key", "state-value", "mixed"]):
        rows = collector.rows(index)
        totals = [r.total for r in rows]
        assert len(totals) == BATCHES, name  # one micro-batch per file
        assert sum(r.dropped_by_watermark for r in rows) == 0, name  # nothing late: no shortcut
        middle, last = _thirds(totals)
        assert max(last) <= max(middle), f"{name} state still grows: {totals}"
        # At most 5 seconds of input are ever kept (2 s windows or range, 1 s watermark delay),
        # a tenth of what went in.
        assert max(totals) <= 5 * ROWS_PER_BATCH, f"{name}: {totals}"
        assert 10 * max(totals) <= ingested, f"{name}: {totals}"
        assert sum(r.removed for r in rows) > ingested // 2, name  # eviction really happened

    totals = collector.totals(3)
    assert totals == [ROWS_PER_BATCH * (k + 1) for k in range(BATCHES)]  # every row kept
    middle, last = _thirds(totals)
    assert min(last) > max(middle)
