"""The Kafka sink on the suite's broker: attribution rows written by a streaming query or a batch
write come back from ``read_changelog`` each once, also after a micro-batch was written twice
(at least once: a crash after the write and before the commit); each row has its own key, a
retraction and its replacement included; a goal's records share a partition; a topic that
holds records of another query is refused."""
from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from attribution.events import ms_to_datetime, ms_to_iso
from attribution.rows import Attribution
from attribution.schema import OUTPUT_SCHEMA
from attribution.spark.kafka_output import read_changelog, read_topic
from attribution.spark.sinks import REPLACE_ALL, REPLACE_DATES, SINKS, KafkaSink
from attribution.spark.sinks.kafka import TopicRefused
from attribution.spark.sources.offset_log import batch_files
from attribution.spark.types import spark_struct

GOAL_TS = 1_700_000_000_000


def _row(user: str, goal: str, impression: int | None, model: str = "last_touch",
         sign: int = 1, revision: int = 0, timing: str = "ON_TIME",
         credit: float = 1.0) -> Attribution:
    organic = impression is None
    return Attribution(
        user_id=user, goal_event_id=goal, goal_url=f"/goal/{goal}", goal_ts=GOAL_TS,
        impression_id=impression, impression_event_id=None if organic else f"i-{impression}",
        impression_source_url=None if organic else "/search",
        impression_target_url=None if organic else "/landing",
        impression_ts=None if organic else GOAL_TS - 60_000,
        trail=() if organic else ("/landing",), model=model,
        credit=0.0 if organic else credit, impression_campaign=None if organic else "spring",
        goal_value=10.0, credited_value=0.0 if organic else 10.0 * credit, sign=sign,
        revision=revision, emit_timing=timing)


# A retraction of revision 0 and its replacement (revision 1) of the same goal, model and
# impression; a second model's rows of that goal; an organic goal; a goal of another user with
# the same event_id.
ROWS = [
    _row("u1", "g1", 7, sign=1, revision=0, timing="EARLY"),
    _row("u1", "g1", 7, sign=-1, revision=0, timing="EARLY"),
    _row("u1", "g1", 7, sign=1, revision=1, timing="ON_TIME"),
    _row("u1", "g1", 7, model="linear", credit=0.5),
    _row("u1", "g1", 8, model="linear", credit=0.5),
    _row("u2", "g2", None),
    _row("u3", "g1", 9),
]


def _json_form(row: Attribution) -> dict:
    """The row as the sink's value holds it: timestamps as ISO-8601 UTC text."""
    record = row.to_record()
    record["goal_ts"] = ms_to_iso(row.goal_ts)
    record["impression_ts"] = None if row.impression_ts is None else ms_to_iso(row.impression_ts)
    return record


def _spark_form(row: Attribution) -> dict:
    record = row.to_record()
    record["goal_ts"] = ms_to_datetime(row.goal_ts)
    record["impression_ts"] = (None if row.impression_ts is None
                               else ms_to_datetime(row.impression_ts))
    return record


def _key(record: dict) -> tuple:
    return tuple(json.dumps(record[c]) for c in ("user_id", "goal_event_id", "model",
                                                   "impression_event_id", "revision", "sign"))


def _new_topic(bootstrap: str, partitions: int = 3) -> str:
    topic = f"attributions-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


@pytest.fixture
def rows_dir(spark, tmp_path):
    """The rows as a Parquet file in the output schema, for a file stream to read."""
    directory = tmp_path / "rows"
    (spark.createDataFrame([_spark_form(r) for r in ROWS], spark_struct(OUTPUT_SCHEMA))
     .coalesce(1).write.parquet(str(directory)))
    return directory


def _run_stream(spark, sink: KafkaSink, rows_dir, checkpoint) -> None:
    rows = spark.readStream.schema(spark_struct(OUTPUT_SCHEMA)).parquet(str(rows_dir))
    query = sink.start_stream(rows, str(checkpoint), "available-now", "kafka_sink_test")
    query.awaitTermination()
    assert query.exception() is None


