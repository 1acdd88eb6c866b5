"""``stream_join`` on real streaming DataFrames: guardrails, and the strategy Spark really uses.

The guardrail tests only build DataFrames (no query runs). The matrix test runs every strategy
with every join type in one query (a union of 20 joins) and checks each join's plan against its
operator's promise. The cross-check tests show that what the guardrails refuse is indeed broken
in plain Spark: rejected at start, or accepted with a side that is never evicted.
"""
from __future__ import annotations

import itertools

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from joins import (
    JOIN_TYPES,
    JoinSide,
    JoinSpecError,
    StateKeyCondition,
    StateValueCondition,
    UnboundedStateError,
    UnsupportedOuterJoinError,
    check_cleanup,
    inspect_join,
    inspect_joins,
    stream_join,
)
from joins.testing import FAST_STATE_CONF, StepDriver, row, session_conf


@pytest.fixture(scope="module", autouse=True)
def _fast_state_store(spark):
    with session_conf(spark, FAST_STATE_CONF):
        yield


@pytest.fixture
def sides(spark, tmp_path):
    """An unstarted stream split into left and right DataFrames (id, ts)."""
    return StepDriver.split(StepDriver(spark, tmp_path).source())


RANGE = StateValueCondition(lower=0, upper="5 seconds")


# --- guardrails -------------------------------------------------------------------------------

def test_inner_join_without_watermark_or_condition_is_refused(sides):
    left, right = sides
    with pytest.raises(UnboundedStateError) as err:
        stream_join(JoinSide(left, "ts"), JoinSide(right, "ts"), ["id"])
    message = str(err.value)
    assert "left side (left) misses a time condition" in message
    assert "a watermark on at least one side" in message
    assert "allow_unbounded_state=True" in message


def test_state_key_without_any_watermark_is_refused(sides):
    left, right = sides
    with pytest.raises(UnboundedStateError,
                       match=r"a watermark on at least one side \(the state-key"):
        stream_join(JoinSide(left, "ts"), JoinSide(right, "ts"), ["id"],
                    state_key=StateKeyCondition())


def test_the_opt_in_builds_an_unbounded_join_and_says_so(sides):
    left, right = sides
    result = stream_join(JoinSide(left, "ts"), JoinSide(right, "ts"), ["id"],
                         allow_unbounded_state=True)
    assert result.df.isStreaming
    assert result.df.columns == ["left_id", "left_ts", "right_id", "right_ts"]
    assert [s.strategy for s in result.expected.sides()] == ["none", "none"]
    assert "never evicted" in result.describe()


def test_left_outer_with_an_unwatermarked_left_side_is_refused(sides):
    left, right = sides
    with pytest.raises(UnsupportedOuterJoinError,
                       match=r"left_outer join .*left side \(left\) is never evicted.*"
                             r"a watermark on the left side.*To fix it"):
        stream_join(JoinSide(left, "ts"), JoinSide(right, "ts", "2 seconds"), ["id"],
                    state_value=RANGE, how="left_outer")


@pytest.mark.parametrize("how,condition,fix", [
    ("right_outer", StateValueCondition(upper="5 seconds"), "with a lower bound"),
    ("full_outer", StateValueCondition(upper="5 seconds"), "with a lower bound"),
    ("left_outer", StateValueCondition(lower=0), "with an upper bound"),
    ("left_semi", StateValueCondition(lower=0), "with an upper bound"),
])
def test_outer_joins_missing_a_bound_are_refused_even_with_the_opt_in(sides, how, condition, fix):
    left, right = sides
    with pytest.raises(UnsupportedOuterJoinError, match=f"{how} join is not supported.*{fix}"):
        stream_join(JoinSide(left, "ts", "2 seconds"), JoinSide(right, "ts", "2 seconds"), ["id"],
                    state_value=condition, how=how, allow_unbounded_state=True)


@pytest.mark.parametrize("build,message", [
    (lambda l, r: stream_join(JoinSide(l, "ts", "2 seconds"), JoinSide(r, "ts", "2 seconds"), [],
                              state_value=RANGE), "needs at least one equality"),
    (lambda l, r: stream_join(JoinSide(l, "ts", "2 seconds"), JoinSide(r, "time", "2 seconds"),
                              ["id"], state_value=RANGE),
     "right side has no column\\(s\\) 'time'; its columns are id, ts"),
    (lambda l, r: stream_join(JoinSide(l, "ts", "2 seconds", prefix=""),
                              JoinSide(r, "ts", "2 seconds", prefix=""), ["id"], state_value=RANGE),
     "output columns clash after prefixing \\(id, ts\\)"),
    (lambda l, r: stream_join(JoinSide(l.withWatermark("ts", "5 seconds"), "ts", "2 seconds"),
                              JoinSide(r, "ts", "2 seconds"), ["id"], state_value=RANGE),
     "already has a watermark delay of 5000 ms"),
    (lambda l, r: stream_join(JoinSide(l.withColumn("t2", F.col("ts"))
                                       .withWatermark("t2", "1 second"),
                                       "ts", "2 seconds"),
                              JoinSide(r, "ts", "2 seconds"), ["id"], state_value=RANGE),
     "already has a watermark on column 't2'"),
    (lambda l, r: stream_join(JoinSide(l.withColumn("ts", F.col("ts").cast("long")), "ts",
                                       "2 seconds"),
                              JoinSide(r, "ts", "2 seconds"), ["id"], state_value=RANGE),
     "must be a timestamp, got bigint"),
    (lambda l, r: stream_join(JoinSide(l, "ts", "two seconds"), JoinSide(r, "ts", "2 seconds"),
                              ["id"], state_value=RANGE), "not a duration"),
])
def test_declaration_mistakes_get_clear_errors(sides, build, message):
    with pytest.raises(JoinSpecError, match=message):
        build(*sides)


