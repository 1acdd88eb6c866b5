"""The three cleanup strategies on real Spark streams, as exact, step-by-step scenarios.

Each scenario feeds one file per step (both sides in one file, split by a ``side`` column) and
runs ``processAllAvailable()`` after it, so the watermark moves exactly between steps: with a
2-second delay, after a step whose latest row is at t seconds, W = t - 2 s. Rows at or below W
are late. Every step's output is asserted as an exact set, and the plan Spark chose is compared
with the operator's promise.
"""
from __future__ import annotations

import pytest

from joins import (
    JoinSide,
    StateKeyCondition,
    StateValueCondition,
    UnboundedStateError,
    check_cleanup,
    inspect_join,
    stream_join,
)
from joins.metrics import JoinStateCollector
from joins.testing import FAST_STATE_CONF, StepDriver, row, session_conf


def _seconds(value):
    return None if value is None else round(value.timestamp(), 3)


def _pair(r):
    """(left id, left ts s, right id, right ts s) of an output row (None on a padded side)."""
    d = r.asDict()
    return (d.get("left_id"), _seconds(d.get("left_ts")),
            d.get("right_id"), _seconds(d.get("right_ts")))


def _left_only(r):
    d = r.asDict()
    return (d["left_id"], _seconds(d["left_ts"]))


def L(row_id, t):
    return row("L", row_id, t)


def R(row_id, t):
    return row("R", row_id, t)


@pytest.fixture(scope="module", autouse=True)
def _fast_state_store(spark):
    with session_conf(spark, FAST_STATE_CONF):
        yield


@pytest.fixture
def driver(spark, tmp_path):
    d = StepDriver(spark, tmp_path)
    yield d
    d.stop()


def _start(driver, *, left_delay="2 seconds", right_delay="2 seconds", keys=("id",), how="inner",
           to_tuple=_pair, **conditions):
    left, right = driver.split(driver.source())
    result = stream_join(JoinSide(left, "ts", left_delay), JoinSide(right, "ts", right_delay),
                         list(keys), how=how, **conditions)
    driver.start(result.df, to_tuple)
    return result


# Scenario 1 and 2 data: (step rows, rows that step must emit). After step 1, W = 10 - 2 = 8 s:
# in step 2, l1@5 is late on both sides, and x@3 on the right is late although its left partner
# (step 0) was on time. ok@9 is above W and joins.
TIMESTAMP_EQUALITY_STEPS = [
    ([L("a", 1), L("x", 3), R("a", 1)], {("a", 1, "a", 1)}),
    ([L("m", 10), R("m", 10)], {("m", 10, "m", 10)}),
    ([L("l1", 5), R("l1", 5), L("ok", 9), R("ok", 9), R("x", 3)], {("ok", 9, "ok", 9)}),
]


def _run_steps(driver, steps):
    for n, (rows, expected) in enumerate(steps):
        assert set(driver.step(rows)) == expected, f"step {n}"


def test_scenario1_state_key_on_timestamp_with_watermark_on_both_sides(driver):
    result = _start(driver, state_key=StateKeyCondition())
    _run_steps(driver, TIMESTAMP_EQUALITY_STEPS)

    inspection = inspect_join(driver.query)
    assert (inspection.left.strategy, inspection.right.strategy) == ("state-key", "state-key")
    assert inspection.eviction_watermark_ms == 8000
    assert inspection.left.threshold_ms == inspection.right.threshold_ms == 8000
    assert check_cleanup(result.expected, inspection) == []
    # Late rows are dropped on input by each watermarked side: l1 (both sides) and x (right).
    dropped = sum(r.dropped_by_watermark
                  for r in JoinStateCollector().add_all(driver.query.recentProgress))
    assert dropped == 3


def test_scenario2_state_key_with_watermark_on_one_side_only(driver):
    result = _start(driver, right_delay=None, state_key=StateKeyCondition())
    _run_steps(driver, TIMESTAMP_EQUALITY_STEPS)

    inspection = inspect_join(driver.query)
    # One watermark is enough: the right timestamp is the same key, so both sides are evicted.
    assert (inspection.left.strategy, inspection.right.strategy) == ("state-key", "state-key")
    assert inspection.left.threshold_ms == inspection.right.threshold_ms == 8000
    assert result.expected.right.has_watermark is False
    assert check_cleanup(result.expected, inspection) == []
    # Only the watermarked left side drops late input (l1); the late right rows are kept as
    # input but find no partner, as their left partners are evicted or were dropped.
    dropped = sum(r.dropped_by_watermark
                  for r in JoinStateCollector().add_all(driver.query.recentProgress))
    assert dropped == 1


