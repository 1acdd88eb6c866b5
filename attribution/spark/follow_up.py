"""Records derived from each committed micro-batch of a streaming query, written exactly once per
micro-batch: the mechanism the late-record output (``late_records``) and the dead letter
(``dead_letter``) share.

For every micro-batch ``k`` the query's checkpoint says is committed and the output does not mark
as done, a *derivation* gets what ``k`` read (``EventSource.committed_input``) and returns the
records to write (re-reading that input only when it must), nothing, or ``WAIT`` (not decidable
yet: it is asked again on the next call). The records are one Parquet file under
``detected_date=YYYY-MM-DD`` (the micro-batch's own timestamp, from its offset log entry), named by
batch id and written by an atomic rename (``sinks.ParquetSink.write_micro_batch``); then
``<marker dir>/<k>`` marks ``k`` done. A crash between the two rewrites the same file: exactly
once. A micro-batch whose input the source no longer holds (records a Kafka topic's retention
deleted first) is marked with the reason instead (``not_followed_up``), never as empty.

The checkpoint and the output are read and written through ``storage``: local paths or any
Hadoop file system the job writes to.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Optional, Union

import pyarrow as pa

from joins.durations import ms_to_datetime

from .layout import DETECTED_DATE
from .sinks import ParquetSink
from .sources import EventSource
from .sources.offset_log import batch_offsets, committed_batches
from .storage import Location, location

WAIT = object()  # a derivation's answer: this micro-batch cannot be decided yet

# (batch id, what it read) -> records to write, None (nothing) or WAIT
Derivation = Callable[[int, Any], Union[pa.Table, None, object]]


def batch_time(checkpoint: Location, batch_id: int) -> dt.datetime:
    """When micro-batch ``batch_id`` ran (its ``batchTimestampMs``), the same on every redo.

    :param checkpoint: the query's checkpoint directory (``storage.location``).
    :param batch_id: a micro-batch with an offset log entry.
    """
    metadata, _ = batch_offsets(checkpoint, batch_id)
    return ms_to_datetime(metadata["batchTimestampMs"])


def marked_batches(out_dir: str, marker_dir: str) -> dict[int, str]:
    """The micro-batches marked done in ``out_dir/marker_dir``, each with the reason it could not
    be read again ("" for one whose records were written).

    :param out_dir: the output directory.
    :param marker_dir: the name of its marker directory.
    """
    done = location(out_dir) / marker_dir
    if not done.is_dir():
        return {}
    return {int(m.name): m.read_text() if m.size() else ""
            for m in done.iterdir() if m.name.isdigit()}


def not_followed_up(out_dir: str, marker_dir: str) -> dict[int, str]:
    """The micro-batches whose input could not be read again, each with the reason (it was
    gone: Kafka's retention). Their records, if any, are not in the output.

    :param out_dir: the output directory.
    :param marker_dir: the name of its marker directory.
    """
    return dict(sorted((k, why) for k, why in marked_batches(out_dir, marker_dir).items() if why))


def _mark(done: Location, batch_id: int, not_read: str = "") -> None:
    done.mkdir()
    (done / str(batch_id)).write_text(not_read)


def follow_up(checkpoint: str, out_dir: str, marker_dir: str, source: EventSource,
              derive: Derivation, sink: Optional[ParquetSink] = None) -> None:
    """Write the records of every committed micro-batch of ``checkpoint`` not marked done in
    ``out_dir`` yet, in batch order, and mark each (see the module docstring).

    :param checkpoint: the query's checkpoint directory.
    :param out_dir: the output directory.
    :param marker_dir: the name of the directory of ``out_dir`` that marks micro-batches done
        (it starts with ``_``: Spark's readers skip it).
    :param source: the query's input source: what each micro-batch read, and whether a failed
        re-read means its input is gone (``EventSource.lost_input``).
    :param derive: ``(batch id, what it read or None) -> pa.Table | None | WAIT``; the table is
        written with the micro-batch's timestamp as its date.
    :param sink: where the tables go (default: Parquet files under ``out_dir`` by
        ``layout.DETECTED_DATE``).
    """
    root = location(checkpoint)
    done = location(out_dir) / marker_dir
    sink = sink or ParquetSink(out_dir, DETECTED_DATE)
    marked = marked_batches(out_dir, marker_dir)
    for batch_id in committed_batches(root):
        if batch_id in marked:
            continue
        try:
            table = derive(batch_id, source.committed_input(root, batch_id))
        except Exception as err:  # the source tells a lost input from any other failure
            lost = source.lost_input(err)
            if lost is None:
                raise
            _mark(done, batch_id, lost)
            continue
        if table is WAIT:
            continue
        if table is not None and table.num_rows:
            sink.write_micro_batch(batch_id, table, batch_time(root, batch_id))
        _mark(done, batch_id)
