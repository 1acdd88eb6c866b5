"""The dead letter of a streaming job without a second read of its input: a committed micro-batch's
invalid records are written only when its main query counted some.

The main query classifies every record (``validation.classify``) and counts the invalid ones of
each micro-batch in its observed metrics (``VALIDATION_METRICS``), which reach the driver with
the micro-batch's progress. Invalid records are rare: a micro-batch that counted none needs no
second look, and is only marked done. One that counted some, or whose count is unknown (it was
committed by an earlier run, before a crash; its progress update was missed), is read again
from what the checkpoint says it read (``EventSource.read_committed``), classified by the same
rules, which depend on the record, its origin and its arrival time only, and its invalid records
are written. The writing, the markers (``_dead_lettered/<k>``) and the exactly-once guarantee
are the late-record audit's (``follow_up``).

The files are laid out like the late records: ``detected_date=YYYY-MM-DD/batch-<k>.parquet``,
``detected_at`` being the micro-batch's timestamp from its offset log entry (the same on every
redo). The directory holds ``_SUCCESS`` from its creation on: every file in it is complete (each
arrives by an atomic rename), so readers of committed output (``output.committed_files``) read
it as a finished output.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Mapping, Optional, Union

import pyarrow as pa

from .follow_up import WAIT, batch_time, follow_up, not_followed_up
from .query_progress import micro_batch_ran
from .sinks.parquet import micro_batch_name
from .sources import EventSource, as_source
from .storage import location
from .types import arrow_schema
from .validation import VALIDATION_METRICS, classify, dead_letters

__all__ = ["DEAD_LETTERED_DIR", "dead_letter_schema", "invalid_by_batch", "most_frequent_reasons",
           "not_reread_batches", "write_dead_letters"]

DEAD_LETTERED_DIR = "_dead_lettered"
_SUCCESS = "_SUCCESS"


def dead_letter_schema(source: Union[EventSource, str]) -> pa.Schema:
    """The dead-letter files' schema for records of ``source``: the columns of
    ``validation.dead_letters``, the source's origin columns among them.

    :param source: the input source, or a format name for that format's files.
    """
    origin = arrow_schema({"fields": list(as_source(source).origin_fields)})
    return pa.schema([pa.field("raw_record", pa.string()), pa.field("reason", pa.string()),
                      *origin, pa.field("detected_at", pa.timestamp("us", tz="UTC"))])


def invalid_by_batch(progress) -> dict[int, int]:
    """The main query's count of invalid records per micro-batch, from its progress updates
    (``StreamingQuery.recentProgress``); idle triggers' updates, which read nothing, and updates
    without the count are skipped.

    :param progress: the query's progress updates.
    """
    out = {}
    for p in progress:
        observed = (p.observedMetrics or {}).get(VALIDATION_METRICS)
        if micro_batch_ran(p) and observed is not None:
            out[p.batchId] = observed["invalid"]
    return out


def write_dead_letters(spark, checkpoint: str, dead_dir: str, source: EventSource,
                       max_future_skew_ms: int, skew_text: str, invalid: Mapping[int, int],
                       decided: Callable[[int], bool],
                       extra: Optional[Callable[[list[str]], Optional[pa.Table]]] = None) -> int:
    """Write the dead letters of every committed micro-batch not done yet.

    :returns: how many records were written.

    :param spark: the session.
    :param checkpoint: the main query's checkpoint directory.
    :param dead_dir: the dead-letter directory.
    :param source: the query's input source.
    :param max_future_skew_ms: validation's skew rule, as the query applies it.
    :param skew_text: the same, as the user wrote it.
    :param invalid: the main query's count of invalid records per micro-batch, where known
        (``invalid_by_batch``).
    :param decided: for a micro-batch without a known count, whether it may be read again now
        (true) or its count may still come with a later progress update (false: it waits).
    :param extra: dead letters of a micro-batch that its query never saw as records, from what
        it read (``EventSource.unreadable_dead_letters``: files Spark could not decode), checked
        on every micro-batch; ``None``: none.
    """
    from pyspark.sql import functions as F

    marker = location(dead_dir) / _SUCCESS
    if not marker.exists():
        marker.write_text("")
    schema = dead_letter_schema(source)
    root = location(checkpoint)
    written = [0]

    def invalid_records(batch_id: int, part) -> Union[pa.Table, None, object]:
        count = invalid.get(batch_id)
        if count is None and not decided(batch_id):
            return WAIT
        tables = []
        if part and count != 0:
            detected = batch_time(root, batch_id)
            rejected = dead_letters(classify(source.read_committed(spark, part), source,
                                             max_future_skew_ms, skew_text))
            rejected = rejected.withColumn("detected_at", F.lit(detected))
            tables.append(rejected.select(*schema.names).toArrow().cast(schema))
        if part and extra is not None:
            unreadable = extra(part)
            if unreadable is not None:
                unreadable = unreadable.append_column(
                    "detected_at", pa.array([batch_time(root, batch_id)] * unreadable.num_rows,
                                            pa.timestamp("us", tz="UTC")))
                tables.append(unreadable.select(schema.names).cast(schema))
        table = pa.concat_tables(tables) if tables else None
        written[0] += table.num_rows if table is not None else 0
        return table

    follow_up(checkpoint, dead_dir, DEAD_LETTERED_DIR, source, invalid_records)
    return written[0]


def not_reread_batches(dead_dir: str) -> dict[int, str]:
    """The micro-batches whose input was gone when their dead letters were to be written, each
    with the reason (Kafka's retention): their invalid records are not in the dead letter.

    :param dead_dir: the dead-letter directory.
    """
    return not_followed_up(dead_dir, DEAD_LETTERED_DIR)


def most_frequent_reasons(dead_dir: str, batch_ids: Optional[Iterable[int]] = None,
                          limit: int = 3) -> list[tuple[str, int]]:
    """The reasons most records of the dead letter were rejected for, with their counts, most
    frequent first (ties by reason).

    :param dead_dir: the dead-letter directory (dated subdirectories or flat).
    :param batch_ids: a streaming run's micro-batches, whose files (``micro_batch_name``) are
        read; ``None``: every Parquet file (a batch run's dead letter, which it replaced whole).
    :param limit: how many reasons at most.
    """
    import pyarrow.parquet as pq

    wanted = None if batch_ids is None else {micro_batch_name(b) for b in batch_ids}
    root = location(dead_dir)
    if not root.is_dir():
        return []
    files = [f for pattern in ("*.parquet", "*/*.parquet") for f in root.glob_files(pattern)
             if not f.name.startswith(("_", ".")) and (wanted is None or f.name in wanted)]
    counts: Counter = Counter()
    for f in files:
        with f.open() as stream:
            counts.update(pq.read_table(stream, columns=["reason"]).column("reason").to_pylist())
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