def test_scenario3_state_key_on_5_second_windows(driver):
    result = _start(driver, state_key=StateKeyCondition(window="5 seconds"))
    _run_steps(driver, [
        # a@1 and a@3 share the window [0, 5).
        ([L("a", 1), L("b", 4), R("a", 3)], {("a", 1, "a", 3)}),
        # b@6 is in [5, 10) while its partner b@4 was in [0, 5): never joins.
        ([L("z", 12), R("z", 12), R("b", 6)], {("z", 12, "z", 12)}),
        # W = 12 - 2 = 10 s: the window [0, 5) has ended, so b@4 on the right is late, despite
        # being in the left b's window.
        ([L("c", 13), R("c", 14), R("b", 4)], {("c", 13, "c", 14)}),
    ])
    inspection = inspect_join(driver.query)
    assert inspection.left.strategy == inspection.right.strategy == "state-key"
    assert (inspection.left.column, inspection.left.field) == ("left_join_window", "end")
    # Each side has its own watermark and the query takes the minimum: min(13, 14) - 2 s.
    assert inspection.left.threshold_ms == inspection.eviction_watermark_ms == 11000
    assert check_cleanup(result.expected, inspection) == []
    # The helper window columns are dropped from the output.
    assert not {"left_join_window", "right_join_window"} & set(result.df.columns)


def test_scenario4_state_value_right_after_left_plus_2_seconds(driver, spark):
    condition = StateValueCondition(lower="2 seconds", lower_inclusive=False)
    left, right = driver.split(driver.source())
    # Only right rows can be evicted (no upper bound): refused unless explicitly accepted.
    with pytest.raises(UnboundedStateError, match="left side .*upper bound"):
        stream_join(JoinSide(left, "ts", "2 seconds"), JoinSide(right, "ts", "2 seconds"), ["id"],
                    state_value=condition)
    result = _start(driver, state_value=condition, allow_unbounded_state=True)
    _run_steps(driver, [
        # right.ts > left.ts + 2: a@2 and c@3 (equal to the bound) are outside, b@4 inside.
        ([L("a", 1), L("b", 1), L("c", 1), R("a", 2), R("b", 4), R("c", 3)], {("b", 1, "b", 4)}),
        # W = 2 s. The left state is never cleaned, so a@1 still joins a@8; z joins z.
        ([L("z", 12), R("z", 15), R("a", 8), R("y", 13), L("y", 12)],
         {("a", 1, "a", 8), ("z", 12, "z", 15)}),
    ])
    inspection = inspect_join(driver.query)
    assert (inspection.left.strategy, inspection.right.strategy) == ("none", "state-value")
    # Right rows go once right.ts <= W + 2 s (exclusive bound: no 1 ms margin).
    assert inspection.right.threshold_ms == inspection.eviction_watermark_ms + 2000
    assert check_cleanup(result.expected, inspection) == []


def test_scenario5_different_delays_follow_the_minimum_watermark(driver):
    result = _start(driver, left_delay="2 seconds", right_delay="20 seconds",
                    state_value=StateValueCondition(lower="2 seconds", lower_inclusive=False,
                                                    upper="10 seconds"))
    assert driver.step([L("a", 1), R("a", 5)]) == [("a", 1, "a", 5)]
    assert driver.step([L("m", 21), R("m", 21)]) == []
    # Left watermark 21 - 2 = 19 s, right 21 - 20 = 1 s: the query follows the minimum.
    assert driver.query.lastProgress["eventTime"]["watermark"] == "1970-01-01T00:00:01.000Z"
    inspection = inspect_join(driver.query)
    assert inspection.eviction_watermark_ms == 1000
    assert inspection.left.threshold_ms == 1000 - 10000 - 1
    assert inspection.right.threshold_ms == 1000 + 2000
    assert check_cleanup(result.expected, inspection) == []
    # Under the 19 s left watermark n@5 would be late; under the global 1 s it still joins.
    assert set(driver.step([L("n", 5), R("n", 9)])) == {("n", 5, "n", 9)}


def test_scenario6_state_value_on_windows_compared_by_inequality(driver):
    condition = StateValueCondition(lower=0, lower_inclusive=False, window="5 seconds")
    result = _start(driver, state_value=condition, allow_unbounded_state=True)
    _run_steps(driver, [
        # right.window > left.window: same-window pairs (a@1/a@2, b@6/b@7) never join; a@8 is
        # in [5, 10), after a@1's [0, 5).
        ([L("a", 1), L("b", 6), R("a", 2), R("b", 7), R("a", 8)], {("a", 1, "a", 8)}),
        # z@21 pairs share a window; b@12 ([10, 15)) follows b@6 ([5, 10)).
        ([L("z", 21), R("z", 21), R("b", 12)], {("b", 6, "b", 12)}),
    ])
    inspection = inspect_join(driver.query)
    assert (inspection.left.strategy, inspection.right.strategy) == ("none", "state-value")
    assert (inspection.right.column, inspection.right.field) == ("right_join_window", "end")
    assert inspection.right.threshold_ms == inspection.eviction_watermark_ms == 19000
    assert check_cleanup(result.expected, inspection) == []


