"""Both jobs on Kafka input, against the suite's real local broker (``kafka-local``): a generated
dataset with disorder, late records and redeliveries, produced to a topic of 3 partitions, gives
row for row the output of the same dataset read as files, in stream mode (both backends), in
batch mode and in the join job; bad records on the topic are
dead-lettered with their topic, partition and offset; a topic that does not exist is one line
before Spark starts.

Each stream run takes its input in two steps, the same for files and topic: the first half of
the dataset's files (staged, or produced), an ``available-now`` run, the second half, a second
run on the same checkpoint. The second half's records behind the first run's watermark are
dropped the same way from both inputs, so the comparison covers late data, not just decoding.
"""
from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from attribution.oracle import sort_key
from attribution.spark.files import data_files
from attribution.spark.output import read_attribution_rows
from commandline.exits import ExitCode
from generators.params import KafkaTarget
from generators.topic import TopicWriter
from generators.writers import file_record_values
from support.commands import error_line
from support.datasets import generate_late_dataset, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT

DELAY = "10 minutes"
BACKENDS = {"applyInPandasWithState": [], "transformWithState": ["--backend",
                                                                "transformWithState"]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The generated dataset's files in arrival order, and how many the late ones are."""
    root = tmp_path_factory.mktemp("kafka-dataset")
    result = generate_late_dataset(root, users=40, seed=23, files=4, total_span="4 days",
                                   redelivery_rate=0.05, watermark_delay=DELAY)
    assert result.manifest["disorder"]["late_event_ids"], "the dataset must hold late records"
    return data_files(result.events_dir)


def _topic() -> str:
    return f"events-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, files, fmt: str = "json") -> None:
    with TopicWriter(KafkaTarget(bootstrap, topic, kafka_partitions=3), fmt) as writer:
        for f in files:
            writer.send(file_record_values(f, fmt))


def _halves(files):
    return files[:len(files) // 2], files[len(files) // 2:]


def _stream_both_ways(tmp_path, files, bootstrap, run_once):
    """Run ``run_once(input_options, name)`` twice per input, the input growing in between;
    returns the names' output directories."""
    first, second = _halves(files)
    topic = _topic()
    kafka = ["--kafka-bootstrap-servers", bootstrap, "--kafka-topics", topic]
    events = tmp_path / "events"
    for step, part in enumerate((first, second)):
        stage_in_arrival_order(part, events, 1_780_000_000 + 100 * step)
        _produce(bootstrap, topic, part)
        run_once(["--events", str(events)], "files")
        run_once(kafka, "kafka")
    return tmp_path / "files", tmp_path / "kafka"


def _attribution(spark, tmp_path, *options):
    from jobs.attribution_job import parse_args, run

    def run_once(input_options, name):
        report = run(spark, parse_args([
            *input_options, "--output", str(tmp_path / name / "out"),
            "--checkpoint", str(tmp_path / name / "cp"), "--watermark-delay", DELAY,
            "--models", "last_touch,linear", "--quiet", *PARQUET_OUTPUT, *options]))
        reports.setdefault(name, []).append(report)

    reports: dict = {}
    return run_once, reports


def _rows(path: Path) -> list:
    return sorted(read_attribution_rows(path), key=sort_key)


def _late_records(path: Path) -> Counter:
    from attribution.spark.late_records import read_late_records

    records = read_late_records(path).column("raw_record").to_pylist()
    return Counter(json.loads(r)["event_id"] for r in records)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_stream_from_a_topic_equals_the_stream_from_the_files(spark, tmp_path, dataset,
                                                                  kafka_bootstrap, backend):
    run_once, reports = _attribution(spark, tmp_path, *BACKENDS[backend])
    files, kafka = _stream_both_ways(tmp_path, dataset, kafka_bootstrap, run_once)
    from_files = _rows(files / "out")
    assert len(from_files) > 50
    assert _rows(kafka / "out") == from_files
    dropped = [r.late_rows for r in reports["files"]]
    assert dropped[1] > 0, "the second step must drop late records"  # what the test is about
    assert [r.late_rows for r in reports["kafka"]] == dropped
    assert [r.input_rows for r in reports["kafka"]] == [r.input_rows for r in reports["files"]]
    assert _late_records(kafka / "out-late") == _late_records(files / "out-late")


def test_the_batch_from_a_topic_equals_the_batch_from_the_files(spark, tmp_path, dataset,
                                                                kafka_bootstrap):
    from jobs.attribution_job import parse_args, run

    topic = _topic()
    _produce(kafka_bootstrap, topic, dataset)
    events = stage_in_arrival_order(dataset, tmp_path / "events")
    outputs = {}
    for name, input_options in {"files": ["--events", str(events)],
                                "kafka": ["--kafka-bootstrap-servers", kafka_bootstrap,
                                          "--kafka-topics", topic]}.items():
        outputs[name] = tmp_path / name
        report = run(spark, parse_args([*input_options, "--mode", "batch", "--output",
                                        str(outputs[name]), "--models", "last_touch,linear",
                                        "--quiet"]))
        assert report.extra["invalid"] == 0
    from_files = _rows(outputs["files"])
    assert len(from_files) > 50 and _rows(outputs["kafka"]) == from_files


# The second tier: make test reads topics in the attribution job on both backends (above) and
# under SIGKILL (crash run B).
@pytest.mark.slow
def test_the_join_job_from_a_topic_equals_the_join_job_from_the_files(spark, tmp_path, dataset,
                                                                      kafka_bootstrap):
    from jobs import join_job

    def run_once(input_options, name):
        join_job.run(spark, join_job.parse_args([
            *input_options, "--output", str(tmp_path / name / "out"),
            *PARQUET_OUTPUT,
            "--checkpoint", str(tmp_path / name / "cp"), "--max-delay", "3 hours",
            "--quiet"]))

    files, kafka = _stream_both_ways(tmp_path, dataset, kafka_bootstrap, run_once)

    def joined(path):
        return Counter(tuple(sorted(r.asDict().items()))
                       for r in spark.read.parquet(str(path / "out")).collect())

    from_files = joined(files)
    assert sum(from_files.values()) > 10 and joined(kafka) == from_files


def test_bad_records_on_a_topic_are_dead_lettered_with_topic_partition_and_offset(
        spark, tmp_path, kafka_bootstrap):
    from jobs.attribution_job import parse_args, run

    topic = _topic()
    now = dt.datetime.now(dt.timezone.utc)
    good = {"event_id": "v1", "user_id": "u1", "event_type": "visit",
            "ts": "2024-01-01T11:59:00Z", "url": "http://shop/thing", "is_goal": True,
            "value": 12.5}
    far = (now + dt.timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    bad = {b"not json": "malformed JSON",
           json.dumps({k: v for k, v in good.items() if k != "user_id"}).encode():
               "missing user_id",
           json.dumps(good).replace("12.5", "1e400").encode():
               "value must be a finite number, got inf",
           json.dumps({**good, "event_id": "far", "ts": far}).encode():
               "more than 1 day ahead of its Kafka timestamp"}
    values = [json.dumps(good).encode(), *bad,
              json.dumps({**good, "event_id": "v2", "ts": "2024-01-01T12:00:00Z"}).encode()]
    with TopicWriter(KafkaTarget(kafka_bootstrap, topic, kafka_partitions=3), "json") as writer:
        writer.send(("u1", v) for v in values)  # one key: one partition, offsets in order
    report = run(spark, parse_args([
        "--kafka-bootstrap-servers", kafka_bootstrap, "--kafka-topics", topic,
        "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"), "--quiet"]))
    assert (report.input_rows, report.extra["invalid"]) == (6, 4)  # the 2 good ones are used
    dead = sorted(spark.read.parquet(str(tmp_path / "out-dead-letter")).collect(),
                  key=lambda r: r.source_offset)
    assert [r.source_offset for r in dead] == [1, 2, 3, 4]
    assert {r.source_topic for r in dead} == {topic}
    assert len({r.source_partition for r in dead}) == 1
    for row, (value, reason) in zip(dead, bad.items()):
        assert row.raw_record == value.decode() and reason in row.reason, (row, reason)


def test_a_topic_that_does_not_exist_is_one_line_before_spark(tmp_path, kafka_bootstrap, capsys):
    from jobs import attribution_job

    code = attribution_job.main(["--kafka-bootstrap-servers", kafka_bootstrap,
                                 "--kafka-topics", "no-such-topic", "--output",
                                 str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"),
                                 "--log-file", str(tmp_path / "spark.log")])
    assert code == ExitCode.INPUT
    line = error_line(capsys.readouterr().err)
    assert f"Kafka topic(s) no-such-topic do not exist at {kafka_bootstrap}" in line
    assert not (tmp_path / "out").exists()


def _topic_run(kafka_bootstrap: str, tmp_path: Path, input_topic: str, output_topic: str):
    from jobs import attribution_job

    return attribution_job.main(["--kafka-bootstrap-servers", kafka_bootstrap,
                                 "--kafka-topics", input_topic, "--output-topic", output_topic,
                                 "--checkpoint", str(tmp_path / "cp"),
                                 "--log-file", str(tmp_path / "spark.log")])


def test_output_topic_problems_are_one_line_before_spark(tmp_path, kafka_bootstrap, capsys,
                                                         subtests):
    """A missing output topic, and one that holds records while the checkpoint is new, are
    refused by the Python Kafka client before Spark starts (exit code 4)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    events, held = _topic(), _topic()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for name, done in admin.create_topics([NewTopic(t, 2, 1) for t in (events, held)]).items():
        done.result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(3):
        producer.produce(held, key=b"k", value=str(n).encode())
    assert producer.flush(30) == 0
    with subtests.test(msg="a missing output topic"):
        assert _topic_run(kafka_bootstrap, tmp_path, events, "no-such-output") == ExitCode.OUTPUT
        captured = capsys.readouterr()
        assert ("topic no-such-output does not exist at " + kafka_bootstrap + ": create it first"
                in error_line(captured.err))
        assert "starting Spark" not in captured.err
    with subtests.test(msg="an output topic with records, for a new checkpoint"):
        assert _topic_run(kafka_bootstrap, tmp_path, events, held) == ExitCode.OUTPUT
        captured = capsys.readouterr()
        assert (f"topic {held} holds 3 records and checkpoint {tmp_path / 'cp'} is new"
                in error_line(captured.err))
        assert "starting Spark" not in captured.err
