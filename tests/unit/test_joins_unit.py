"""The Spark-free parts of ``joins``: declarations, the cleanup model, plan parsing, metrics.

The plan lines below were printed by Spark 4.3 for the scenario joins (``query.explain()``).
"""
from __future__ import annotations

import pytest

from joins.cleanup import SideFacts, expected_cleanup
from joins.guardrails import (
    UnboundedStateError,
    UnsupportedOuterJoinError,
    check_bounded,
    check_outer,
)
from joins.inspect import CleanupMismatch, assert_cleanup, check_cleanup, parse_plan
from joins.metrics import JoinStateCollector, join_state_rows
from joins.spec import (
    JoinSpecError,
    StateKeyCondition,
    StateValueCondition,
    duration_ms,
    normalize_join_type,
    normalize_keys,
    strategy_of,
    validate_conditions,
)

KEY_PLAN = (
    ":- StreamingSymmetricHashJoin [id#0, ts#1-T2000ms], [id#3, ts#4-T2000ms], Inner, condition = "
    "[ leftOnly = null, rightOnly = null, both = null, full = null ], state info [ checkpoint = "
    "file:/tmp/ck/state, runId = 42ee2a61, opId = 0, ver = 2, numPartitions = 2] "
    "stateStoreCkptIds = None, 0, 8000, state cleanup [ left key predicate: (input[1, timestamp, "
    "true] <= 8000000), right key predicate: (input[1, timestamp, true] <= 8000000) ], 2, Append")
VALUE_PLAN = (
    "StreamingSymmetricHashJoin [id#1], [id#5], FullOuter, condition = [ leftOnly = null, "
    "rightOnly = null, both = ((ts#6-T20000ms >= ts#2-T2000ms) AND (ts#6-T20000ms <= "
    "ts#2-T2000ms + INTERVAL "
    "'03' SECOND)), full = (...) ], state info [ checkpoint = file:/tmp/ck/state, runId = d9e5, "
    "opId = 3, ver = 2, numPartitions = 2] stateStoreCkptIds = None, 0, 1000, state cleanup [ left "
    "value predicate: (ts#2-T2000ms <= -2001000), right value predicate: (ts#6-T20000ms <= 999000) "
    "], 2, Append")
WINDOW_ONE_SIDED_PLAN = (
    "+- StreamingSymmetricHashJoin [id#730], [id#732], Inner, condition = [ leftOnly = null, "
    "rightOnly = null, both = (win#738-T2000ms > win#735-T2000ms), full = (win#738-T2000ms > "
    "win#735-T2000ms) ], state info [ checkpoint = file:/tmp/ck/state, runId = 6b87, opId = 0, "
    "ver = 3, numPartitions = 2] stateStoreCkptIds = None, 4000, 19000, state cleanup [ left = "
    "null, right value predicate: (win#738-T2000ms.end <= 19000000) ], 2, Append")
WINDOW_KEY_PLAN = (
    "StreamingSymmetricHashJoin [id#24, win#29-T2000ms], [id#26, win#32-T2000ms], LeftSemi, "
    "condition = [ leftOnly = null, rightOnly = null, both = null, full = null ], state info [ "
    "opId = 1, ver = 5, numPartitions = 2] stateStoreCkptIds = None, 10000, 11000, state cleanup "
    "[ left key predicate: (input[1, struct<start:timestamp,end:timestamp>, true].end <= 11000000),"
    " right key predicate: (input[1, struct<start:timestamp,end:timestamp>, true].end <= 11000000)"
    " ], 2, Append")
NO_CLEANUP_PLAN = (
    "StreamingSymmetricHashJoin [id#1331], [id#1333], Inner, condition = [ leftOnly = null, "
    "rightOnly = null, both = null, full = null ], state info [ opId = 0, ver = 0, numPartitions = "
    "2] stateStoreCkptIds = None, 0, 0, state cleanup [ left = null, right = null ], 2, Append")


def facts(side, delay="2 seconds", window=False):
    return SideFacts(side, side, "ts", "win" if window else None, duration_ms(delay, "delay"))


# --- declarations -------------------------------------------------------------------------

