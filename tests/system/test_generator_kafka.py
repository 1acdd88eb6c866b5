"""The generator produces to Kafka (the suite's broker): what a topic holds is what the generator
writes as files for the same seed, keyed by user_id, each user's records in their arrival order
within one partition; values are the JSON files' lines or Avro binary in the event schema."""
from __future__ import annotations

import io
import json
import uuid
from collections import defaultdict

import fastavro
import pytest
from confluent_kafka import Consumer, TopicPartition

from attribution.schema import EVENT_SCHEMA
from attribution.spark.files import data_files
from commandline.exits import ExitCode
from generators.cli import main
from generators.layout import EVENTS_DIR
from generators.load import run_load
from generators.params import GeneratorParams, KafkaTarget
from generators.stream import Position, stream_for
from generators.topic import TopicWriter
from generators.writers import file_record_values, id_array

_SCHEMA = fastavro.parse_schema(EVENT_SCHEMA)


def _topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _consume_all(bootstrap: str, topic: str) -> dict:
    """Every record of ``topic`` as ``{partition: [(key, value), ...]}``, in offset order,
    read up to each partition's end offset at the time of the call."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: dict = defaultdict(list)
        left = sum(ends.values())
        while left:
            message = consumer.poll(30)
            assert message is not None, f"{left} records of {topic} never arrived"
            assert message.error() is None, message.error()
            records[message.partition()].append((message.key().decode(), message.value()))
            left -= 1
        return {p: records[p] for p in partitions}
    finally:
        consumer.close()


def _decoded(fmt: str, value: bytes) -> dict:
    if fmt == "json":
        return json.loads(value)
    return fastavro.schemaless_reader(io.BytesIO(value), _SCHEMA)


def _assert_topic_holds_the_files(topic_records: dict, files: list, fmt: str) -> None:
    """The topic's records are the files' records: the same multiset of values, each keyed by
    its user (a heartbeat by its id), and each partition holding exactly the records of its
    keys, in file order."""
    in_files = [pair for f in files for pair in file_record_values(f, fmt)]
    in_topic = [pair for records in topic_records.values() for pair in records]
    assert len(in_topic) == len(in_files)
    assert sorted(in_topic) == sorted(in_files)
    for key, value in in_topic:
        record = _decoded(fmt, value)
        assert key == (record["user_id"] or record["event_id"])
    for records in topic_records.values():
        keys = {key for key, _ in records}
        assert records == [pair for pair in in_files if pair[0] in keys]


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_generate_produces_the_datasets_records_to_a_topic(kafka_bootstrap, tmp_path, fmt):
    topic = _topic_name(f"generated-{fmt}")
    out = tmp_path / "ds"
    assert main(["generate", "--out", str(out), "--users", "40", "--files", "5", "--format", fmt,
                 "--redelivery-rate", "0.05", "--late-fraction", "0.02", "--heartbeat",
                 "--no-plot", "--quiet", "--seed", "7",
                 "--kafka-bootstrap-servers", kafka_bootstrap, "--topic", topic]) == 0
    assert (out / "truth" / "attributions.parquet").exists()
    records = _consume_all(kafka_bootstrap, topic)
    assert len(records) == 3  # --kafka-partitions' default for a new topic
    assert all(records.values())
    _assert_topic_holds_the_files(records, data_files(out / "events"), fmt)


def test_redelivered_copies_and_users_keep_their_partition(kafka_bootstrap, tmp_path):
    topic = _topic_name("keyed")
    out = tmp_path / "ds"
    assert main(["generate", "--out", str(out), "--users", "30", "--files", "3",
                 "--redelivery-rate", "0.2", "--no-plot", "--no-truth", "--quiet",
                 "--kafka-bootstrap-servers", kafka_bootstrap, "--topic", topic]) == 0
    partition_of = defaultdict(set)
    copies = defaultdict(int)
    for partition, records in _consume_all(kafka_bootstrap, topic).items():
        for key, value in records:
            partition_of[key].add(partition)
            copies[json.loads(value)["event_id"]] += 1
    assert all(len(p) == 1 for p in partition_of.values())  # one user, one partition
    assert max(copies.values()) == 2  # a redelivered event is in the topic twice


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_load_mode_produces_what_it_writes_as_files(kafka_bootstrap, tmp_path, fmt):
    """The same stream, clock and heartbeats: once as files, once to a topic."""
    params = GeneratorParams(users=200, sessions_per_block=60, format=fmt,
                             late_fraction=0.02, redelivery_rate=0.05)

    def run(out, topic=None):
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        # Binary fractions: the fake clock adds them up exactly.
        return run_load(params, out, rate=100, duration_s=4.0, file_interval_s=2.0,
                        sleep=sleep, clock=lambda: now[0], idle_heartbeat_s=0.5,
                        final_heartbeat=True, topic=topic)

    as_files = run(tmp_path / "files")
    name = _topic_name(f"load-{fmt}")
    with TopicWriter(KafkaTarget(kafka_bootstrap, name, kafka_partitions=3), fmt) as writer:
        to_topic = run(tmp_path / "state", writer)
    assert (to_topic.records, to_topic.files, to_topic.heartbeats) == \
        (as_files.records, as_files.files, as_files.heartbeats)
    assert to_topic.heartbeats > 1 and to_topic.topic == name
    # Only the stream's state there, no event file.
    assert not (tmp_path / "state" / EVENTS_DIR).exists() and not data_files(tmp_path / "state")
    _assert_topic_holds_the_files(_consume_all(kafka_bootstrap, name),
                                  data_files(tmp_path / "files" / EVENTS_DIR), fmt)


def test_the_stream_command_produces_at_a_rate_and_resumes(kafka_bootstrap, tmp_path, capsys):
    topic = _topic_name("stream-cli")
    state = tmp_path / "state"
    common = ["stream", "--out", str(state), "--rate", "200", "--duration", "1",
              "--file-interval", "0.5", "--users", "100", "--sessions-per-block", "40",
              "--kafka-bootstrap-servers", kafka_bootstrap, "--topic", topic, "--quiet"]
    assert main(common) == 0
    first = capsys.readouterr().out
    assert f"batches to topic {topic}" in first
    assert main([*common, "--resume"]) == 0
    written = json.loads((state / "_streamgen_state.json").read_text())["position"]["events"]
    in_topic = [json.loads(v)["event_id"] for records in _consume_all(kafka_bootstrap, topic)
                .values() for _, v in records]
    expected, _ = stream_for(GeneratorParams(users=100, sessions_per_block=40)).read(
        Position(), written)
    assert sorted(in_topic) == sorted(id_array(expected.seq).to_pylist())
    with pytest.raises(SystemExit) as caught:  # a second stream into the same state: refused
        main(common)
    assert caught.value.code == ExitCode.USAGE
    assert "already holds the state of a stream" in capsys.readouterr().err


def test_bad_kafka_options_fail_with_one_line(kafka_bootstrap, tmp_path, capsys):
    out = str(tmp_path / "ds")
    assert main(["generate", "--out", out, "--format", "parquet", "--users", "5", "--quiet",
                 "--kafka-bootstrap-servers", kafka_bootstrap, "--topic", "t"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: --format parquet cannot be a Kafka record's value")
    with pytest.raises(SystemExit) as caught:
        main(["generate", "--out", out, "--kafka-bootstrap-servers", kafka_bootstrap])
    assert caught.value.code == ExitCode.USAGE
    assert "--kafka-bootstrap-servers needs --topic T" in capsys.readouterr().err