def test_a_watermark_applied_upstream_is_detected(sides):
    left, right = sides
    result = stream_join(JoinSide(left.withWatermark("ts", "5 seconds"), "ts"),
                         JoinSide(right, "ts", "2 seconds"), ["id"], state_value=RANGE)
    assert result.expected.left.watermark_delay_ms == 5000
    assert result.expected.left.strategy == result.expected.right.strategy == "state-value"


# --- what plain Spark does with the joins the guardrails refuse ------------------------------

def _raw_join(spark, tmp_path, left_delay, right_delay, condition, how):
    driver = StepDriver(spark, tmp_path)
    left, right = driver.split(driver.source())
    if left_delay:
        left = left.withWatermark("ts", left_delay)
    if right_delay:
        right = right.withWatermark("ts", right_delay)
    joined = left.alias("l").join(right.alias("r"), F.expr(f"l.id = r.id AND {condition}"), how)
    return driver, joined


def test_spark_itself_rejects_a_right_outer_join_without_a_lower_bound(spark, tmp_path):
    driver, joined = _raw_join(spark, tmp_path, "2 seconds", "2 seconds",
                               "r.ts <= l.ts + interval 5 seconds", "right_outer")
    with pytest.raises(AnalysisException, match="RightOuter join .* not supported"):
        driver.start(joined)


def test_spark_accepts_a_left_outer_join_it_can_never_evict(spark, tmp_path):
    # The left side has no watermark: Spark plans the join, but evicts neither side, so the
    # left rows' null-padded output would never come. Our guardrail refuses this join.
    driver, joined = _raw_join(spark, tmp_path, None, "2 seconds",
                               "r.ts >= l.ts AND r.ts <= l.ts + interval 5 seconds", "left_outer")
    driver.start(joined, to_tuple=lambda r: (r[0], r[2]))
    try:
        driver.step([row("L", "a", 1), row("R", "m", 30)])
        # W = 58 s, far past a@1 + 5 s: a correct left outer join would have emitted (a, null).
        assert driver.step([row("L", "z", 60), row("R", "z", 60)]) == [("z", "z")]
        inspection = inspect_join(driver.query)
        assert inspection.eviction_watermark_ms == 28000
        assert (inspection.left.strategy, inspection.right.strategy) == ("none", "none")
    finally:
        driver.stop()


# --- every strategy with every join type -------------------------------------------------------

STRATEGIES = {
    "state-key": dict(state_key=StateKeyCondition()),
    "state-key-window": dict(state_key=StateKeyCondition(window="5 seconds")),
    "state-value": dict(state_value=RANGE),
    "mixed": dict(state_key=StateKeyCondition(window="5 seconds"), state_value=RANGE),
}
SPARK_STRATEGY = {"state-key": "state-key", "state-key-window": "state-key",
                  "state-value": "state-value", "mixed": "state-key"}


def test_detected_strategy_matches_the_requested_one_for_every_join_type(spark, tmp_path):
    driver = StepDriver(spark, tmp_path)
    source = driver.source()
    results, outputs = [], []
    for n, (strategy, how) in enumerate(itertools.product(STRATEGIES, JOIN_TYPES)):
        left, right = driver.split(source)
        result = stream_join(JoinSide(left, "ts", "2 seconds", name=f"j{n}l"),
                             JoinSide(right, "ts", "2 seconds", name=f"j{n}r"), ["id"], how=how,
                             **STRATEGIES[strategy])
        results.append((strategy, how, result))
        outputs.append(result.df.select(F.lit(f"{strategy}/{how}").alias("join")))
    union = outputs[0]
    for out in outputs[1:]:
        union = union.unionAll(out)
    driver.start(union)
    try:
        # e@4 pairs match every condition; a@1/a@2 match all but timestamp equality; b and c
        # never match.
        emitted = driver.step([row("L", "a", 1), row("R", "a", 2), row("L", "b", 3),
                               row("L", "e", 4), row("R", "e", 4), row("R", "c", 9)])
        inspections = inspect_joins(driver.query)
    finally:
        driver.stop()

    assert len(inspections) == len(results) == 20
    for (strategy, how, result), inspection in zip(results, inspections):
        label = f"{strategy}/{how}"
        strategies = (inspection.left.strategy, inspection.right.strategy)
        assert strategies == (SPARK_STRATEGY[strategy],) * 2, label
        assert check_cleanup(result.expected, inspection) == [], label
    # Every join ran and emitted its matches: 20 joins, e under all, a under all but 5 (the
    # timestamp-equality joins), each semi join once per matched left row.
    counts = {}
    for (label,) in emitted:
        counts[label] = counts.get(label, 0) + 1
    assert set(counts) == {f"{s}/{h}" for s in STRATEGIES for h in JOIN_TYPES}
    assert counts["state-key/inner"] == 1 and counts["state-value/inner"] == 2
    assert counts["mixed/left_semi"] == 2