def test_durations_accept_text_ms_and_negative_offsets_only_where_allowed():
    assert duration_ms("2 seconds", "x") == 2000
    assert duration_ms(1500, "x") == 1500
    assert duration_ms("-5 minutes", "x", allow_negative=True) == -300_000
    with pytest.raises(JoinSpecError, match="must not be negative"):
        duration_ms("-1 second", "watermark_delay")
    with pytest.raises(JoinSpecError, match="watermark_delay: not a duration"):
        duration_ms("soon", "watermark_delay")


@pytest.mark.parametrize("ms,text", [(0.5, "0.5 ms"), (1500, "1.5 s"), (120_000, "2 min"),
                                     (-90_000, "-1.5 min"), (27_372_984_247, "317 days"),
                                     (999.6 * 86_400_000, "1000 days"),
                                     (1.1e15, "12731481 days")])
def test_formatted_durations_keep_three_digits_and_never_use_an_exponent(ms, text):
    from joins.durations import format_duration_ms

    assert format_duration_ms(ms) == text


@pytest.mark.parametrize("how,canonical", [("inner", "inner"), ("left", "left_outer"),
                                           ("LEFT-OUTER", "left_outer"), ("outer", "full_outer"),
                                           ("semi", "left_semi"), ("rightouter", "right_outer")])
def test_join_type_spellings(how, canonical):
    assert normalize_join_type(how) == canonical


def test_unsupported_join_type_lists_the_supported_ones():
    with pytest.raises(JoinSpecError,
                       match="left_anti.*inner, left_outer, right_outer, full_outer, left_semi"):
        normalize_join_type("left_anti")


def test_keys_and_their_errors():
    assert normalize_keys(["id", ("a", "b")]) == [("id", "id"), ("a", "b")]
    assert normalize_keys("id") == [("id", "id")]
    with pytest.raises(JoinSpecError, match="column name or a \\(left, right\\) pair"):
        normalize_keys([("a", "b", "c")])


@pytest.mark.parametrize("condition,message", [
    (StateValueCondition(), "needs a lower and/or an upper bound"),
    (StateValueCondition(lower="5 seconds", upper="1 second"), "range is empty"),
    (StateValueCondition(lower=0, upper=0, upper_inclusive=False), "range is empty"),
    (StateValueCondition(lower="1 second", window="5 seconds"), "must be 0 or omitted"),
])
def test_invalid_time_ranges(condition, message):
    with pytest.raises(JoinSpecError, match=message):
        validate_conditions(None, condition)


def test_window_sizes_must_agree_in_a_mixed_window_join():
    with pytest.raises(JoinSpecError, match="same window size"):
        validate_conditions(StateKeyCondition(window="5 seconds"),
                            StateValueCondition(lower=0, window="10 seconds"))
    assert validate_conditions(StateKeyCondition(window="5 seconds"),
                               StateValueCondition(lower=0, upper="3 seconds")) == 5000


def test_strategy_names():
    key, value = StateKeyCondition(), StateValueCondition(upper="1 second")
    assert [strategy_of(key, None), strategy_of(None, value), strategy_of(key, value),
            strategy_of(None, None)] == ["state-key", "state-value", "mixed", "none"]


# --- the cleanup model ----------------------------------------------------------------------

def test_state_key_cleans_both_sides_with_one_watermark():
    expected = expected_cleanup(facts("left"), facts("right", delay=None), "inner",
                                StateKeyCondition(), None)
    assert [s.strategy for s in expected.sides()] == ["state-key", "state-key"]
    assert expected.left.threshold_ms(8000) == expected.right.threshold_ms(8000) == 8000


def test_window_key_evicts_on_window_end():
    expected = expected_cleanup(facts("left", window=True), facts("right", window=True), "inner",
                                StateKeyCondition(window="5 seconds"), None)
    assert (expected.left.column, expected.left.field) == ("win", "end")


@pytest.mark.parametrize("condition,left_offset,right_offset", [
    # left.ts + lower <= right.ts <= left.ts + upper; Spark evicts <= threshold, so an inclusive
    # bound keeps one more millisecond.
    (StateValueCondition(lower=0, upper="5 seconds"), -5001, -1),
    (StateValueCondition(lower="2 seconds", lower_inclusive=False, upper="10 seconds"),
     -10001, 2000),
    (StateValueCondition(lower="-3 seconds", upper="10 seconds", upper_inclusive=False),
     -10000, -3001),
])
def test_state_value_thresholds(condition, left_offset, right_offset):
    expected = expected_cleanup(facts("left"), facts("right"), "inner", None, condition)
    assert (expected.left.offset_ms, expected.right.offset_ms) == (left_offset, right_offset)
    assert expected.left.threshold_ms(19000) == 19000 + left_offset


