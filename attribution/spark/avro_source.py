"""Avro event files as a Spark source (Python Data Source API), since Spark's own Avro
connector is a separate jar: ``spark.readStream.format("eventavro").load(dir)``.

Register once per session with ``register(spark)``. Rows are in the event schema plus
``source_file`` (the file's URI), ``source_modified`` (its modification time) and
``read_error``: null on a decoded record; on a row that stands for a part of a file that could
not be decoded, the reason (``corrupt Avro file ...``, ``corrupt Avro block ...``) with every
event field null. Validation turns such rows into dead
letters, and the rest of the input goes on: a corrupt block costs its own records only, because
the reader resynchronises on the file's sync marker.

**Offsets are the files seen.** Files are taken in (modification time, path) order; an offset is
``{"upto": [mtime_ns, path], "files": [...]}``: every file up to that position has been read,
and ``files`` are the ones the micro-batch ending there reads. A replayed micro-batch reads
exactly the files of its logged offset, so a restart from the checkpoint is exactly-once, as with
Spark's file source. Like that source, a file that appears with a modification time older than
one already read is not picked up: write files elsewhere and rename them into the directory.
Option ``maxFilesPerTrigger`` caps the files per micro-batch.

Records are decoded with the reader's own event schema (``attribution.schema.EVENT_SCHEMA``), so
files written under an earlier version of it (fewer optional fields) read with nulls.
"""
from __future__ import annotations

import datetime as _dt
import io
import json
import os
import zlib
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import unquote, urlparse

import fastavro
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from ..schema import EVENT_FIELDS, EVENT_SCHEMA
from .formats import EVENT_FORMATS
from .types import arrow_schema, spark_struct

SOURCE_NAME = "eventavro"
_EXTENSIONS = EVENT_FORMATS["avro"].extensions
_ARROW_SCHEMA = pa.schema([f.with_nullable(True) for f in arrow_schema(EVENT_SCHEMA)]
                          + [pa.field("source_file", pa.string()),
                             pa.field("source_modified", pa.timestamp("us", tz="UTC")),
                             pa.field("read_error", pa.string())])
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16


def register(spark) -> str:
    """Register the source with a session; returns its format name.

    :param spark: the ``SparkSession`` to register the source with.
    """
    spark.dataSource.register(AvroEventSource)
    return SOURCE_NAME


def source_struct() -> StructType:
    """The source's Spark schema: the event fields, ``source_file``, ``source_modified`` (the
    file's modification time, as Spark's file sources give it in ``_metadata``) and
    ``read_error``."""
    return StructType([*spark_struct(EVENT_SCHEMA).fields,
                       StructField("source_file", StringType()),
                       StructField("source_modified", TimestampType()),
                       StructField("read_error", StringType())])


def _local_path(path: str) -> Path:
    parsed = urlparse(path)
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"{SOURCE_NAME} reads local or mounted directories only, got {path!r}")
    return Path(unquote(parsed.path) if parsed.scheme else path)


def list_files(directory: str) -> list[tuple[int, str]]:
    """The Avro files of ``directory`` (or the one file it names) as
    ``(mtime_ns, absolute path)``, in read order.

    Hidden and underscore-prefixed names (temporary files, markers) are not input.

    :param directory: the input directory, or one Avro file; a local path or ``file:`` URI.
    """
    root = _local_path(directory)
    if root.is_file():  # one file named directly
        return [(root.stat().st_mtime_ns, os.path.abspath(root))]
    out = []
    for entry in os.scandir(root):
        if (entry.is_file() and entry.name.endswith(_EXTENSIONS)
                and not entry.name.startswith(("_", "."))):
            out.append((entry.stat().st_mtime_ns, os.path.abspath(entry.path)))
    out.sort()
    return out


# -- decoding one file ---------------------------------------------------------------------------

