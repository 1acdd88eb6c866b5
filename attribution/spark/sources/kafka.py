"""Kafka topics as an ``EventSource``, through Spark's Kafka connector (``format("kafka")``, the
``spark-sql-kafka-0-10`` jar of the session's Spark version).

Each record's value is one event, in the fields and names of the file formats: JSON text
(``--format json``), or Avro binary in the project's event schema (``--format avro``: the
schemaless encoding of ``attribution.schema.EVENT_SCHEMA``, no container header). A record's
origin is its topic, partition and offset (``source_topic``, ``source_partition``,
``source_offset``), and its arrival time the record's Kafka timestamp (``CreateTime`` as the
producer set it, or ``LogAppendTime`` when the topic says so), fixed in the log like a file's
modification time.

The offsets a micro-batch read are in the query's checkpoint, as for any Spark source: its end
offset per partition in ``offsets/<k>``, the start the previous micro-batch's end (for the
first one, the initial offsets the connector writes to ``sources/0/0``). Re-reading them for
the late-record audit asks the broker for exactly those ranges, with Spark's
``failOnDataLoss`` on: when retention has already deleted a range the read fails rather than
returning less, and ``lost_input`` tells the audit so (it records the micro-batch as not
audited, with the reason, instead of writing an incomplete set).
"""
from __future__ import annotations

import io
import json
import re
from typing import Iterator, Mapping, Optional, Sequence, Union

import fastavro
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ...schema import EVENT_FIELDS, EVENT_SCHEMA
from ..formats import event_format
from ..storage import Location
from ..types import arrow_schema, spark_struct
from .base import ARRIVAL_COLUMN, RAW_RECORD_COLUMN, READ_ERROR_COLUMN, EventSource
from .offset_log import batch_files, log_lines, source_range

SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "source_topic", "source_partition", "source_offset"
STARTING_OFFSETS = ("earliest", "latest")
_EARLIEST = -2  # Spark's Kafka source: "the earliest offset" in a JSON offset map
_DATA_LOSS = re.compile(r"KAFKA_DATA_LOSS(\.[A-Z_]+)?")  # the connector's error condition

# An offset range of one partition: (topic, partition, first offset, offset after the last).
OffsetRange = tuple[str, int, int, int]


def _origin() -> list[Column]:
    """The origin and arrival columns of the connector's rows."""
    return [F.col("topic").alias(SOURCE_TOPIC), F.col("partition").alias(SOURCE_PARTITION),
            F.col("offset").alias(SOURCE_OFFSET), F.col("timestamp").alias(ARRIVAL_COLUMN)]


def _json_values(frame: DataFrame) -> DataFrame:
    """JSON values as text records; a value that is not UTF-8 JSON is dead-lettered as such."""
    return frame.select(F.col("value").cast("string").alias(RAW_RECORD_COLUMN), *_origin())


_DECODED_SCHEMA = pa.schema([*(f.with_nullable(True) for f in arrow_schema(EVENT_SCHEMA)),
                             pa.field(READ_ERROR_COLUMN, pa.string())])


def decode_avro_value(value: Optional[bytes]) -> tuple[Optional[dict], Optional[str]]:
    """One Kafka value in the event schema's Avro binary encoding, as ``(record, None)``, or
    ``(None, reason)`` when it is not one.

    :param value: the record's value (``None`` for a record without one).
    """
    if value is None:
        return None, "record without a value"
    buffer = io.BytesIO(value)
    try:
        record = fastavro.schemaless_reader(buffer, EVENT_SCHEMA, EVENT_SCHEMA)
    except Exception as err:  # any decoding failure is the record's, not the job's
        return None, f"undecodable Avro value ({type(err).__name__}: {err})"
    rest = len(value) - buffer.tell()
    if rest:
        return None, f"undecodable Avro value ({rest} bytes left after the event)"
    return record, None