def test_scenario7_mixed_uses_the_state_key_predicate_and_matches_scenario1(driver):
    result = _start(driver, state_key=StateKeyCondition(),
                    state_value=StateValueCondition(lower="-1 second", upper="1 second"))
    _run_steps(driver, TIMESTAMP_EQUALITY_STEPS)
    inspection = inspect_join(driver.query)
    assert (inspection.left.strategy, inspection.right.strategy) == ("state-key", "state-key")
    assert "key predicate" in inspection.node and "value predicate" not in inspection.node
    assert check_cleanup(result.expected, inspection) == []


def test_left_outer_emits_padded_rows_once_the_watermark_passes_the_key(driver):
    _start(driver, how="left_outer", state_key=StateKeyCondition())
    # x@3 has no partner. After step 0, W = 1 s < 3: not emitted yet.
    assert set(driver.step([L("a", 1), L("x", 3), R("a", 1)])) == {("a", 1, "a", 1)}
    # After step 1, W = 8 s >= 3: x is evicted and emitted with nulls in the same step.
    assert set(driver.step([L("m", 10), R("m", 10)])) == {("m", 10, "m", 10), ("x", 3, None, None)}
    assert set(driver.step([L("ok", 9), R("ok", 9)])) == {("ok", 9, "ok", 9)}


def test_full_outer_state_value_emits_padded_rows_exactly_when_the_bound_passes(driver):
    result = _start(driver, how="full_outer",
                    state_value=StateValueCondition(lower="0 seconds", upper="5 seconds"))
    # left.ts <= right.ts <= left.ts + 5 s, both inclusive: a left row goes once
    # W - 5 s - 1 ms >= left.ts, a right row once W - 1 ms >= right.ts.
    assert driver.step([L("a", 1), R("b", 2)]) == []                       # W = 0
    assert set(driver.step([L("m", 3), R("m", 3)])) == {("m", 3, "m", 3)}  # W = 1
    assert set(driver.step([L("n", 4), R("n", 4)])) == {("n", 4, "n", 4)}  # W = 2: b@2 stays
    assert set(driver.step([L("o", 5), R("o", 5)])) == {("o", 5, "o", 5),  # W = 3: b@2 goes
                                                        (None, None, "b", 2)}
    assert set(driver.step([L("p", 8), R("p", 8)])) == {("p", 8, "p", 8)}  # W = 6: a@1 stays
    assert set(driver.step([L("q", 9), R("q", 9)])) == {("q", 9, "q", 9),  # W = 7: a@1 goes
                                                        ("a", 1, None, None)}
    inspection = inspect_join(driver.query)
    assert inspection.join_type == "FullOuter"
    assert check_cleanup(result.expected, inspection) == []


def test_left_semi_emits_each_matched_left_row_once(driver):
    _start(driver, how="left_semi", state_key=StateKeyCondition(), to_tuple=_left_only)
    assert set(driver.step([L("a", 1), L("x", 3), R("a", 1), R("a", 1)])) == {("a", 1)}
    assert set(driver.step([L("m", 10), R("m", 10), R("a", 1)])) == {("m", 10)}


@pytest.mark.parametrize("upstream", [False, True], ids=["declared", "applied-upstream"])
def test_rows_with_a_null_key_still_advance_the_watermark(spark, driver, upstream):
    # The join infers isnotnull(id); were that filter pushed below the watermark, the null-id
    # rows at 20 s would not count and W would stay at 10 - 2 = 8 s.
    left, right = driver.split(driver.source())
    if upstream:
        left, right = left.withWatermark("ts", "2 seconds"), right.withWatermark("ts", "2 seconds")
    result = stream_join(JoinSide(left, "ts", "2 seconds"), JoinSide(right, "ts", "2 seconds"),
                         ["id"], state_key=StateKeyCondition())
    driver.start(result.df, _pair)
    assert driver.step([L("a", 10), R("a", 10)]) == [("a", 10, "a", 10)]
    assert driver.step([L(None, 20), R(None, 20)]) == []
    assert driver.query.lastProgress["eventTime"]["watermark"] == "1970-01-01T00:00:18.000Z"