def test_state_value_lists_what_each_side_misses():
    expected = expected_cleanup(facts("left", delay=None), facts("right"), "inner", None,
                                StateValueCondition(lower=0))
    assert expected.left.strategy == expected.right.strategy == "none"
    assert expected.left.missing == ("a watermark on the left side (left)",
                                     "an upper bound on the time range (StateValueCondition.upper)")
    assert expected.right.missing == ("a watermark on the left side (left)",)


def test_no_condition_and_no_watermark():
    expected = expected_cleanup(facts("left", None), facts("right", None), "inner", None, None)
    assert "a watermark on at least one side" in expected.left.missing
    assert expected.left.missing[0].startswith("a time condition")
    assert "no watermark" in expected.watermark_rule()


def test_watermark_rule_and_outer_row_timing_are_described():
    expected = expected_cleanup(facts("left"), facts("right", delay="20 seconds"), "full_outer",
                                None, StateValueCondition(lower=0, upper="5 seconds"),
                                watermark_policy="min")
    assert expected.watermark_rule() == "W = min(max(ts) - 2000 ms, max(ts) - 20000 ms)"
    assert expected.outer_rows() == [
        "unmatched left (left) rows are emitted with nulls in the batch that evicts them, "
        "i.e. once W - 5001 ms >= ts",
        "unmatched right (right) rows are emitted with nulls in the batch that evicts them, "
        "i.e. once W - 1 ms >= ts"]
    assert "full_outer" in expected.describe() and expected.to_dict()["bounded"] is True


# --- guardrails -------------------------------------------------------------------------------

def test_bounded_check_names_the_side_and_accepts_the_opt_in():
    expected = expected_cleanup(facts("left"), facts("right"), "inner", None,
                                StateValueCondition(lower="2 seconds", lower_inclusive=False))
    with pytest.raises(UnboundedStateError, match=r"left side \(left\) misses an upper bound.*"
                                                  r"allow_unbounded_state=True"):
        check_bounded(expected, allow_unbounded_state=False)
    check_bounded(expected, allow_unbounded_state=True)


@pytest.mark.parametrize("how,side,hint", [
    ("right_outer", "right", "lower bound"),
    ("full_outer", "right", "lower bound"),
])
def test_outer_join_errors_say_how_to_fix(how, side, hint):
    expected = expected_cleanup(facts("left"), facts("right"), how, None,
                                StateValueCondition(upper="5 seconds"))
    with pytest.raises(UnsupportedOuterJoinError, match=f"the {side} side .*never evicted.*{hint}"):
        check_outer(expected)


def test_outer_check_passes_when_the_preserved_side_is_evicted():
    expected = expected_cleanup(facts("left"), facts("right"), "left_outer", None,
                                StateValueCondition(upper="5 seconds"))
    check_outer(expected)  # the right side is unbounded, but that is check_bounded's business
    with pytest.raises(UnboundedStateError):
        check_bounded(expected, allow_unbounded_state=False)


# --- plan parsing and the promise check ------------------------------------------------------

def test_parse_key_predicates():
    [join] = parse_plan("== Physical Plan ==\n" + KEY_PLAN + "\n:- Exchange hashpartitioning(id#0)")
    assert (join.operator_id, join.join_type) == (0, "Inner")
    assert (join.late_events_watermark_ms, join.eviction_watermark_ms) == (0, 8000)
    assert join.left.strategy == join.right.strategy == "state-key"
    assert join.left.predicate == "(input[1, timestamp, true] <= 8000000)"
    assert (join.left.column, join.left.field, join.left.threshold_ms) == ("ts", None, 8000)


def test_parse_value_predicates_with_negative_thresholds():
    [join] = parse_plan(VALUE_PLAN)
    assert (join.operator_id, join.join_type, join.eviction_watermark_ms) == (3, "FullOuter", 1000)
    assert (join.left.strategy, join.left.column, join.left.threshold_ms) == (
        "state-value", "ts", -2001)
    assert (join.right.strategy, join.right.threshold_ms) == ("state-value", 999)


