"""Reading and writing spec files without Spark: event files in, attribution rows out.

Attribution output is read back through ``attribution.spark.output``, which reads only the
files a job committed.

Formats are chosen by file extension (``formats.EVENT_FORMATS``): ``.json``/``.jsonl`` (JSON
lines), ``.parquet`` and ``.avro``; each has a reader and a writer in the tables below. A
directory is read file by file in name order, which is the arrival order the generators and the
ch. 7 dataset use. Parquet timestamps are written as microseconds, UTC.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Union

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from ..core import Attribution
from ..events import Event, ms_to_datetime, ms_to_iso, parse_event
from ..schema import EVENT_SCHEMA, OUTPUT_SCHEMA
from .formats import FORMATS, event_format, format_of
from .types import arrow_schema

__all__ = ["FORMATS", "attributions_to_arrow", "data_files", "format_of", "read_event_records",
           "read_events", "write_attributions", "write_events"]
PathLike = Union[str, os.PathLike]


def data_files(path: PathLike) -> list[Path]:
    """The data files under ``path`` (a file or a directory), in name order.

    Hidden and underscore-prefixed entries (``_SUCCESS``, ``.part-0.tmp``, ``_spark_metadata``)
    are skipped, as Spark's file sources skip them.

    :param path: a data file, or a directory (its own files; subdirectories are not searched).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return sorted(p for p in path.iterdir()
                  if p.is_file() and not p.name.startswith((".", "_")) and format_of(p))


def _json_records(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _avro_records(path: Path) -> Iterator[dict]:
    with open(path, "rb") as fh:
        yield from fastavro.reader(fh)


# Format -> the raw records of one of its files.
_RECORD_READERS: dict[str, Callable[[Path], Iterable[dict]]] = {
    "json": _json_records,
    "parquet": lambda path: pq.read_table(path).to_pylist(),
    "avro": _avro_records,
}


def read_event_records(path: PathLike) -> Iterator[dict]:
    """Yield raw records from event files, unvalidated (``ts`` as found in the file).

    :param path: an event file or a directory of them (``data_files``).
    """
    for f in data_files(path):
        fmt = format_of(f)
        if fmt is None:
            endings = [e for name in FORMATS for e in event_format(name).extensions]
            raise ValueError(f"{f} is not an event file: its name ends in none of "
                             f"{', '.join(endings)}")
        yield from _RECORD_READERS[fmt](f)


def read_events(path: PathLike) -> list[Event]:
    """Read and validate every event under ``path``; raises ``InvalidEvent`` naming the file.

    :param path: a data file, or a directory of them.
    """
    from ..events import InvalidEvent

    events = []
    for f in data_files(path):
        for n, record in enumerate(read_event_records(f)):
            try:
                events.append(parse_event(record))
            except InvalidEvent as err:
                raise InvalidEvent(f"{f} record {n}: {err}") from None
    return events


def _write_json(records: list[dict], path: PathLike) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps({**r, "ts": ms_to_iso(r["ts"])}) + "\n")


def _write_parquet(records: list[dict], path: PathLike) -> None:
    for r in records:
        r["ts"] = ms_to_datetime(r["ts"])
    pq.write_table(pa.Table.from_pylist(records, schema=arrow_schema(EVENT_SCHEMA)), path)


def _write_avro(records: list[dict], path: PathLike) -> None:
    with open(path, "wb") as fh:
        fastavro.writer(fh, EVENT_SCHEMA, records)


# Format -> how a list of event records (``Event.to_record``) becomes one file.
_WRITERS: dict[str, Callable[[list[dict], PathLike], None]] = {
    "json": _write_json, "parquet": _write_parquet, "avro": _write_avro}


def write_events(events: Iterable[Event], path: PathLike, fmt: str) -> None:
    """Write events to one file in ``fmt``.

    :param events: the events, in file order.
    :param path: the file to write.
    :param fmt: one of ``FORMATS``; another is a ``ValueError`` naming them.
    """
    event_format(fmt)
    _WRITERS[fmt]([e.to_record() for e in events], path)


def attributions_to_arrow(rows: Iterable[Attribution]) -> pa.Table:
    """Rows as an Arrow table in the output schema (timestamps in microseconds, UTC).

    :param rows: the attribution rows.
    """
    records = []
    for row in rows:
        r = row.to_record()
        r["goal_ts"] = ms_to_datetime(r["goal_ts"])
        if r["impression_ts"] is not None:
            r["impression_ts"] = ms_to_datetime(r["impression_ts"])
        records.append(r)
    return pa.Table.from_pylist(records, schema=arrow_schema(OUTPUT_SCHEMA))


def write_attributions(rows: Iterable[Attribution], path: PathLike) -> None:
    """Write attribution rows as one Parquet file.

    :param rows: the attribution rows.
    :param path: the Parquet file to write.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(attributions_to_arrow(rows), path)
