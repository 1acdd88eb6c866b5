"""Event files as typed Spark DataFrames, without validation: for the benchmarks and tests that
read a generator's (valid) files directly. The jobs read through ``sources`` and validate.

One schema (derived from the Avro event schema) and the file filter of ``formats.EVENT_FORMATS``,
so every reader takes the same files the jobs take.
"""
from __future__ import annotations

from typing import Optional

from ..schema import EVENT_SCHEMA
from . import avro_source
from .formats import EVENT_FORMATS, FORMATS, event_format, format_mismatch
from .types import spark_struct

# FORMATS and format_mismatch are imported from here by the jobs' command line.
__all__ = ["FORMATS", "event_struct", "format_mismatch", "read_event_batch", "read_event_stream"]


def event_struct():
    """The Spark schema of input events, derived from the Avro event schema."""
    return spark_struct(EVENT_SCHEMA)


def _typed_files(spark, reader, fmt: str):
    """Spark's reader of ``fmt`` files in the event schema."""
    return (reader.schema(event_struct()).format(fmt)
            .option("pathGlobFilter", EVENT_FORMATS[fmt].glob))


# Format -> how ``spark.read`` / ``spark.readStream`` is set up to read its files as events.
_READERS = {
    "json": lambda spark, reader: _typed_files(spark, reader, "json")
    .option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX"),
    "parquet": lambda spark, reader: _typed_files(spark, reader, "parquet"),
    # Spark's Avro connector is a separate jar; the project's Python source reads the files.
    "avro": lambda spark, reader: reader.format(avro_source.register(spark)),
}


def _configure_reader(spark, reader, fmt: str):
    event_format(fmt)  # an unknown name is refused with the list of formats
    return _READERS[fmt](spark, reader)


def read_event_stream(spark, events_dir: str, fmt: str,
                      max_files_per_trigger: Optional[int] = None):
    """A file stream of spec events with the project's event schema.

    :param spark: the session.
    :param events_dir: the input directory.
    :param fmt: one of ``FORMATS``. Avro rows also carry ``source_file``, ``source_modified``
        and ``read_error`` (see ``avro_source``).
    :param max_files_per_trigger: at most this many new files per micro-batch (None: all).
    """
    reader = _configure_reader(spark, spark.readStream, fmt)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", int(max_files_per_trigger))
    return reader.load(events_dir)


def read_event_batch(spark, events_dir: str, fmt: str):
    """The same input read once, as a batch DataFrame.

    :param spark: the session.
    :param events_dir: the input directory.
    :param fmt: one of ``FORMATS``.
    """
    return _configure_reader(spark, spark.read, fmt).load(events_dir)
