"""The Kafka source without a broker: records shaped as Spark's Kafka connector gives them
(``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``) go
through the source's decoding and validation; the dead letter names topic, partition and offset,
the future-skew rule is judged against the Kafka timestamp, and the options reach the reader.
Reading from a real broker is tested with the local broker (``kafka-local``)."""
from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
from pyspark.sql import functions as F
from pyspark.sql import types as T

from attribution.schema import EVENT_SCHEMA
from attribution.spark.sources import KafkaSource
from attribution.spark.validation import classify, dead_letters, valid_events

UTC = dt.timezone.utc
WRITTEN = dt.datetime(2024, 1, 1, 12, 0, tzinfo=UTC)  # every record's Kafka timestamp
VISIT = {"event_id": "v1", "user_id": "u1", "event_type": "visit", "ts": "2024-01-01T11:59:00Z",
         "url": "http://shop/thing", "is_goal": True}
CONNECTOR_ROWS = T.StructType([
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
    T.StructField("timestampType", T.IntegerType())])


def _records(spark, values: list):
    rows = [(b"u1", v, "events", n % 2, 100 + n, WRITTEN, 0) for n, v in enumerate(values)]
    return spark.createDataFrame(rows, CONNECTOR_ROWS)


class _Reader:
    """Spark's reader as far as the source uses it: records the options, loads ``frame``."""

    def __init__(self, frame, calls: list):
        self.frame, self.calls = frame, calls

    def format(self, name):
        self.calls.append(("format", name))
        return self

    def option(self, key, value):
        self.calls.append((key, value))
        return self

    def load(self, *paths):
        self.calls.append(("load", paths))
        return self.frame


class _Session:
    def __init__(self, frame):
        self.calls: list = []
        self.readStream = _Reader(frame, self.calls)
        self.read = _Reader(frame, self.calls)


def test_json_values_are_validated_and_the_dead_letter_names_topic_partition_offset(spark):
    far = {**VISIT, "event_id": "far", "ts": "2024-01-03T12:00:01Z"}  # > 1 day past WRITTEN
    values = [json.dumps(VISIT).encode(), b"not json", json.dumps({**VISIT, "url": 5}).encode(),
              json.dumps(far).encode(), None]
    source = KafkaSource("127.0.0.1:9092", "events")
    raw = source.read_stream(_Session(_records(spark, values)))
    classified = classify(raw, source, 86_400_000, "1 day")
    assert [r.event_id for r in valid_events(classified).collect()] == ["v1"]
    dead = {r.source_offset: r for r in dead_letters(classified).collect()}
    assert sorted(dead) == [101, 102, 103, 104]
    assert {(r.source_topic, r.source_partition) for r in dead.values()} == {
        ("events", 1), ("events", 0)}
    assert dead[101].raw_record == "not json" and dead[101].reason == "malformed JSON"
    assert dead[102].reason == "url must be a string, got int"
    assert dead[103].reason == ("ts 2024-01-03T12:00:01.000Z is more than 1 day ahead of its "
                                "Kafka timestamp 2024-01-01T12:00:00.000Z (--max-future-skew)")
    assert dead[104].raw_record is None and dead[104].reason == "malformed JSON"
    assert "source_file" not in dead_letters(classified).columns


def _avro(record: dict) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, EVENT_SCHEMA, record)
    return buffer.getvalue()


def test_avro_values_are_decoded_and_an_undecodable_one_is_dead_lettered(spark):
    visit = {**VISIT, "ts": dt.datetime(2024, 1, 1, 11, 59, tzinfo=UTC), "value": 4.5}
    empty_id = {**visit, "event_id": ""}
    values = [_avro(visit), b"\x02garbage", _avro(empty_id)]
    source = KafkaSource("127.0.0.1:9092", ["events"], fmt="avro")
    classified = classify(source.read_batch(_Session(_records(spark, values))), source,
                          86_400_000, "1 day")
    (good,) = valid_events(classified).select(
        "event_id", "value", "is_goal", F.unix_millis("ts").alias("ts_ms")).collect()
    assert tuple(good) == ("v1", 4.5, True, int(visit["ts"].timestamp() * 1000))
    dead = {r.source_offset: r for r in dead_letters(classified).collect()}
    assert sorted(dead) == [101, 102]
    assert dead[101].reason.startswith("undecodable Avro value (") and dead[101].raw_record is None
    assert dead[102].reason == "empty event_id"
    assert json.loads(dead[102].raw_record)["event_id"] == ""


def test_the_options_reach_sparks_kafka_reader(spark):
    frame = _records(spark, [json.dumps(VISIT).encode()])
    source = KafkaSource("h1:9092,h2:9092", "a,b", starting_offsets="latest",
                         max_offsets_per_trigger=500,
                         options={"kafka.security.protocol": "SASL_SSL"})
    session = _Session(frame)
    source.read_stream(session)
    assert session.calls == [("format", "kafka"), ("kafka.bootstrap.servers", "h1:9092,h2:9092"),
                             ("kafka.security.protocol", "SASL_SSL"), ("subscribe", "a,b"),
                             ("startingOffsets", "latest"), ("maxOffsetsPerTrigger", 500),
                             ("load", ())]
    session.calls.clear()
    source.read_stream(session, limited=False)  # the dead-letter query takes all that is new
    assert ("maxOffsetsPerTrigger", 500) not in session.calls
    session.calls.clear()
    source.read_committed(session, [("a", 0, 4, 10), ("a", 2, -2, 3), ("b", 1, 0, 7)])
    options = dict(c for c in session.calls if c[0] not in ("format", "load"))
    assert json.loads(options["assign"]) == {"a": [0, 2], "b": [1]}
    assert json.loads(options["startingOffsets"]) == {"a": {"0": 4, "2": -2}, "b": {"1": 0}}
    assert json.loads(options["endingOffsets"]) == {"a": {"0": 10, "2": 3}, "b": {"1": 7}}
    assert options["failOnDataLoss"] == "true"
