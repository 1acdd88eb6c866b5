"""Reading and writing spec files without Spark: event files in, attribution rows out.

Attribution output is read back through ``attribution.spark.output``, which reads only the
files a job committed.

Formats are chosen by file extension: ``.json``/``.jsonl`` (JSON lines), ``.parquet`` and
``.avro``. A directory is read file by file in name order, which is the arrival order the
generators and the ch. 7 dataset use. Parquet timestamps are written as microseconds, UTC.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from ..core import Attribution
from ..events import Event, ms_to_datetime, ms_to_iso, parse_event
from ..schema import EVENT_SCHEMA, OUTPUT_SCHEMA
from .types import arrow_schema

FORMATS = ("json", "parquet", "avro")
_EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".avro": "avro"}
PathLike = Union[str, os.PathLike]


def format_of(path: PathLike) -> Optional[str]:
    """The format implied by a file's extension, or ``None`` for other files."""
    return _EXTENSIONS.get(Path(path).suffix.lower())


def data_files(path: PathLike) -> list[Path]:
    """The data files under ``path`` (a file or a directory), in name order.

    Hidden and underscore-prefixed entries (``_SUCCESS``, ``.part-0.tmp``, ``_spark_metadata``)
    are skipped, as Spark's file sources skip them.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return sorted(p for p in path.iterdir()
                  if p.is_file() and not p.name.startswith((".", "_")) and format_of(p))


def read_event_records(path: PathLike) -> Iterator[dict]:
    """Yield raw records from event files, unvalidated (``ts`` as found in the file)."""
    for f in data_files(path):
        fmt = format_of(f)
        if fmt == "json":
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)
        elif fmt == "parquet":
            yield from pq.read_table(f).to_pylist()
        else:
            with open(f, "rb") as fh:
                yield from fastavro.reader(fh)


def read_events(path: PathLike) -> list[Event]:
    """Read and validate every event under ``path``; raises ``InvalidEvent`` naming the file."""
    from ..events import InvalidEvent

    events = []
    for f in data_files(path):
        for n, record in enumerate(read_event_records(f)):
            try:
                events.append(parse_event(record))
            except InvalidEvent as err:
                raise InvalidEvent(f"{f} record {n}: {err}") from None
    return events


def write_events(events: Iterable[Event], path: PathLike, fmt: str) -> None:
    """Write events to one file in ``fmt`` (json, parquet or avro)."""
    records = [e.to_record() for e in events]
    if fmt == "json":
        with open(path, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps({**r, "ts": ms_to_iso(r["ts"])}) + "\n")
    elif fmt == "parquet":
        for r in records:
            r["ts"] = ms_to_datetime(r["ts"])
        pq.write_table(pa.Table.from_pylist(records, schema=arrow_schema(EVENT_SCHEMA)), path)
    elif fmt == "avro":
        with open(path, "wb") as fh:
            fastavro.writer(fh, EVENT_SCHEMA, records)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def attributions_to_arrow(rows: Iterable[Attribution]) -> pa.Table:
    """Rows as an Arrow table in the output schema (timestamps in microseconds, UTC)."""
    records = []
    for row in rows:
        r = row.to_record()
        r["goal_ts"] = ms_to_datetime(r["goal_ts"])
        if r["impression_ts"] is not None:
            r["impression_ts"] = ms_to_datetime(r["impression_ts"])
        records.append(r)
    return pa.Table.from_pylist(records, schema=arrow_schema(OUTPUT_SCHEMA))


def write_attributions(rows: Iterable[Attribution], path: PathLike) -> None:
    """Write attribution rows as one Parquet file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(attributions_to_arrow(rows), path)
