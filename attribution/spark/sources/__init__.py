"""Where the jobs' events come from: each input source one module behind ``EventSource``
(``base``), registered in ``SOURCES``.

* ``files``: a directory of event files, one class per format of ``formats.EVENT_FORMATS``
  (JSON lines, Parquet, Avro); origin: the file; arrival time: its modification time;
* ``kafka``: Kafka topics through Spark's Kafka connector, each value one event in JSON or
  Avro binary; origin: topic, partition and offset; arrival time: the record's timestamp.

A job builds its source once from its options (``SOURCES[kind](...)``), hands
``read_stream``/``read_batch`` to ``validation.classify``, and the source to the late-record
audit (``late_records.audit``). A new transport is one module here and one entry below; a new
file format one entry in ``formats.EVENT_FORMATS`` and one class in ``files``.
"""
from __future__ import annotations

from typing import Union

from .base import ARRIVAL_COLUMN, RAW_RECORD_COLUMN, READ_ERROR_COLUMN, EventSource
from .files import FILE_SOURCES, FileSource, file_source
from .kafka import KafkaSource

# Transport name -> the callable that builds its source from the job's options.
SOURCES = {"files": file_source, "kafka": KafkaSource}


def as_source(source: Union[str, EventSource]) -> EventSource:
    """``source`` itself, or for a format name the files of that format (a source that can
    re-read committed micro-batches and classify their records, without a directory).

    :param source: an ``EventSource`` or a key of ``formats.EVENT_FORMATS``.
    """
    return source if isinstance(source, EventSource) else file_source(source)


__all__ = ["ARRIVAL_COLUMN", "FILE_SOURCES", "FileSource", "KafkaSource", "RAW_RECORD_COLUMN",
           "READ_ERROR_COLUMN", "SOURCES", "EventSource", "as_source", "file_source"]