def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at ``pos``; returns (value, next position)."""
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise EOFError("truncated block header")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("bad varint in block header")


def _decompress(codec: str, data: bytes) -> bytes:
    if codec == "null":
        return data
    if codec == "deflate":
        return zlib.decompress(data, -15)
    raise ValueError(f"unsupported Avro codec {codec!r} (readable: null, deflate)")


def _salvage(data: bytes, uri: str) -> Iterator[tuple[Optional[dict], Optional[str]]]:
    """Decode a damaged file block by block, as ``(record, None)`` or ``(None, reason)``: a
    block that fails is reported once, and reading resumes after the next sync marker."""
    try:
        header = fastavro.schemaless_reader(io.BytesIO(data), fastavro.read.HEADER_SCHEMA)
        if header["magic"] != _MAGIC:
            raise ValueError("not an Avro object container file")
        writer_schema = fastavro.parse_schema(
            json.loads(header["meta"]["avro.schema"].decode()))
        codec = header["meta"].get("avro.codec", b"null").decode()
        sync = header["sync"]
        header_end = data.index(sync) + _SYNC_SIZE
    except Exception as err:  # any failure to read the header makes the whole file unreadable
        yield None, f"corrupt Avro file {uri}: {err}"
        return
    pos = header_end
    while pos < len(data):
        start = pos
        try:
            count, pos = _read_long(data, pos)
            size, pos = _read_long(data, pos)
            if count < 0 or size < 0 or pos + size + _SYNC_SIZE > len(data):
                raise ValueError("block runs past the end of the file")
            block = io.BytesIO(_decompress(codec, data[pos:pos + size]))
            pos += size
            if data[pos:pos + _SYNC_SIZE] != sync:
                raise ValueError("sync marker missing after the block")
            pos += _SYNC_SIZE
            records = [fastavro.schemaless_reader(block, writer_schema, EVENT_SCHEMA)
                       for _ in range(count)]
        except Exception as err:
            yield None, f"corrupt Avro block at byte {start} of {uri}: {err}"
            found = data.find(sync, start + 1)
            if found < 0:
                return
            pos = found + _SYNC_SIZE
            continue
        for record in records:
            yield record, None


def read_file(path: str) -> Iterator[tuple[Optional[dict], Optional[str]]]:
    """The records of one Avro file as ``(record, None)``, and ``(None, reason)`` for each part
    that cannot be decoded. A healthy file is read by fastavro's reader in one pass; only a
    file that fails is read again block by block, so nothing is yielded twice.

    :param path: the local path of the Avro file.
    """
    uri = Path(path).as_uri()
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as err:
        yield None, f"unreadable Avro file {uri}: {err.strerror or err}"
        return
    try:
        records = list(fastavro.reader(io.BytesIO(data), reader_schema=EVENT_SCHEMA))
    except Exception:
        yield from _salvage(data, uri)
        return
    for record in records:
        yield record, None


def file_batches(path: str, batch_rows: int = 8_192) -> Iterator[pa.RecordBatch]:
    """One file's rows in the source schema, as Arrow record batches.

    :param path: the local path of the Avro file.
    :param batch_rows: the most rows per record batch.
    """
    uri = Path(path).as_uri()
    modified = _EPOCH + _dt.timedelta(microseconds=os.stat(path).st_mtime_ns // 1000)
    rows: list[dict] = []
    for record, error in read_file(path):
        row = dict(record) if record is not None else dict.fromkeys(EVENT_FIELDS)
        row["source_file"], row["source_modified"], row["read_error"] = uri, modified, error
        rows.append(row)
        if len(rows) >= batch_rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=_ARROW_SCHEMA)


# -- the data source -----------------------------------------------------------------------------

class FilesPartition(InputPartition):
    """The files one task reads."""

    def __init__(self, files: list[str]):
        """A partition of the input that reads ``files``, in order.

        :param files: the paths of the Avro files this partition reads.
        """
        super().__init__(files)
        self.files = files


def _partitions(files: list[str]) -> list[FilesPartition]:
    # One file per task: files are the unit of both work and failure.
    return [FilesPartition([f]) for f in files]


def _read_partition(partition: FilesPartition) -> Iterator[pa.RecordBatch]:
    for path in partition.files:
        yield from file_batches(path)


def _max_files(options) -> int:
    value = dict(options).get("maxFilesPerTrigger") or dict(options).get("maxfilespertrigger")
    if value in (None, ""):
        return 0
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 1:
        raise ValueError(f"{SOURCE_NAME} option maxFilesPerTrigger must be a positive integer, "
                         f"got {value!r}")
    return n


class AvroEventSource(DataSource):
    """Spec events from a directory of Avro object container files."""

    @classmethod
    def name(cls) -> str:
        """The format name to give ``spark.read.format``/``readStream.format``."""
        return SOURCE_NAME

    def schema(self):
        """The source's schema: the event fields and the file columns."""
        return source_struct()

    def _path(self) -> str:
        path = dict(self.options).get("path")
        if not path:
            raise ValueError(f"{SOURCE_NAME}: give the input directory to load(), e.g. "
                             f".load('/data/events')")
        return path

    def streamReader(self, schema) -> "AvroEventStreamReader":
        """The streaming reader of the ``path`` option's directory.

        :param schema: the schema Spark asks for (always ``schema()``'s; unused).
        """
        return AvroEventStreamReader(self._path(), _max_files(self.options))

    def reader(self, schema) -> "AvroEventBatchReader":
        """The batch reader of the ``path`` option's directory.

        :param schema: the schema Spark asks for (always ``schema()``'s; unused).
        """
        return AvroEventBatchReader(self._path())


class AvroEventStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the files seen; see the module docstring."""

    def __init__(self, path: str, max_files_per_trigger: int):
        """A streaming reader of the Avro files under ``path``.

        :param path: the input directory (or one file).
        :param max_files_per_trigger: the most new files per micro-batch; 0: no limit.
        """
        self.path = path
        self.max_files = max_files_per_trigger
        self._available_now: Optional[list] = None

    def initialOffset(self) -> dict:
        """The offset before any file: no file seen yet."""
        return {"upto": None, "files": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        """At most ``max_files_per_trigger`` files per micro-batch, or all new files without it."""
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the listing that an available-now run reads up to."""
        # Trigger.AvailableNow reads what exists now and no file that appears later.
        self._available_now = list_files(self.path)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The offset after the new files the next micro-batch reads (``start`` when none).

        :param start: the offset the next micro-batch starts from.
        :param limit: how many new files the micro-batch may take (``ReadMaxFiles`` or all).
        """
        listing = self._available_now if self._available_now is not None else list_files(self.path)
        upto = tuple(start["upto"]) if start.get("upto") else None
        new = [f for f in listing if upto is None or f > upto]
        if isinstance(limit, ReadMaxFiles):
            new = new[:limit.max_files]
        if not new:
            return start
        return {"upto": list(new[-1]), "files": [p for _, p in new]}

    def partitions(self, start: dict, end: dict) -> list[FilesPartition]:
        """The partitions that read the files between ``start`` and ``end``.

        :param start: the offset the micro-batch starts from.
        :param end: the offset it ends at, listing its files.
        """
        return _partitions(list(end["files"]) if end != start else [])

    def read(self, partition: FilesPartition) -> Iterator[pa.RecordBatch]:
        """The rows of ``partition``'s files, as Arrow record batches.

        :param partition: the files to read (a ``FilesPartition``).
        """
        return _read_partition(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the files stay where they are.

        :param end: the offset Spark has committed (unused).
        """


class AvroEventBatchReader(DataSourceReader):
    """Every Avro file of the directory, once."""

    def __init__(self, path: str):
        """A batch reader of the Avro files under ``path``.

        :param path: the input directory (or one file).
        """
        self.path = path

    def partitions(self) -> list[FilesPartition]:
        """The partitions that read every Avro file of the path."""
        return _partitions([p for _, p in list_files(self.path)])

    def read(self, partition: FilesPartition) -> Iterator[pa.RecordBatch]:
        """The rows of ``partition``'s files, as Arrow record batches.

        :param partition: the files to read (a ``FilesPartition``).
        """
        return _read_partition(partition)