def test_parse_window_predicates_and_missing_sides():
    [one_sided] = parse_plan(WINDOW_ONE_SIDED_PLAN)
    assert one_sided.left.strategy == "none" and one_sided.left.predicate is None
    assert (one_sided.right.column, one_sided.right.field, one_sided.right.threshold_ms) == (
        "win", "end", 19000)
    [keyed] = parse_plan(WINDOW_KEY_PLAN)
    assert (keyed.join_type, keyed.left.column, keyed.left.field) == ("LeftSemi", "win", "end")
    [none] = parse_plan(NO_CLEANUP_PLAN)
    assert none.left.strategy == none.right.strategy == "none"


def test_parse_several_joins_in_plan_order():
    joins = parse_plan("\n".join([KEY_PLAN, "+- Union", VALUE_PLAN]))
    assert [j.operator_id for j in joins] == [0, 3]
    assert parse_plan("== Physical Plan ==\n*(1) Project [a#1]") == []


def test_check_cleanup_agrees_and_reports_each_difference():
    promise = expected_cleanup(facts("left"), facts("right"), "inner", StateKeyCondition(), None)
    [join] = parse_plan(KEY_PLAN)
    assert check_cleanup(promise, join) == []
    assert_cleanup(promise, join)

    value_promise = expected_cleanup(facts("left"), facts("right"), "left_outer", None,
                                     StateValueCondition(lower=0, upper="5 seconds"))
    problems = check_cleanup(value_promise, join)
    assert problems == [
        "join type: expected LeftOuter, Spark runs Inner",
        "left side (left): expected state-value, Spark chose state-key "
        "(input[1, timestamp, true] <= 8000000)",
        "right side (right): expected state-value, Spark chose state-key "
        "(input[1, timestamp, true] <= 8000000)"]
    with pytest.raises(CleanupMismatch, match="expected LeftOuter"):
        assert_cleanup(value_promise, join)


def test_check_cleanup_compares_thresholds():
    promise = expected_cleanup(facts("left"), facts("right", delay="20 seconds"), "full_outer",
                               None, StateValueCondition(lower="2 seconds", upper="3 seconds"))
    [join] = parse_plan(VALUE_PLAN)
    # The plan's right threshold is W - 1 ms (lower bound 0), not W + 2 s - 1 ms.
    assert check_cleanup(promise, join) == [
        "right side (right): expected eviction threshold 2999 ms at watermark 1000 ms, "
        "Spark uses 999 ms"]


# --- metrics ----------------------------------------------------------------------------------

def _progress(batch, total, removed=0, dropped=0, ops=("symmetricHashJoin",)):
    return {"batchId": batch, "numInputRows": 4,
            "eventTime": {"watermark": "1970-01-01T00:00:08.000Z"},
            "sink": {"numOutputRows": -1},
            "stateOperators": [{"operatorName": name, "numRowsTotal": total, "numRowsUpdated": 2,
                                "numRowsRemoved": removed, "numRowsDroppedByWatermark": dropped}
                               for name in ops]}


def test_join_state_rows_reads_only_join_operators():
    [row] = join_state_rows(_progress(3, 10, removed=4, dropped=1,
                                      ops=("stateStoreSave", "symmetricHashJoin")))
    assert (row.batch_id, row.join_index, row.total, row.updated, row.removed,
            row.dropped_by_watermark) == (3, 0, 10, 2, 4, 1)
    assert row.output_rows is None and row.watermark == "1970-01-01T00:00:08.000Z"
    progress = _progress(1, 5, ops=("symmetricHashJoin", "symmetricHashJoin"))
    assert len(join_state_rows(progress)) == 2
    assert join_state_rows({"batchId": 0, "stateOperators": []}) == []
    with pytest.raises(TypeError):
        join_state_rows(42)


def test_collector_counts_each_batch_once():
    collector = JoinStateCollector()
    assert len(collector.add_all([_progress(0, 3), _progress(1, 5)])) == 2
    assert collector.add_all([_progress(1, 5), _progress(2, 4)]) == collector.rows()[2:]
    assert collector.totals() == [3, 5, 4]
    assert [r["batch_id"] for r in collector.to_records()] == [0, 1, 2]
