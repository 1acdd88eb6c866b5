"""``stream_join``: build a stream-to-stream join from its declaration and its promised cleanup.

Steps, in order: validate the declaration, predict Spark's cleanup (``joins.cleanup``), refuse
joins that could never be cleaned (``joins.guardrails``), then prepare each side (apply the
declared watermark, prefix every column, add the tumbling window when one is compared), build the
join condition and join. The result carries the joined DataFrame and the prediction, which
``joins.inspect.check_cleanup`` can later compare with what the running query really does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from .cleanup import ExpectedCleanup, SideFacts, expected_cleanup
from .durations import spark_interval
from .guardrails import check_join
from .spec import (
    JoinSide,
    JoinSpecError,
    KeySpec,
    StateKeyCondition,
    StateValueCondition,
    normalize_join_type,
    normalize_keys,
    validate_conditions,
)

# The column metadata key under which Spark marks a column as watermarked (EventTimeWatermark).
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
# Metadata left on a time column whose watermark role moved to its window column.
MOVED_WATERMARK_KEY = "streamjoin.watermarkMovedTo"
WINDOW_SUFFIX = "join_window"
SEMI_JOIN_BARRIER = "__streamjoin_barrier"
WATERMARK_BARRIER = "__streamjoin_watermark_barrier"
WATERMARK_POLICY_CONF = "spark.sql.streaming.multipleWatermarkPolicy"


@dataclass(frozen=True)
class JoinResult:
    """The joined streaming DataFrame and the cleanup the operator promises for it."""

    df: object
    expected: ExpectedCleanup

    def describe(self) -> str:
        """The promised cleanup in words (``ExpectedCleanup.describe``)."""
        return self.expected.describe()


def _col(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _interval(ms: int):
    from pyspark.sql import functions as F

    return F.expr(f"INTERVAL {int(ms)} MILLISECONDS")


def _existing_watermarks(df) -> dict[str, int]:
    return {f.name: int(f.metadata[WATERMARK_DELAY_KEY]) for f in df.schema.fields
            if WATERMARK_DELAY_KEY in (f.metadata or {})}


def _check_columns(side: JoinSide, needed: Sequence[str]) -> None:
    columns = list(side.df.columns)
    missing = [c for c in needed if c not in columns]
    if missing:
        raise JoinSpecError(f"{side.name} side has no column(s) {', '.join(map(repr, missing))}; "
                            f"its columns are {', '.join(columns)}")


def _watermark_delay(side: JoinSide) -> tuple[Optional[int], bool]:
    """The side's watermark delay in ms, and whether ``withWatermark`` still has to be applied."""
    from pyspark.sql.types import TimestampType

    declared = side.delay_ms()
    existing = _existing_watermarks(side.df)
    others = sorted(set(existing) - {side.time_col})
    if others:
        raise JoinSpecError(
            f"{side.name} side already has a watermark on column {others[0]!r}, not on its time "
            f"column {side.time_col!r}; declare time_col={others[0]!r} or drop that watermark")
    if side.time_col in existing:
        if declared is not None and declared != existing[side.time_col]:
            raise JoinSpecError(
                f"{side.name} side: {side.time_col!r} already has a watermark delay of "
                f"{existing[side.time_col]} ms, but "
                f"watermark_delay={side.watermark_delay!r} was declared")
        return existing[side.time_col], False
    if declared is not None:
        time_type = side.df.schema[side.time_col].dataType
        if not isinstance(time_type, TimestampType):
            raise JoinSpecError(f"{side.name} side: time column {side.time_col!r} must be a "
                                f"timestamp, got {time_type.simpleString()}")
    return declared, declared is not None


