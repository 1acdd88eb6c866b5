"""Where the jobs' rows go: each sink one module behind ``Sink`` (``base``), registered in
``SINKS``; and which table format an output directory is written in (``output_format``).

* ``parquet``: Parquet files in a directory, laid out by date; the attribution changelog (with
  ``--output-format parquet``), the dead letter and the late records are written here;
* ``delta``: a Delta Lake table, partitioned by date: the attribution changelog (the default
  for a new output), each micro-batch one idempotent commit carrying its completeness frontier,
  and optionally the current table it folds to;
* ``kafka``: records of a Kafka topic through Spark's Kafka connector (the attribution changelog
  with ``--output-topic``), at least once, each keyed by the row it holds (readers drop
  repeated keys: ``kafka_output.read_changelog``).

A job builds each of its sinks once from its options (``SINKS[kind](...)``) and calls
``start_stream`` (streaming) or ``write_batch`` (batch); the late-record audit calls
``write_micro_batch``. A new sink is one module here and one entry below.
"""
from __future__ import annotations

from typing import Optional

from ..output import DELTA_LOG_DIR, SINK_LOG_DIR, SUCCESS_MARKER
from ..storage import available, location
from .base import REPLACE_ALL, REPLACE_DATES, Sink
from .delta import DeltaSink
from .kafka import KafkaSink
from .parquet import ParquetSink

# Sink name -> the callable that builds it from the job's options.
SINKS = {"parquet": ParquetSink, "delta": DeltaSink, "kafka": KafkaSink}

# The table formats of an output directory (--output-format), and the one a new output gets.
OUTPUT_FORMATS = ("delta", "parquet")
DEFAULT_OUTPUT_FORMAT = "delta"


class OutputFormatRefused(ValueError):
    """An output asked for in one format already holds the other; the message says which."""


def detect_output_format(path: str) -> Optional[str]:
    """The format an existing output directory is written in, ``None`` for a new or empty one:
    ``delta`` with a ``_delta_log``; ``parquet`` with a file sink's ``_spark_metadata``, a batch
    write's ``_SUCCESS``, Parquet files or ``name=value`` partition directories. It is looked at
    through ``storage``: a URI only once Spark runs (before, it counts as new, and the job asks
    again once the session is up).

    :param path: the output directory, local or a URI.
    """
    if not available(path):
        return None
    directory = location(path)
    if not directory.is_dir():
        return None
    names = [(p.name, p.is_dir()) for p in directory.iterdir()]
    if any(name == DELTA_LOG_DIR for name, _ in names):
        return "delta"
    for name, is_dir in names:
        if name in (SINK_LOG_DIR, SUCCESS_MARKER) or (not is_dir and name.endswith(".parquet")) \
                or (is_dir and "=" in name and not name.startswith((".", "_"))):
            return "parquet"
    return None


def choose_output_format(path: str, asked: Optional[str], option: str = "--output") -> str:
    """The format to write ``path`` in: the one it holds (``detect_output_format``), so that
    running jobs and their checkpoints continue; ``asked`` (``--output-format``) for a new one,
    else ``DEFAULT_OUTPUT_FORMAT``.

    :param path: the output directory.
    :param asked: ``--output-format``, or ``None``.
    :param option: the option that named ``path``, quoted in the message.
    :raises OutputFormatRefused: ``asked`` contradicts the format ``path`` holds.
    """
    found = detect_output_format(path)
    if found is not None and asked is not None and asked != found:
        other = next(f for f in OUTPUT_FORMATS if f != asked)
        raise OutputFormatRefused(
            f"{option} {path} holds {found} output and --output-format is {asked}: an output "
            f"keeps its format; leave --output-format out (or give {other}), or give a new "
            f"{option}")
    return found or asked or DEFAULT_OUTPUT_FORMAT


__all__ = ["DEFAULT_OUTPUT_FORMAT", "OUTPUT_FORMATS", "REPLACE_ALL", "REPLACE_DATES", "SINKS",
           "DeltaSink", "KafkaSink", "OutputFormatRefused", "ParquetSink", "Sink",
           "choose_output_format", "detect_output_format"]
