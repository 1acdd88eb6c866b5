"""The click-through join of ad impressions to the visits they caused, as a library.

A visit is caused by an impression when it is the same user, the visit's url is the impression's
target_url, and the visit's referer is the impression's source_url. ``build_click_join`` splits a
stream of valid events into its two sides (watermarked before the split, so heartbeats advance
both; each deduplicated by ``event_id`` within its watermark), joins them with
``joins.stream_join`` under a cleanup strategy, and selects ``CLICK_COLUMNS``, the output schema
defined here once. ``batch_counts`` reads one micro-batch's counts from the query's progress,
and ``promised_rule``/``detected_rule`` say a side's eviction rule in words. The entry point
``jobs/join_job.py`` and the benchmarks use this module; it knows nothing of command lines.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pyspark.sql import functions as F

from joins import (
    JoinSide,
    JoinStateRows,
    SideCleanup,
    StateKeyCondition,
    StateValueCondition,
    filter_above_watermark,
    stream_join,
)
from joins.durations import format_duration_ms, ms_to_iso, parse_duration_ms
from joins.inspect import DetectedSide

from ..config import spark_interval
from ..schema import EVENT_SCHEMA, field_kinds
from .validation import VALIDATION_METRICS

# The cleanup strategies: which time conditions the join carries.
STRATEGIES = ("state-key", "state-value", "mixed")

# Observed metrics: the rows written per micro-batch (the file sink reports no output count) and
# the records read (the progress's input count has every record twice: both sides scan the files).
OUTPUT_METRICS = "click_join_output"
INPUT_METRICS = "click_join_input"
# Spark's name of the dropDuplicatesWithinWatermark operator in query progress.
DEDUP_OPERATOR_NAME = "dedupeWithinWatermark"

# (impression column, visit column) pairs that must be equal.
CLICK_KEYS = (("user_id", "user_id"), ("target_url", "url"), ("source_url", "referer"))
SIDES = ("impression", "visit")


@dataclass(frozen=True)
class OutputColumn:
    """One output column: the event field it holds, from which side, and what it means.

    ``side`` is ``impression``, ``visit``, or ``either`` (the impression's value, or for a visit
    without an impression in an outer join, the visit's). The type is the event field's.
    """

    name: str
    side: str
    field: str
    doc: str

    def kind(self) -> str:
        """The column's type, as ``attribution.schema.type_kind`` names it (e.g. ``timestamp``)."""
        return field_kinds(EVENT_SCHEMA)[self.field][0]


# The output schema, defined here once: the select after the join, the columns of each side fed
# to it, and the job's --help text are all derived from it.
CLICK_COLUMNS = (
    OutputColumn("user_id", "either", "user_id", "the user who saw the ad and visited"),
    OutputColumn("impression_id", "impression", "impression_id", "the ad impression's id"),
    OutputColumn("impression_event_id", "impression", "event_id", "event_id of the impression"),
    OutputColumn("impression_ts", "impression", "ts", "when the ad was shown"),
    OutputColumn("impression_source_url", "impression", "source_url",
                 "page that showed the ad (= visit_referer)"),
    OutputColumn("impression_target_url", "impression", "target_url",
                 "the ad's landing page (= visit_url)"),
    OutputColumn("visit_event_id", "visit", "event_id", "event_id of the visit"),
    OutputColumn("visit_ts", "visit", "ts", "when the landing page was visited"),
    OutputColumn("visit_url", "visit", "url", "the page visited"),
    OutputColumn("visit_referer", "visit", "referer", "the page the visit came from"),
    OutputColumn("visit_is_goal", "visit", "is_goal", "whether the visit is a conversion"),
)


def output_columns(how: str) -> tuple[OutputColumn, ...]:
    """The output columns of a join type: a semi join has the impression's only.

    :param how: the join type, one of ``joins.JOIN_TYPES``.
    """
    if how == "left_semi":
        return tuple(c for c in CLICK_COLUMNS if c.side != "visit")
    return CLICK_COLUMNS


def side_fields(side: str) -> list[str]:
    """The event fields one side feeds to the join: its output columns' and the join keys.

    :param side: ``impression`` or ``visit``.
    """
    keys = [pair[SIDES.index(side)] for pair in CLICK_KEYS]
    wanted = keys + [c.field for c in CLICK_COLUMNS if c.side in (side, "either")]
    return list(dict.fromkeys(["event_id", "ts", *wanted]))


def conditions(strategy: str, window: str, max_delay: str) -> dict:
    """The time conditions of a strategy, as ``stream_join``'s keyword arguments.

    :param strategy: one of ``STRATEGIES``.
    :param window: the tumbling window both rows must share (``state-key`` and ``mixed``).
    :param max_delay: the longest time from impression to visit (``state-value`` and ``mixed``).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    out = {}
    if strategy in ("state-key", "mixed"):
        out["state_key"] = StateKeyCondition(window=window)
    if strategy in ("state-value", "mixed"):
        out["state_value"] = StateValueCondition(lower=0, upper=max_delay)
    return out


def _side(events, event_type: str, delay_ms: int):
    """One side of the join: watermarked, split off by event type, deduplicated by event_id."""
    # The watermark comes first: filter_above_watermark keeps the split above it, so heartbeats
    # and the other side's rows advance it; dropDuplicatesWithinWatermark needs it, remembers each
    # event_id until W passes the first copy's ts + delay, and drops copies arriving later as late.
    rows = filter_above_watermark(events.withWatermark("ts", spark_interval(delay_ms)),
                                  F.col("event_type") == event_type)
    return rows.select(*side_fields(event_type)).dropDuplicatesWithinWatermark(["event_id"])


def build_click_join(events, *, strategy: str, how: str, window: str, max_delay: str,
                     impression_delay_ms: int, visit_delay_ms: int):
    """Split valid events into deduplicated, watermarked impressions and visits, join them, and
    select ``CLICK_COLUMNS``; return the ``joins.JoinResult``.

    :param events: a stream of valid events (``validation.valid_events``), not yet watermarked.
    :param strategy: the cleanup strategy, one of ``STRATEGIES``.
    :param how: the join type, one of ``joins.JOIN_TYPES``; left = impressions.
    :param window: the tumbling window of ``state-key`` and ``mixed`` (a duration).
    :param max_delay: the longest time from impression to visit of ``state-value`` and
        ``mixed`` (a duration).
    :param impression_delay_ms: the impression side's watermark delay.
    :param visit_delay_ms: the visit side's watermark delay.
    """
    # One read of the directory, two watermarks: both sides see every file in the same batch.
    result = stream_join(
        JoinSide(_side(events, "impression", impression_delay_ms), "ts", impression_delay_ms,
                 prefix="impression_", name="impression"),
        JoinSide(_side(events, "visit", visit_delay_ms), "ts", visit_delay_ms,
                 prefix="visit_", name="visit"),
        list(CLICK_KEYS), how=how, **conditions(strategy, window, max_delay))

    def column(c: OutputColumn):
        if c.side == "either":
            sources = [F.col(f"{side}_{c.field}") for side in SIDES
                       if f"{side}_{c.field}" in result.df.columns]
            return F.coalesce(*sources).alias(c.name)
        return F.col(f"{c.side}_{c.field}").alias(c.name)

    return replace(result, df=result.df.select(*(column(c) for c in output_columns(how))))


def batch_counts(progress: dict, row: JoinStateRows) -> dict:
    """One micro-batch of the click join, counted from its progress update.

    :param progress: the query's progress update, as a dict (``joins.metrics.progress_dict``).
    :param row: the join operator's state rows of that micro-batch
        (``joins.JoinStateCollector.add``).
    """
    observed = progress.get("observedMetrics") or {}

    def metric(name: str, field: str) -> int:
        return observed[name][field] if name in observed else 0

    dedup = [op for op in progress.get("stateOperators") or []
             if op.get("operatorName") == DEDUP_OPERATOR_NAME]
    return {
        "batch_id": row.batch_id,
        "records_read": metric(INPUT_METRICS, "records"),
        "invalid": metric(VALIDATION_METRICS, "invalid"),
        "duplicates_dropped": sum(int((op.get("customMetrics") or {})
                                      .get("numDroppedDuplicateRows", 0)) for op in dedup),
        # A late row is dropped by the first stateful operator it meets: a side's dedup.
        "dropped_by_watermark": row.dropped_by_watermark + sum(
            int(op.get("numRowsDroppedByWatermark", 0)) for op in dedup),
        "output_rows": metric(OUTPUT_METRICS, "rows"),
        "join_state_rows": row.total,
        "join_state_rows_updated": row.updated,
        "join_state_rows_removed": row.removed,
        "dedup_state_rows": sum(int(op.get("numRowsTotal", 0)) for op in dedup),
        "watermark": row.watermark,
    }


# -- the rules, in words ------------------------------------------------------------------------

def exact_duration(ms: int) -> str:
    """A duration as ``format_duration_ms`` writes it, exact to the millisecond
    (``1800001`` -> ``"30 min and 1 ms"``).

    :param ms: the duration in milliseconds, not negative.
    """
    text = format_duration_ms(ms)
    if parse_duration_ms(text) == ms:
        return text
    whole = ms - ms % 1000
    if ms % 1000 and whole and parse_duration_ms(format_duration_ms(whole)) == whole:
        return f"{format_duration_ms(whole)} and {ms % 1000} ms"
    return f"{ms} ms"


def iso_or_none(ms: Optional[int]) -> Optional[str]:
    """``ms`` as an ISO-8601 UTC time, or ``None``.

    :param ms: epoch milliseconds, or ``None``.
    """
    return None if ms is None else ms_to_iso(ms)


def _a(name: str) -> str:
    return ("an " if name[:1] in "aeiou" else "a ") + name


def promised_rule(side: SideCleanup, window: str) -> str:
    """The operator's eviction predicate for one side, in words relative to the watermark.

    :param side: the side's promised cleanup (``ExpectedCleanup.left`` or ``.right``).
    :param window: the tumbling window as given on the command line, for a window predicate.
    """
    if not side.cleanable:
        return f"{side.name} rows are never dropped from the join state"
    offset = side.offset_ms
    bound = "the watermark" if offset == 0 else (
        f"the watermark {'minus' if offset < 0 else 'plus'} {exact_duration(abs(offset))}")
    what = (f"the end of its {window} window ({side.column}.{side.field})" if side.field
            else f"its {side.column}")
    return (f"{_a(side.name)} row (the join's {side.side} side) is dropped from the join state "
            f"once {what} is at or below {bound}")


def detected_rule(name: str, side: DetectedSide) -> str:
    """Spark's eviction predicate for one side, in words with its threshold as an ISO time.

    :param name: the side's name (``impression`` or ``visit``).
    :param side: what ``inspect_join`` read from the executed plan for that side.
    """
    if side.strategy == "none" or side.threshold_ms is None:
        return f"Spark never drops {name} rows from the join state"
    column = f"{side.column}.{side.field}" if side.field else side.column
    return (f"Spark drops {_a(name)} row from the join state once its {column} is at or below "
            f"{ms_to_iso(side.threshold_ms)}")