def _prepare(side: JoinSide, delay_ms: Optional[int], apply_watermark: bool,
             window_ms: Optional[int], window_column: Optional[str]):
    """Watermark, prefix and (optionally) window one side."""
    from pyspark.sql import functions as F

    df = side.df
    if apply_watermark:
        df = df.withWatermark(side.time_col, spark_interval(delay_ms))
    if delay_ms is not None:
        # Otherwise the isnotnull(key) filters inferred from the join would be pushed below the
        # watermark, and rows with a null key would not advance it.
        df = pin_watermark(df)
    df = df.select([_col(c).alias(side.prefix + c) for c in df.columns])
    if window_ms is None:
        return df
    time_column = side.prefix + side.time_col
    df = df.withColumn(window_column, F.window(_col(time_column), spark_interval(window_ms)))
    if delay_ms is None:
        return df
    # Spark allows one event-time column per side: the window inherited the watermark, so the
    # timestamp keeps its values but loses the marker (an explicit metadata replaces Spark's).
    return df.select([_col(c).alias(c, metadata={MOVED_WATERMARK_KEY: window_column})
                      if c == time_column else _col(c) for c in df.columns])


def pin_watermark(df):
    """Keep every filter above this point of the plan, so every row reaches the watermark.

    Spark's optimizer pushes filters below ``withWatermark`` when they do not reference the
    event-time column: an explicit split by event type, and the ``isnotnull(key)`` filters it
    infers from a join's equality keys. The rows those filters remove (heartbeats, rows with a
    null key) then never advance the watermark. No filter is pushed through a projection with a
    non-deterministic column, so this adds one (``rand``) and a filter that uses it (always true;
    it keeps the column from being pruned), then drops it.

    :param df: a streaming DataFrame, usually just after ``withWatermark``.
    :returns: ``df`` with the same rows and columns, behind a barrier no filter is pushed through.
    """
    from pyspark.sql import functions as F

    pinned = df.withColumn(WATERMARK_BARRIER, F.rand(0))
    return pinned.filter(F.col(WATERMARK_BARRIER) >= 0).drop(WATERMARK_BARRIER)


def filter_above_watermark(df, condition):
    """``df.filter(condition)`` on a watermarked stream, without hiding rows from the watermark.

    Use it to split one watermarked stream into join inputs (e.g. by event type) while letting
    the rows of every type, heartbeats included, advance the watermark.

    :param df: the watermarked streaming DataFrame to filter.
    :param condition: a boolean ``Column`` or SQL string, as ``DataFrame.filter`` takes.
    :returns: the filtered DataFrame.
    """
    return pin_watermark(df).filter(condition)


def _time_condition(left_term, right_term, state_value: StateValueCondition):
    conditions = []
    lower, upper = state_value.lower_ms(), state_value.upper_ms()
    if lower is not None:
        bound = left_term if lower == 0 else left_term + _interval(lower)
        conditions.append(right_term >= bound if state_value.lower_inclusive
                          else right_term > bound)
    if upper is not None:
        bound = left_term if upper == 0 else left_term + _interval(upper)
        conditions.append(right_term <= bound if state_value.upper_inclusive
                          else right_term < bound)
    return conditions


