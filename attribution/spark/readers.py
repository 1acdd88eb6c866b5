"""Event files as Spark DataFrames: the stream and batch readers of every job (JSON lines and
Parquet through Spark's file sources, Avro through the project's ``avro_source``).

One schema (derived from the Avro event schema) and one file filter per format, so the
attribution job, the join job, validation and the benchmarks read input identically.
"""
from __future__ import annotations

import os
from typing import Optional

from ..schema import EVENT_SCHEMA
from .avro_source import SOURCE_NAME as AVRO_SOURCE
from .avro_source import register as register_avro
from .types import spark_struct


def event_struct():
    """The Spark schema of input events, derived from the Avro event schema."""
    return spark_struct(EVENT_SCHEMA)


# Only files with the format's extension are input: a README or a _SUCCESS marker next to the
# data must not turn into all-null rows.
FILE_EXTENSIONS = {"json": (".json", ".jsonl"), "parquet": (".parquet",), "avro": (".avro",)}


def _glob(extensions: tuple) -> str:
    """Hadoop's glob of file names ending in one of ``extensions``: ``*.{json,jsonl}``."""
    if len(extensions) == 1:
        return "*" + extensions[0]
    return "*.{" + ",".join(e.lstrip(".") for e in extensions) + "}"


FILE_GLOBS = {fmt: _glob(extensions) for fmt, extensions in FILE_EXTENSIONS.items()}
FORMATS = tuple(FILE_GLOBS)


def format_mismatch(events_dir: str, fmt: str) -> Optional[str]:
    """Why ``events_dir`` cannot be ``fmt`` input, when it holds files of another format and
    none of ``fmt`` (a run would silently read nothing); ``None`` otherwise.

    :param events_dir: a local input directory (remote ones are not listed: ``None``).
    :param fmt: the chosen input format, a key of ``FILE_EXTENSIONS``.

    Names starting with ``_`` or ``.`` are skipped, as Spark skips them. The listing stops at
    the first file of the chosen format, so a large directory of right files costs little.
    """
    if "://" in events_dir:
        return None
    found = {other: 0 for other in FILE_EXTENSIONS}
    for _, dirs, files in os.walk(events_dir):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in files:
            if name.startswith(("_", ".")):
                continue
            for other, extensions in FILE_EXTENSIONS.items():
                if name.endswith(extensions):
                    if other == fmt:
                        return None
                    found[other] += 1
    others = [(n, other) for other, n in found.items() if n]
    if not others:
        return None
    count, other = max(others)
    return (f"--format {fmt} but {events_dir} holds {count} {'/'.join(FILE_EXTENSIONS[other])} "
            f"file{'s' if count > 1 else ''} and no {'/'.join(FILE_EXTENSIONS[fmt])} file; "
            f"use --format {other}")


def _configure_reader(reader, fmt: str):
    if fmt not in FILE_GLOBS:
        raise ValueError(f"unsupported input format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "avro":
        # Spark's Avro connector is a separate jar; the project's Python source reads the files.
        return reader.format(AVRO_SOURCE)
    reader = reader.schema(event_struct()).format(fmt).option("pathGlobFilter", FILE_GLOBS[fmt])
    if fmt == "json":
        reader = reader.option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX")
    return reader


def read_event_stream(spark, events_dir: str, fmt: str, max_files_per_trigger: Optional[int] = None):
    """A file stream of spec events with the project's event schema.

    :param events_dir: the input directory.
    :param fmt: one of ``FORMATS``. Avro rows also carry ``source_file`` and ``read_error``
        (see ``avro_source``).
    :param max_files_per_trigger: at most this many new files per micro-batch (None: all).
    """
    if fmt == "avro":
        register_avro(spark)
    reader = _configure_reader(spark.readStream, fmt)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", int(max_files_per_trigger))
    return reader.load(events_dir)


def read_event_batch(spark, events_dir: str, fmt: str):
    """The same input read once, as a batch DataFrame."""
    if fmt == "avro":
        register_avro(spark)
    return _configure_reader(spark.read, fmt).load(events_dir)
