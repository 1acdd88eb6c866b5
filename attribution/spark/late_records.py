"""The late-record output: every record a micro-batch dropped as too late, written exactly once,
with the watermark it was judged against, so it can be inspected or replayed in a backfill.

Spark drops a stateful operator's late input rows itself and only counts them. This module
finds them again from what the query's checkpoint records about each committed micro-batch
``k``: the input files it read (the file source's log, or the Avro source's offset) and the
watermark in force when they arrived, the previous micro-batch's (``offsets/<k-1>``). A record of
those files that validation accepts, that is not a heartbeat, and whose ``ts`` is at or below
that watermark is one Spark dropped. Every input of that judgement is in the checkpoint or the
file itself (validation judges ``--max-future-skew`` against the file's modification time), so
the set is the same whenever it is computed.

Most micro-batches have no late record, and proving it needs no scan: Spark counts the rows it
drops (``numRowsDroppedByWatermark``), so with no allowed lateness a micro-batch whose progress
reports none has nothing to write; and the ``ts`` column of a Parquet file, read alone, shows
when none of its records is within the allowed lateness of the watermark or behind it. Only the
other micro-batches are read again and validated.

The output holds one Parquet file per micro-batch with late records, under
``detected_date=YYYY-MM-DD`` (the micro-batch's own timestamp, from its offset log entry), named
by batch id and written by an atomic rename; ``_audited/<k>`` marks micro-batch ``k`` as done.
A crash between the two rewrites the same file: exactly once.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping, Optional
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from joins.durations import ms_to_datetime, ms_to_iso

from .layout import DETECTED_DATE
from .query_progress import micro_batch_ran

AUDITED_DIR = "_audited"
_BATCH = re.compile(r"^(\d+)(\.compact)?$")
LATE_SCHEMA = pa.schema([
    pa.field("raw_record", pa.string()),        # the record, as JSON
    pa.field("reason", pa.string()),
    pa.field("watermark", pa.timestamp("us", tz="UTC")),  # W[k-1], the on-time watermark
    pa.field("allowed_lateness_ms", pa.int64()),
    pa.field("source_file", pa.string()),
    pa.field("batch_id", pa.int64()),
    pa.field("detected_at", pa.timestamp("us", tz="UTC")),  # the micro-batch's timestamp
])


def _log_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines[0] != "v1":
        raise ValueError(f"{path}: unsupported checkpoint log version {lines[0]!r}")
    return lines[1:]


def _batch_files(log_dir: Path) -> dict[int, Path]:
    out = {}
    if log_dir.is_dir():
        for entry in log_dir.iterdir():
            match = _BATCH.match(entry.name)
            if match and entry.is_file():
                out[int(match[1])] = entry
    return out


def committed_batches(checkpoint: Path) -> list[int]:
    """The micro-batches the query committed, in order."""
    return sorted(_batch_files(checkpoint / "commits"))


def _offsets(checkpoint: Path, batch_id: int) -> tuple[dict, Optional[dict]]:
    """A micro-batch's metadata and its (only) source's offset."""
    lines = [line for line in _log_lines(checkpoint / "offsets" / str(batch_id)) if line]
    metadata = json.loads(lines[0])
    source = None if len(lines) < 2 or lines[1] == "-" else json.loads(lines[1])
    return metadata, source


def _file_source_entries(checkpoint: Path, log_offset: int) -> list[str]:
    """The files of the file source's log entry ``log_offset``, also inside a compact file."""
    log = _batch_files(checkpoint / "sources" / "0")
    candidates = [b for b in log if b >= log_offset and (b == log_offset
                                                         or log[b].name.endswith(".compact"))]
    if not candidates:
        raise ValueError(f"{checkpoint}: the file source's log has no entry {log_offset}")
    entries = (json.loads(line) for line in _log_lines(log[min(candidates)]) if line)
    return [e["path"] for e in entries if e.get("batchId") == log_offset]


def batch_input_files(checkpoint: Path, batch_id: int) -> list[str]:
    """The input files micro-batch ``batch_id`` read (none for a batch that only fired timers)."""
    _, source = _offsets(checkpoint, batch_id)
    previous = _offsets(checkpoint, batch_id - 1)[1] if batch_id > 0 else None
    if source is None or source == previous:
        return []
    if "logOffset" in source:  # Spark's file source
        return _file_source_entries(checkpoint, source["logOffset"])
    return list(source.get("files", []))  # the project's Avro source


def late_threshold_ms(checkpoint: Path, batch_id: int) -> int:
    """The watermark Spark judged micro-batch ``batch_id``'s input by: the previous one's."""
    if batch_id == 0:
        return 0
    return _offsets(checkpoint, batch_id - 1)[0]["batchWatermarkMs"]


