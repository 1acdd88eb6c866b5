"""Where the jobs' rows go: each sink one module behind ``Sink`` (``base``), registered in
``SINKS``.

* ``parquet``: Parquet files in a directory, laid out by date; the attribution changelog, the
  dead letter and the late records are written here today.

A job builds each of its sinks once from its options (``SINKS[kind](...)``) and calls
``start_stream`` (streaming) or ``write_batch`` (batch); the late-record audit calls
``write_micro_batch``. A new sink (a Kafka topic, a Delta table) is one module here and one
entry below.
"""
from __future__ import annotations

from .base import REPLACE_ALL, REPLACE_DATES, Sink
from .parquet import ParquetSink

# Sink name -> the callable that builds it from the job's options.
SINKS = {"parquet": ParquetSink}


__all__ = ["REPLACE_ALL", "REPLACE_DATES", "SINKS", "ParquetSink", "Sink"]