def _decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: each value decoded into the event fields and ``read_error``, the
    origin and arrival columns passed through."""
    for batch in batches:
        rows = []
        for value in batch.column("value").to_pylist():
            record, error = decode_avro_value(value)
            row = dict(record) if record is not None else dict.fromkeys(EVENT_FIELDS)
            row[READ_ERROR_COLUMN] = error
            rows.append(row)
        decoded = pa.RecordBatch.from_pylist(rows, schema=_DECODED_SCHEMA)
        passed = [name for name in batch.schema.names if name != "value"]
        yield pa.RecordBatch.from_arrays([*decoded.columns, *map(batch.column, passed)],
                                         names=[*_DECODED_SCHEMA.names, *passed])


def _avro_values(frame: DataFrame) -> DataFrame:
    """Avro binary values as typed records, decoded in Python (Spark's ``from_avro`` is in a
    separate jar); an undecodable value becomes one row with ``read_error``."""
    selected = frame.select("value", *_origin())
    schema = T.StructType([*spark_struct(EVENT_SCHEMA).fields,
                           T.StructField(READ_ERROR_COLUMN, T.StringType()),
                           *(f for f in selected.schema.fields if f.name != "value")])
    return selected.mapInArrow(_decode_batches, schema)


# Value encoding -> how the connector's rows become raw records. Parquet is a file layout, not
# an encoding of one record, so it has no entry.
VALUE_DECODERS = {"json": _json_values, "avro": _avro_values}


def _initial_offsets(checkpoint: Location) -> Optional[dict]:
    """The offsets the connector started the query at (its ``sources/0/0``), if written."""
    log = batch_files(checkpoint / "sources" / "0")
    if 0 not in log:
        return None
    lines = [line for line in log_lines(log[0]) if line]
    return json.loads(lines[0]) if lines else None


def offset_ranges(start: Optional[dict], end: dict) -> list[OffsetRange]:
    """The non-empty ranges between two offsets of the Kafka source (``{topic: {partition:
    offset}}``); a partition absent from ``start`` (new since) starts at its earliest offset.

    :param start: the offset the range starts at (``None``: every partition's earliest).
    :param end: the offset it ends before.
    """
    ranges = []
    for topic, partitions in sorted(end.items()):
        for partition, until in sorted(partitions.items(), key=lambda p: int(p[0])):
            first = (start or {}).get(topic, {}).get(partition, _EARLIEST)
            if first != until:
                ranges.append((topic, int(partition), int(first), int(until)))
    return ranges



def python_admin(bootstrap_servers: str, options: Mapping[str, str]):
    """The Python Kafka admin client set up as Spark's connector is: ``options``' ``kafka.``
    settings become its own. Used to ask the cluster before Spark starts.

    :param bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
    :param options: the options of Spark's Kafka source or sink.
    :returns: the client, or ``None`` when it refuses a setting only the Java client knows
        (such as ``kafka.sasl.jaas.config``): Spark's connector then finds out by itself.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    settings = {"bootstrap.servers": bootstrap_servers, "log_level": 0}
    settings.update({k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")})
    try:
        return AdminClient(settings)
    except (KafkaException, ValueError, TypeError):
        return None

class KafkaSource(EventSource):
    """Events from Kafka topics.

    :param bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
    :param topics: the topics to read (a list, or one comma-separated string).
    :param fmt: the encoding of each value, a key of ``VALUE_DECODERS``.
    :param starting_offsets: where a new checkpoint starts (``STARTING_OFFSETS``); a query
        with a checkpoint resumes at its offsets.
    :param max_offsets_per_trigger: at most this many records per micro-batch of a limited
        stream, over all partitions (``None``: all available).
    :param options: more options of Spark's Kafka source, as it names them (``kafka.``-prefixed
        consumer settings such as ``kafka.security.protocol``).
    """

    origin_fields = ({"name": SOURCE_TOPIC, "type": ["null", "string"]},
                     {"name": SOURCE_PARTITION, "type": ["null", "int"]},
                     {"name": SOURCE_OFFSET, "type": ["null", "long"]})
    arrival = "its Kafka timestamp"

    def __init__(self, bootstrap_servers: str, topics: Union[str, Sequence[str]],
                 fmt: str = "json", starting_offsets: str = "earliest",
                 max_offsets_per_trigger: Optional[int] = None,
                 options: Optional[Mapping[str, str]] = None):
        if fmt not in VALUE_DECODERS:
            event_format(fmt)  # an unknown name is refused with the list of formats
            raise ValueError(f"--format {fmt} is a file format; Kafka values are one of "
                             f"{', '.join(VALUE_DECODERS)}")
        super().__init__(event_format(fmt))
        self.bootstrap_servers = bootstrap_servers
        self.topics = tuple(t.strip() for t in (topics.split(",") if isinstance(topics, str)
                                                else topics) if t.strip())
        self.starting_offsets = starting_offsets
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.options = dict(options or {})

    def check(self) -> Optional[str]:
        if not self.bootstrap_servers.strip():
            return "--kafka-bootstrap-servers is empty; give HOST:PORT[,...]"
        if not self.topics:
            return "--kafka-topics names no topic; give T1[,T2,...]"
        if self.starting_offsets not in STARTING_OFFSETS:
            return (f"--kafka-starting-offsets {self.starting_offsets!r} is not one of "
                    f"{', '.join(STARTING_OFFSETS)}")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            return (f"--max-offsets-per-trigger must be at least 1, got "
                    f"{self.max_offsets_per_trigger}")
        return None

    def absent_topics(self, timeout: float = 10.0) -> Optional[list[str]]:
        """The topics of this source that the cluster does not have, asked with the Python
        Kafka client before Spark starts (``kafka.``-prefixed options become its settings).

        :param timeout: seconds to wait for the cluster's answer.
        :returns: the absent topics (empty: all exist), or ``None`` when the Python client
            cannot be set up as Spark's source is (an option only the Java client knows, such
            as ``kafka.sasl.jaas.config``): Spark's source then finds out by itself.
        :raises ConnectionError: no broker answered within ``timeout``.
        """
        from confluent_kafka import KafkaException

        admin = python_admin(self.bootstrap_servers, self.options)
        if admin is None:
            return None
        try:
            known = admin.list_topics(timeout=timeout).topics
        except KafkaException as err:
            raise ConnectionError(f"no Kafka broker answered at {self.bootstrap_servers} "
                                  f"within {timeout:g} s ({err.args[0].str()})") from None
        return [topic for topic in self.topics if topic not in known]

    def _reader(self, reader):
        reader = reader.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
        for key, value in self.options.items():
            reader = reader.option(key, value)
        return reader

    def _raw(self, frame: DataFrame) -> DataFrame:
        return VALUE_DECODERS[self.format.name](frame)

    def read_stream(self, spark, limited: bool = True) -> DataFrame:
        reader = (self._reader(spark.readStream).option("subscribe", ",".join(self.topics))
                  .option("startingOffsets", self.starting_offsets))
        if limited and self.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", int(self.max_offsets_per_trigger))
        return self._raw(reader.load())

    def read_batch(self, spark) -> DataFrame:
        return self._raw(self._reader(spark.read).option("subscribe", ",".join(self.topics))
                         .option("startingOffsets", "earliest")
                         .option("endingOffsets", "latest").load())

    def committed_input(self, checkpoint: Location, batch_id: int) -> Optional[list[OffsetRange]]:
        """The offset ranges micro-batch ``batch_id`` read, per partition."""
        start, end = source_range(checkpoint, batch_id)
        if end is None or end == start:
            return None
        if start is None:
            start = _initial_offsets(checkpoint)
        return offset_ranges(start, end) or None

    def read_committed(self, spark, part: list[OffsetRange]) -> DataFrame:
        assign, starting, ending = {}, {}, {}
        for topic, partition, first, until in part:
            assign.setdefault(topic, []).append(partition)
            starting.setdefault(topic, {})[str(partition)] = first
            ending.setdefault(topic, {})[str(partition)] = until
        return self._raw(self._reader(spark.read).option("assign", json.dumps(assign))
                         .option("startingOffsets", json.dumps(starting))
                         .option("endingOffsets", json.dumps(ending))
                         .option("failOnDataLoss", "true").load())

    def lost_input(self, error: BaseException) -> Optional[str]:
        """Spark's Kafka connector reports offsets the broker no longer holds as
        ``KAFKA_DATA_LOSS`` (retention, a deleted topic or partition)."""
        match = _DATA_LOSS.search(str(error))
        if match is None:
            return None
        return (f"the broker no longer holds its records ({match[0]}: retention or a deleted "
                f"topic removed them)")

    def describe(self) -> str:
        return (f"{self.format.name} values of Kafka topics {', '.join(self.topics)} at "
                f"{self.bootstrap_servers}")
