"""Where the jobs' rows go: each sink one module behind ``Sink`` (``base``), registered in
``SINKS``.

* ``parquet``: Parquet files in a directory, laid out by date; the attribution changelog, the
  dead letter and the late records are written here today;
* ``kafka``: records of a Kafka topic through Spark's Kafka connector (the attribution changelog
  with ``--output-topic``), at least once, each keyed by the row it holds (readers drop
  repeated keys: ``kafka_output.read_changelog``).

A job builds each of its sinks once from its options (``SINKS[kind](...)``) and calls
``start_stream`` (streaming) or ``write_batch`` (batch); the late-record audit calls
``write_micro_batch``. A new sink (a Delta table) is one module here and one entry below.
"""
from __future__ import annotations

from .base import REPLACE_ALL, REPLACE_DATES, Sink
from .kafka import KafkaSink
from .parquet import ParquetSink

# Sink name -> the callable that builds it from the job's options.
SINKS = {"parquet": ParquetSink, "kafka": KafkaSink}


__all__ = ["REPLACE_ALL", "REPLACE_DATES", "SINKS", "KafkaSink", "ParquetSink", "Sink"]