def test_a_streaming_query_writes_every_row_once_keyed_by_the_row(spark, kafka_bootstrap,
                                                                  rows_dir, tmp_path):
    topic = _new_topic(kafka_bootstrap)
    sink = SINKS["kafka"](kafka_bootstrap, topic)
    _run_stream(spark, sink, rows_dir, tmp_path / "checkpoint")

    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == len(ROWS)
    assert sorted(read_changelog(kafka_bootstrap, topic), key=_key) == sorted(
        map(_json_form, ROWS), key=_key)
    # A goal's records share a partition, in the order written: a retraction before its
    # replacement.
    values = [(r.partition, json.loads(r.value)) for r in records]
    goals: dict = {}
    for partition, value in values:
        goals.setdefault((value["user_id"], value["goal_event_id"]), set()).add(partition)
    assert all(len(partitions) == 1 for partitions in goals.values()), goals
    assert [(v["revision"], v["sign"]) for _, v in values
            if (v["user_id"], v["goal_event_id"], v["model"]) == ("u1", "g1", "last_touch")] == [
        (0, 1), (0, -1), (1, 1)]


def test_a_micro_batch_written_twice_is_read_once(spark, kafka_bootstrap, rows_dir, tmp_path):
    topic = _new_topic(kafka_bootstrap)
    sink = KafkaSink(kafka_bootstrap, topic)
    checkpoint = tmp_path / "checkpoint"
    _run_stream(spark, sink, rows_dir, checkpoint)
    # A crash after the micro-batch's records reached the topic, before its commit was recorded.
    commits = batch_files(checkpoint / "commits")
    last = max(commits)
    commits[last].unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)

    _run_stream(spark, sink, rows_dir, checkpoint)

    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == 2 * len(ROWS)
    assert set(Counter(r.key for r in records).values()) == {2}
    assert sorted(read_changelog(kafka_bootstrap, topic), key=_key) == sorted(
        map(_json_form, ROWS), key=_key)


def test_each_row_has_its_own_key_and_a_used_topic_is_refused(spark, kafka_bootstrap,
                                                              tmp_path):
    topic = _new_topic(kafka_bootstrap)
    sink = KafkaSink(kafka_bootstrap, topic)
    frame = spark.createDataFrame([_spark_form(r) for r in ROWS], spark_struct(OUTPUT_SCHEMA))
    sink.write_batch(frame, REPLACE_ALL)

    records = read_topic(kafka_bootstrap, topic)
    keys = [r.key for r in records]
    assert len(set(keys)) == len(ROWS) == len(keys)
    by_value = {_key(json.loads(r.value)): r.key for r in records}
    organic = by_value[_key(_json_form(ROWS[5]))]
    assert organic == ('{"user_id":"u2","goal_event_id":"g2","model":"last_touch",'
                       '"impression_event_id":null,"revision":0,"sign":1}')
    retraction, replacement = (by_value[_key(_json_form(ROWS[i]))] for i in (1, 2))
    assert json.loads(retraction)["sign"] == -1 and json.loads(replacement)["revision"] == 1
    assert [json.loads(r.value) for r in records if r.key == replacement] == [
        _json_form(ROWS[2])]

    with pytest.raises(TopicRefused, match=f"topic {topic} holds 7 records: a batch run"):
        sink.write_batch(frame, REPLACE_ALL)
    with pytest.raises(TopicRefused, match="cannot replace the rows of some goal dates"):
        sink.write_batch(frame, REPLACE_DATES)
    (tmp_path / "empty").mkdir()
    stream = spark.readStream.schema(spark_struct(OUTPUT_SCHEMA)).parquet(str(tmp_path / "empty"))
    with pytest.raises(TopicRefused, match="holds 7 records and checkpoint .* is new"):
        sink.start_stream(stream, str(tmp_path / "new-checkpoint"), "available-now", "refused")
    missing = KafkaSink(kafka_bootstrap, f"{topic}-missing")
    with pytest.raises(TopicRefused, match=f"topic {topic}-missing does not exist at "):
        missing.write_batch(frame, REPLACE_ALL)
    assert len(read_topic(kafka_bootstrap, topic)) == len(ROWS)


def test_check_names_an_empty_setting():
    assert KafkaSink(" ", "t").check() == ("--kafka-bootstrap-servers is empty; give "
                                           "HOST:PORT[,...]")
    assert KafkaSink("h:9092", "").check() == ("--output-topic is empty; give the name of an "
                                               "existing topic")
    assert KafkaSink("h:9092", "t").check() is None
    assert KafkaSink.exactly_once is False
