"""Event files as Spark DataFrames: the stream and batch readers of every job.

One schema (derived from the Avro event schema) and one file filter per format, so the
attribution job, the join job, validation and the benchmarks read input identically.
"""
from __future__ import annotations

from typing import Optional

from ..schema import EVENT_SCHEMA
from .types import spark_struct


def event_struct():
    """The Spark schema of input events, derived from the Avro event schema."""
    return spark_struct(EVENT_SCHEMA)


# Only files with the format's extension are input: a README or a _SUCCESS marker next to the
# data must not turn into all-null rows.
FILE_GLOBS = {"json": "*.{json,jsonl}", "parquet": "*.parquet"}


def _configure_reader(reader, fmt: str):
    if fmt not in FILE_GLOBS:
        raise ValueError(f"unsupported input format {fmt!r}; expected one of {sorted(FILE_GLOBS)}")
    reader = reader.schema(event_struct()).format(fmt).option("pathGlobFilter", FILE_GLOBS[fmt])
    if fmt == "json":
        reader = reader.option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX")
    return reader


def read_event_stream(spark, events_dir: str, fmt: str, max_files_per_trigger: Optional[int] = None):
    """A file stream of spec events (JSON lines or Parquet) with the project's event schema."""
    reader = _configure_reader(spark.readStream, fmt)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", int(max_files_per_trigger))
    return reader.load(events_dir)


def read_event_batch(spark, events_dir: str, fmt: str):
    """The same input read once, as a batch DataFrame."""
    return _configure_reader(spark.read, fmt).load(events_dir)