def _local(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def dropped_by_batch(progress) -> dict[int, int]:
    """Spark's count of rows dropped as late per micro-batch, from a query's progress updates
    (``StreamingQuery.recentProgress``); idle triggers' updates, which vouch for nothing, are
    skipped (``micro_batch_ran``)."""
    return {p.batchId: sum(op.numRowsDroppedByWatermark for op in p.stateOperators)
            for p in progress if micro_batch_ran(p)}


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _min_parquet_ts_ms(files: list[str]) -> Optional[float]:
    """The earliest ``ts`` in these Parquet files, in epoch milliseconds, from that column alone
    (nulls, which validation rejects, ignored); +infinity when there is none. None when it
    cannot be known this way: a remote file, a ``ts`` that is not a timestamp, a file pyarrow
    cannot read (the full scan then decides)."""
    import pyarrow.compute as pc

    earliest = float("inf")
    for f in files:
        if "://" in f:
            return None
        try:
            ts = pq.read_table(f, columns=["ts"]).column("ts")
        except (OSError, KeyError, pa.ArrowException):
            return None
        if not pa.types.is_timestamp(ts.type):
            return None
        least = pc.min(ts.cast(pa.int64())).as_py()
        if least is not None:  # truncated to milliseconds, as Spark's unix_millis does
            earliest = min(earliest, least * 1000 // _PER_SECOND[ts.type.unit])
    return earliest


def _nothing_late(files: list[str], fmt: str, threshold_ms: int, allowed_lateness_ms: int,
                  dropped: Optional[int]) -> bool:
    """True when no record of a micro-batch can be late, dropped or accepted, without reading
    its records: Spark dropped none and nothing is accepted late without an allowed lateness,
    or every ``ts`` of its Parquet files is past ``threshold_ms + allowed_lateness_ms``."""
    if dropped == 0 and allowed_lateness_ms == 0:
        return True
    if fmt != "parquet":
        return False
    earliest = _min_parquet_ts_ms(files)
    return earliest is not None and earliest > threshold_ms + allowed_lateness_ms


def audit(spark, checkpoint: str, late_dir: str, fmt: str, max_future_skew_ms: int,
          skew_text: str, allowed_lateness_ms: int,
          dropped: Optional[Mapping[int, int]] = None) -> tuple[int, int]:
    """Write the late records of every committed micro-batch not audited yet.

    :returns: how many records were written (dropped as too late), and how many others of the
        same micro-batches were late but within the allowed lateness (so used).

    :param checkpoint: the attribution query's checkpoint directory (local).
    :param late_dir: the late-record output directory.
    :param fmt: the input format, as the query reads it.
    :param max_future_skew_ms: validation's skew rule, as the query applies it.
    :param skew_text: the same, as the user wrote it.
    :param allowed_lateness_ms: ``L``: Spark's watermark runs ``L`` behind the on-time one.
    :param dropped: Spark's count of dropped rows per micro-batch where known
        (``dropped_by_batch``); a micro-batch it does not cover is judged from its records.
    """
    from pyspark.sql import functions as F

    from ..schema import EVENT_FIELDS
    from .validation import classify, read_raw_files, valid_events

    root, out = Path(checkpoint), Path(late_dir)
    done = out / AUDITED_DIR
    written = accepted = 0
    for batch_id in committed_batches(root):
        if (done / str(batch_id)).exists():
            continue
        files = [_local(f) for f in batch_input_files(root, batch_id)]
        threshold = late_threshold_ms(root, batch_id)
        rows = []
        if files and not _nothing_late(files, fmt, threshold, allowed_lateness_ms,
                                       (dropped or {}).get(batch_id)):
            events = valid_events(classify(read_raw_files(spark, files, fmt),
                                           fmt, max_future_skew_ms, skew_text),
                                  keep=["source_file"])
            ts = F.unix_millis("ts")
            late = events.filter((F.col("event_type") != "heartbeat")
                                 & (ts <= F.lit(threshold + allowed_lateness_ms)))
            rows = late.select(F.to_json(F.struct(*EVENT_FIELDS)).alias("raw_record"),
                               "source_file", (ts <= F.lit(threshold)).alias("dropped")).collect()
            accepted += sum(not r.dropped for r in rows)
            rows = [r for r in rows if r.dropped]
        if rows:
            _write_batch(out, batch_id, rows, root, threshold, allowed_lateness_ms)
            written += len(rows)
        done.mkdir(parents=True, exist_ok=True)
        (done / str(batch_id)).touch()
    return written, accepted


def _write_batch(out: Path, batch_id: int, rows: list, checkpoint: Path, threshold_ms: int,
                 allowed_lateness_ms: int) -> None:
    metadata, _ = _offsets(checkpoint, batch_id)
    detected = ms_to_datetime(metadata["batchTimestampMs"])
    on_time = threshold_ms + allowed_lateness_ms
    watermark = ms_to_datetime(on_time)
    reason = (f"ts at or behind {ms_to_iso(threshold_ms)}: the watermark when it arrived, "
              f"{ms_to_iso(on_time)}, minus the allowed lateness ({allowed_lateness_ms} ms)")
    table = pa.Table.from_pylist([
        {"raw_record": r.raw_record, "reason": reason, "watermark": watermark,
         "allowed_lateness_ms": allowed_lateness_ms, "source_file": r.source_file,
         "batch_id": batch_id, "detected_at": detected} for r in rows], schema=LATE_SCHEMA)
    partition = f"{DETECTED_DATE[0]}={detected.date().isoformat()}"
    target = out / partition / f"batch-{batch_id:08d}.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, target)


def read_late_records(late_dir: str) -> pa.Table:
    """Every late record written so far (the files of audited micro-batches)."""
    files = sorted(Path(late_dir).glob(f"{DETECTED_DATE[0]}=*/batch-*.parquet"))
    if not files:
        return LATE_SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(f, schema=LATE_SCHEMA) for f in files)


