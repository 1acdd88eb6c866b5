"""The late-record output: every record a micro-batch dropped as too late, written exactly once,
with the watermark it was judged against, so it can be inspected or replayed in a backfill.

Spark drops a stateful operator's late input rows itself and only counts them. This module
finds them again from what the query's checkpoint records about each committed micro-batch
``k``: the input it read (its input source says which, ``EventSource.committed_input``: the
files, or the offset ranges) and the watermark in force when they arrived, the previous
micro-batch's (``offsets/<k-1>``). A record of that input that validation accepts, that is not a
heartbeat, and whose ``ts`` is at or below that watermark is one Spark dropped. Every input of
that judgement is in the checkpoint or the record itself (validation judges
``--max-future-skew`` against the record's arrival time, fixed when it was written), so the set
is the same whenever it is computed.

Most micro-batches have no late record, and proving it needs no scan: Spark counts the rows it
drops (``numRowsDroppedByWatermark``), so with no allowed lateness a micro-batch whose progress
reports none has nothing to write; and a source may know the earliest ``ts`` of a micro-batch
without reading its records (``EventSource.earliest_ts_ms``: the ``ts`` column of a Parquet
file, read alone), which shows when none of them is within the allowed lateness of the
watermark or behind it. Only the other micro-batches are read again and validated.

The output holds one Parquet file per micro-batch with late records, written exactly once by
the mechanism the dead letter shares (``follow_up``): under ``detected_date=YYYY-MM-DD`` (the
micro-batch's own timestamp), named by batch id, ``_audited/<k>`` marking micro-batch ``k`` as
done. A micro-batch whose input the source no longer holds (records a Kafka topic's retention
deleted before the audit came to them) is marked with the reason instead, and reported by
``unaudited_batches``: never counted as having no late record. The records carry their origin as
their source names it (``source_file`` for files).
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

from joins.durations import ms_to_datetime, ms_to_iso

from .follow_up import WAIT, batch_time, follow_up, not_followed_up
from .layout import DETECTED_DATE
from .query_progress import micro_batch_ran
from .sources import EventSource, as_source
from .sources.offset_log import batch_offsets, committed_batches
from .storage import Location, location
from .types import arrow_schema

__all__ = ["AUDITED_DIR", "LATE_SCHEMA", "audit", "committed_batches", "dropped_by_batch",
           "late_schema", "late_threshold_ms", "read_late_records", "unaudited_batches"]

AUDITED_DIR = "_audited"


def late_schema(source: Union[EventSource, str]) -> pa.Schema:
    """The late-record files' schema for records of ``source``: its origin columns in the
    place of ``source_file``.

    :param source: the input source, or a format name for that format's files.
    """
    origin = arrow_schema({"fields": list(as_source(source).origin_fields)})
    return pa.schema([
        pa.field("raw_record", pa.string()),        # the record, as JSON
        pa.field("reason", pa.string()),
        pa.field("watermark", pa.timestamp("us", tz="UTC")),  # W[k-1], the on-time watermark
        pa.field("allowed_lateness_ms", pa.int64()),
        *origin,
        pa.field("batch_id", pa.int64()),
        pa.field("detected_at", pa.timestamp("us", tz="UTC")),  # the micro-batch's timestamp
    ])


LATE_SCHEMA = late_schema("json")  # the schema of late records read from files


def late_threshold_ms(checkpoint: Location, batch_id: int) -> int:
    """The watermark Spark judged micro-batch ``batch_id``'s input by: the previous one's.

    :param checkpoint: the query's checkpoint directory (``storage.location``).
    :param batch_id: a micro-batch with an offset log entry.
    """
    if batch_id == 0:
        return 0
    return batch_offsets(checkpoint, batch_id - 1)[0]["batchWatermarkMs"]


def dropped_by_batch(progress) -> dict[int, int]:
    """Spark's count of rows dropped as late per micro-batch, from a query's progress updates
    (``StreamingQuery.recentProgress``); idle triggers' updates, which vouch for nothing, are
    skipped (``micro_batch_ran``)."""
    return {p.batchId: sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
            for p in progress if micro_batch_ran(p)}


def _nothing_late(part, source: Union[EventSource, str], threshold_ms: int,
                  allowed_lateness_ms: int, dropped: Optional[int]) -> bool:
    """True when no record of a micro-batch can be late, dropped or accepted, without reading
    its records: Spark dropped none and nothing is accepted late without an allowed lateness,
    or its earliest ``ts`` (``EventSource.earliest_ts_ms``) is past ``threshold_ms +
    allowed_lateness_ms``.

    :param part: what the micro-batch read (``EventSource.committed_input``).
    :param source: its input source, or a format name for that format's files.
    :param threshold_ms: the watermark it was judged by.
    :param allowed_lateness_ms: the allowed lateness.
    :param dropped: Spark's count of rows it dropped, ``None`` when unknown.
    """
    if dropped == 0 and allowed_lateness_ms == 0:
        return True
    earliest = as_source(source).earliest_ts_ms(part)
    return earliest is not None and earliest > threshold_ms + allowed_lateness_ms


def audit(spark, checkpoint: str, late_dir: str, source: Union[EventSource, str],
          max_future_skew_ms: int, skew_text: str, allowed_lateness_ms: int,
          dropped: Optional[Mapping[int, int]] = None,
          decided: Optional[Callable[[int], bool]] = None) -> tuple[int, int]:
    """Write the late records of every committed micro-batch not audited yet
    (``follow_up.follow_up``, markers under ``AUDITED_DIR``).

    :returns: how many records were written (dropped as too late), and how many others of the
        same micro-batches were late but within the allowed lateness (so used).

    :param spark: the session.
    :param checkpoint: the attribution query's checkpoint directory (a path or any Hadoop URI,
        read through ``storage``).
    :param late_dir: the late-record output directory (likewise).
    :param source: the query's input source, or its format name for files (``sources``).
    :param max_future_skew_ms: validation's skew rule, as the query applies it.
    :param skew_text: the same, as the user wrote it.
    :param allowed_lateness_ms: ``L``: Spark's watermark runs ``L`` behind the on-time one.
    :param dropped: Spark's count of dropped rows per micro-batch where known
        (``dropped_by_batch``); a micro-batch it does not cover is judged from its records.
    :param decided: for a micro-batch ``dropped`` does not cover, whether to judge it now
        (true) or wait for its count, which may still come (false); ``None``: judge it now.
    """
    from pyspark.sql import functions as F

    from ..schema import EVENT_FIELDS
    from .validation import classify, valid_events

    source = as_source(source)
    origin = list(source.origin_columns)
    root = location(checkpoint)
    counts = {"written": 0, "accepted": 0}

    def late_rows(batch_id: int, part) -> Union[pa.Table, None, object]:
        if (part and (dropped is None or batch_id not in dropped) and decided is not None
                and not decided(batch_id)):
            return WAIT
        threshold = late_threshold_ms(root, batch_id)
        if not part or _nothing_late(part, source, threshold, allowed_lateness_ms,
                                     (dropped or {}).get(batch_id)):
            return None
        events = valid_events(classify(source.read_committed(spark, part), source,
                                       max_future_skew_ms, skew_text), keep=origin)
        ts = F.unix_millis("ts")
        late = events.filter((F.col("event_type") != "heartbeat")
                             & (ts <= F.lit(threshold + allowed_lateness_ms)))
        rows = late.select(F.to_json(F.struct(*EVENT_FIELDS)).alias("raw_record"),
                           *origin, (ts <= F.lit(threshold)).alias("dropped")).collect()
        counts["accepted"] += sum(not r.dropped for r in rows)
        rows = [r for r in rows if r.dropped]
        counts["written"] += len(rows)
        return _late_table(source, batch_id, rows, root, threshold, allowed_lateness_ms)

    follow_up(checkpoint, late_dir, AUDITED_DIR, source, late_rows)
    return counts["written"], counts["accepted"]


def unaudited_batches(late_dir: str) -> dict[int, str]:
    """The micro-batches the audit could not read again, each with the reason (its input was
    gone: Kafka's retention). Their late records, if any, are not in the output.

    :param late_dir: the late-record output directory.
    """
    return not_followed_up(late_dir, AUDITED_DIR)


def _late_table(source: EventSource, batch_id: int, rows: list, checkpoint: Location,
                threshold_ms: int, allowed_lateness_ms: int) -> Optional[pa.Table]:
    if not rows:
        return None
    detected = batch_time(checkpoint, batch_id)
    on_time = threshold_ms + allowed_lateness_ms
    watermark = ms_to_datetime(on_time)
    reason = (f"ts at or behind {ms_to_iso(threshold_ms)}: the watermark when it arrived, "
              f"{ms_to_iso(on_time)}, minus the allowed lateness ({allowed_lateness_ms} ms)")
    return pa.Table.from_pylist([
        {"raw_record": r.raw_record, "reason": reason, "watermark": watermark,
         "allowed_lateness_ms": allowed_lateness_ms,
         **{name: r[name] for name in source.origin_columns},
         "batch_id": batch_id, "detected_at": detected} for r in rows],
        schema=late_schema(source))


def read_late_records(late_dir: str) -> pa.Table:
    """Every late record written so far (the files of audited micro-batches), with the origin
    columns of the source they came from; an empty table in ``LATE_SCHEMA`` when there is none.

    :param late_dir: the late-record output directory.
    """
    files = location(late_dir).glob_files(f"{DETECTED_DATE[0]}=*/batch-*.parquet")
    if not files:
        return LATE_SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(pa.BufferReader(f.read_bytes())) for f in files)