def stream_join(left: JoinSide, right: JoinSide, keys: Sequence[KeySpec] = (), *,
                state_key: Optional[StateKeyCondition] = None,
                state_value: Optional[StateValueCondition] = None,
                how: str = "inner", allow_unbounded_state: bool = False) -> JoinResult:
    """Join two streaming DataFrames with a declared cleanup strategy.

    ``state_key`` and/or ``state_value`` choose the strategy: state-key, state-value, or both
    (mixed).

    :param left: the left input (its DataFrame, time column, watermark delay, prefix, name).
    :param right: the right input, declared the same way.
    :param keys: equality keys: a column name present on both sides, or ``(left, right)`` pairs of
        names; empty when the join has only time conditions.
    :param state_key: equality on the sides' event time (optionally on tumbling windows of it).
    :param state_value: a time range between the sides' event times.
    :param how: inner, left_outer, right_outer, full_outer or left_semi (or a spelling Spark
        accepts for one of them).
    :param allow_unbounded_state: build the join even when neither side's state can ever be
        evicted (state then grows without bound); refused by default.
    :returns: the joined DataFrame and the cleanup Spark is expected to perform.
    :raises JoinSpecError: the declaration is wrong (or its subclasses ``UnboundedStateError`` /
        ``UnsupportedOuterJoinError`` when its state could never be cleaned).
    """
    how = normalize_join_type(how)
    pairs = normalize_keys(keys)
    window_ms = validate_conditions(state_key, state_value)
    left = replace(left, name=left.name or "left")
    right = replace(right, name=right.name or "right")
    left = replace(left, prefix=left.name + "_" if left.prefix is None else left.prefix)
    right = replace(right, prefix=right.name + "_" if right.prefix is None else right.prefix)
    _check_columns(left, [left.time_col] + [lk for lk, _ in pairs])
    _check_columns(right, [right.time_col] + [rk for _, rk in pairs])

    left_names = {left.prefix + c for c in left.df.columns}
    right_names = {right.prefix + c for c in right.df.columns}
    clashes = sorted(left_names & right_names)
    if clashes:
        raise JoinSpecError(f"output columns clash after prefixing ({', '.join(clashes[:5])}); "
                            f"give the sides different prefixes "
                            f"(now {left.prefix!r} and {right.prefix!r})")
    window_columns = (None, None)
    if window_ms is not None:
        window_columns = (left.prefix + WINDOW_SUFFIX, right.prefix + WINDOW_SUFFIX)
        taken = [w for w in window_columns if w in left_names | right_names]
        if taken:
            raise JoinSpecError(f"column {taken[0]!r} is reserved for the join window; rename it")

    left_delay, left_apply = _watermark_delay(left)
    right_delay, right_apply = _watermark_delay(right)
    session = left.df.sparkSession
    policy = (session.conf.get(WATERMARK_POLICY_CONF, "min") or "min").lower()
    expected = expected_cleanup(
        SideFacts("left", left.name, left.prefix + left.time_col, window_columns[0], left_delay,
                  left.time_col),
        SideFacts("right", right.name, right.prefix + right.time_col, window_columns[1],
                  right_delay, right.time_col),
        how, state_key, state_value, watermark_policy=policy)
    check_join(expected, has_equality=bool(pairs) or state_key is not None,
               allow_unbounded_state=allow_unbounded_state)

    left_df = _prepare(left, left_delay, left_apply, window_ms, window_columns[0])
    right_df = _prepare(right, right_delay, right_apply, window_ms, window_columns[1])
    windowed = window_ms is not None
    if how == "left_semi" and windowed:
        # The optimizer pushes a left semi join below deterministic projections, down to the one
        # where the timestamp still carries the watermark next to its window (Spark then fails:
        # two event-time columns). A non-deterministic column stops that push-down.
        from pyspark.sql import functions as F

        left_df = left_df.withColumn(SEMI_JOIN_BARRIER, F.rand(0))

    def key_term(side: JoinSide, window_column: Optional[str]):
        return _col(window_column) if windowed else _col(side.prefix + side.time_col)

    conditions = [_col(left.prefix + lk) == _col(right.prefix + rk) for lk, rk in pairs]
    if state_key is not None:
        conditions.append(key_term(left, window_columns[0]) == key_term(right, window_columns[1]))
    if state_value is not None:
        # A timestamp range next to a window key compares timestamps, not windows.
        value_windowed = state_value.window is not None
        left_term = _col(window_columns[0]) if value_windowed else _col(left.prefix + left.time_col)
        right_term = (_col(window_columns[1]) if value_windowed
                      else _col(right.prefix + right.time_col))
        conditions += _time_condition(left_term, right_term, state_value)
    condition = conditions[0]
    for extra in conditions[1:]:
        condition = condition & extra

    joined = left_df.join(right_df, condition, how)
    helpers = list(window_columns) + [SEMI_JOIN_BARRIER] if windowed else []
    if helpers:
        joined = joined.drop(*[c for c in helpers if c in joined.columns])
    return JoinResult(joined, expected)
