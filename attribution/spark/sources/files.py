"""Event files in a directory as an ``EventSource``: JSON lines and Parquet through Spark's file
sources, Avro through the project's ``avro_source``; one small class per format.

A record's origin is its file (``source_file``, the file's URI) and its arrival time the file's
modification time: a reference every query and every rerun that reads the file sees alike.
A committed micro-batch's files are in the query's checkpoint: Spark's file source logs them
under ``sources/0`` (the offset is a log position), the Avro source in the offset itself.
"""
from __future__ import annotations

import functools
import json
import re
from abc import abstractmethod
from typing import Optional
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ...schema import EVENT_FIELDS, EVENT_SCHEMA
from .. import avro_source
from ..formats import event_format, format_mismatch
from ..storage import Location, available, location
from ..types import spark_struct
from .base import ARRIVAL_COLUMN, RAW_RECORD_COLUMN, READ_ERROR_COLUMN, EventSource
from .offset_log import batch_files, log_lines, source_range

SOURCE_FILE = "source_file"
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _local(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


# Spark's error for an input file it cannot decode (e.g. a Parquet column of another type).
_UNREADABLE_FILE = re.compile(
    r"\[FAILED_READ_FILE\.(?P<kind>[A-Z_]+)\] Encountered error while reading file "
    r"(?P<file>\S+?)\.\s+(?P<detail>.*?)(?:\s+SQLSTATE|\n|$)")
LEFT_OUT_FILE = "unreadable-input.json"  # in the checkpoint: the input files left out


def unreadable_file(error: BaseException) -> Optional[tuple[str, str]]:
    """The file (as Spark names it) and the reason, when ``error`` is Spark failing to decode an
    input file; else ``None``.

    :param error: what a query or a batch read raised.
    """
    match = _UNREADABLE_FILE.search(str(error))
    return None if match is None else (match["file"], match["detail"].strip())


def _spellings(uri: str) -> set[str]:
    """A local file's URI as Spark's error (``file:///p``) and its ``_metadata.file_path``
    (``file:/p``) spell it."""
    short = re.sub(r"^file:///", "file:/", uri)
    return {uri, short, re.sub(r"^file:/(?!/)", "file:///", short)}


def _file_source_entries(checkpoint: Location, log_offset: int) -> list[str]:
    """The files of Spark's file source log entry ``log_offset``, also inside a compact file."""
    log = batch_files(checkpoint / "sources" / "0")
    candidates = [b for b in log if b >= log_offset and (b == log_offset
                                                         or log[b].name.endswith(".compact"))]
    if not candidates:
        raise ValueError(f"{checkpoint}: the file source's log has no entry {log_offset}")
    entries = (json.loads(line) for line in log_lines(log[min(candidates)]) if line)
    return [e["path"] for e in entries if e.get("batchId") == log_offset]


class FileSource(EventSource):
    """Event files of one format in a directory, read in arrival (modification time) order.

    :param directory: the input directory (``None`` for a source that only re-reads committed
        micro-batches, whose files the checkpoint names).
    :param max_files_per_trigger: at most this many new files per micro-batch of a limited
        stream (``None``: all).
    """

    format_name: str = ""  # the subclass's key in ``EVENT_FORMATS``
    origin_fields = ({"name": SOURCE_FILE, "type": ["null", "string"]},)
    arrival = "its file's modification time"

    def __init__(self, directory: Optional[str] = None,
                 max_files_per_trigger: Optional[int] = None):
        super().__init__(event_format(self.format_name))
        self.directory = directory
        self.max_files_per_trigger = max_files_per_trigger

    # -- the format's hooks -----------------------------------------------------------------

    @abstractmethod
    def _reader(self, spark, reader):
        """``reader`` (``spark.read`` or ``spark.readStream`` of ``spark``) set up for this
        format."""

    @abstractmethod
    def _raw(self, frame: DataFrame) -> DataFrame:
        """The reader's rows as raw records (see ``EventSource``)."""

    # -- EventSource ------------------------------------------------------------------------

    def check(self) -> Optional[str]:
        if self.directory is None or not available(self.directory):
            return None  # a URI before Spark starts: Spark's own read reports a missing one
        if not location(self.directory).is_dir():
            return f"--events {self.directory} is not a directory"
        return format_mismatch(self.directory, self.format.name)

    def _location(self) -> str:
        if self.directory is None:
            raise ValueError(f"{type(self).__name__} has no input directory to read")
        return self.directory

    def read_stream(self, spark, limited: bool = True) -> DataFrame:
        reader = self._reader(spark, spark.readStream)
        if limited and self.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", int(self.max_files_per_trigger))
        return self._raw(reader.load(self._location()))

    def read_batch(self, spark) -> DataFrame:
        return self._raw(self._reader(spark, spark.read).load(self._location()))

    def committed_input(self, checkpoint: Location, batch_id: int) -> Optional[list[str]]:
        """The local paths (or remote URIs) of the files micro-batch ``batch_id`` read."""
        start, end = source_range(checkpoint, batch_id)
        if end is None or end == start:
            return None
        if "logOffset" in end:  # Spark's file source
            files = _file_source_entries(checkpoint, end["logOffset"])
        else:  # the project's Avro source
            files = list(end.get("files", []))
        return [_local(f) for f in files] or None

    def read_committed(self, spark, part: list[str]) -> DataFrame:
        return self._raw(self._reader(spark, spark.read).load(list(part)))

    def describe(self) -> str:
        return f"{self.format.label} files in {self.directory}"


def _with_file_origin(frame: DataFrame, *columns) -> DataFrame:
    """``columns`` of a Spark file source's rows, with the file as origin and its modification
    time as arrival."""
    return frame.select(*columns, F.col("_metadata.file_path").alias(SOURCE_FILE),
                        F.col("_metadata.file_modification_time").alias(ARRIVAL_COLUMN))


class JsonFiles(FileSource):
    """JSON lines, read as text: a line that is not JSON still reaches the dead letter."""

    format_name = "json"

    def _reader(self, spark, reader):
        return reader.format("text").option("pathGlobFilter", self.format.glob)

    def _raw(self, frame: DataFrame) -> DataFrame:
        # Blank lines are not records (the JSON-lines reader skips them too).
        return (_with_file_origin(frame, F.col("value").alias(RAW_RECORD_COLUMN))
                .filter(F.trim(RAW_RECORD_COLUMN) != F.lit("")))


class ParquetFiles(FileSource):
    """Parquet files in the event schema. Spark cannot decode a file whose column types
    contradict it: once a read fails on one, ``leave_out`` records it (in the checkpoint), every
    later read skips it (a filter on ``_metadata.file_path``, which Spark applies to the file
    list before opening any file), and its rows, read with the file's own schema, are dead
    letters with Spark's reason (``unreadable_dead_letters``)."""

    format_name = "parquet"

    def __init__(self, directory: Optional[str] = None,
                 max_files_per_trigger: Optional[int] = None):
        super().__init__(directory, max_files_per_trigger)
        self.left_out: dict[str, str] = {}  # file URI -> why Spark cannot decode it

    def _reader(self, spark, reader):
        return (reader.schema(spark_struct(EVENT_SCHEMA)).format("parquet")
                .option("pathGlobFilter", self.format.glob))

    def _raw(self, frame: DataFrame) -> DataFrame:
        if self.left_out:
            skipped = sorted(set().union(*map(_spellings, self.left_out)))
            frame = frame.filter(~F.col("_metadata.file_path").isin(skipped))
        return _with_file_origin(frame, *EVENT_FIELDS,
                                 F.lit(None).cast("string").alias(READ_ERROR_COLUMN))

    def leave_out(self, error: BaseException, checkpoint: Optional[str] = None) -> Optional[str]:
        found = unreadable_file(error)
        if found is None or found[0] in self.left_out:
            return None
        uri, detail = found
        self.left_out[uri] = detail
        if checkpoint is not None:
            (location(checkpoint) / LEFT_OUT_FILE).write_text(json.dumps(self.left_out, indent=1))
        return (f"input file {uri} cannot be read as events ({detail}): its rows go to the dead "
                "letter, and the job goes on without it")

    def restore_left_out(self, checkpoint: str) -> None:
        recorded = location(checkpoint) / LEFT_OUT_FILE
        if recorded.is_file():
            self.left_out.update(json.loads(recorded.read_text()))

    def left_out_parts(self) -> list[str]:
        return list(self.left_out)

    def unreadable_dead_letters(self, part: list[str]) -> Optional[pa.Table]:
        """One dead letter per row of each left-out file of ``part``: the row as JSON, read
        with the file's own schema (one row without a record when even that fails)."""
        if not self.left_out:
            return None
        local = {_local(s): (uri, detail) for uri, detail in self.left_out.items()
                 for s in _spellings(uri)}
        rows = []
        for f in part:
            if _local(f) not in local:
                continue
            uri, detail = local[_local(f)]
            origin = re.sub(r"^file:///", "file:/", uri)  # as ``_metadata.file_path`` has it
            reason = f"input file cannot be read as events: {detail}"
            try:
                with location(_local(f)).open() as stream:
                    records = [json.dumps(r, default=str)
                               for r in pq.read_table(stream).to_pylist()]
            except (OSError, pa.ArrowException):
                records = [None]
            rows += [{"raw_record": r, "reason": reason, SOURCE_FILE: origin} for r in records]
        if not rows:
            return None
        return pa.Table.from_pylist(rows, schema=pa.schema([
            ("raw_record", pa.string()), ("reason", pa.string()), (SOURCE_FILE, pa.string())]))

    def earliest_ts_ms(self, part: list[str]) -> Optional[float]:
        """From the ``ts`` column alone (nulls, which validation rejects, ignored). ``None``
        when its ``ts`` is not a timestamp, or pyarrow cannot read it. Files on any Hadoop file
        system are read through ``storage`` (the footer and the ``ts`` column only)."""
        import pyarrow.compute as pc

        earliest = float("inf")
        for f in part:
            try:
                with location(f).open() as stream:
                    ts = pq.read_table(stream, columns=["ts"]).column("ts")
            except Exception:  # noqa: BLE001 - any file not read here is read again by Spark
                # (pyarrow's errors, a URI before Spark runs, a file system the JVM lacks)
                return None
            if not pa.types.is_timestamp(ts.type):
                return None
            least = pc.min(ts.cast(pa.int64())).as_py()
            if least is not None:  # truncated to milliseconds, as Spark's unix_millis does
                earliest = min(earliest, least * 1000 // _PER_SECOND[ts.type.unit])
        return earliest


class AvroFiles(FileSource):
    """Avro object container files, through the project's Python data source (Spark's own Avro
    connector is a separate jar); a corrupt block becomes one row with ``read_error``."""

    format_name = "avro"

    def _reader(self, spark, reader):
        return reader.format(avro_source.register(spark))

    def _raw(self, frame: DataFrame) -> DataFrame:
        return frame.select(*EVENT_FIELDS, SOURCE_FILE,
                            F.col("source_modified").alias(ARRIVAL_COLUMN), READ_ERROR_COLUMN)

    def read_committed(self, spark, part: list[str]) -> DataFrame:
        # The data source takes one path per load.
        frames = [self._raw(self._reader(spark, spark.read).load(f)) for f in part]
        return functools.reduce(DataFrame.unionByName, frames)


# One entry per format of ``EVENT_FORMATS``; a test holds the two tables to the same keys.
FILE_SOURCES = {cls.format_name: cls for cls in (JsonFiles, ParquetFiles, AvroFiles)}


def file_source(fmt: str, directory: Optional[str] = None,
                max_files_per_trigger: Optional[int] = None) -> FileSource:
    """The source of ``fmt`` files in ``directory``.

    :param fmt: a key of ``EVENT_FORMATS``; another is a ``ValueError`` naming the valid ones.
    :param directory: the input directory (``None``: only committed micro-batches are re-read).
    :param max_files_per_trigger: see ``FileSource``.
    """
    event_format(fmt)
    return FILE_SOURCES[fmt](directory, max_files_per_trigger)

