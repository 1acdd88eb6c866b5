"""``make run-kafka``: the main job end to end from and to Kafka topics, on ``make run``'s example.

Generates the example of ``jobs/example.py``, starts a local Kafka broker (``kafka-local``)
under ``<out>/broker``, produces the example's records to the topic ``events`` (3 partitions,
keyed by user, in arrival order), creates the output topic ``attributions`` (3 partitions), and
streams the events through ``jobs/attribution_job.py`` with ``available-now`` and about one
generated file's worth of records per micro-batch. It prints the job's report, reads the output
topic by the consumer's rule (``read_changelog``) and checks its rows against the batch oracle.
The broker is stopped at the end, however the run ends. The dead letter and the late records
are directories under ``<out>``.

Records can be late here, though the same example read as files has none. The partitions are
read side by side: Spark gives each micro-batch a share of every partition's backlog, so records
of different partitions (different users) reach the job in another order than the one they were
produced in, and a partition ahead in event time moves the watermark past records another has
not delivered yet (the fewer the users, the further the partitions' event times drift apart).
The job drops those, and its late-record audit finds them again by re-reading the committed
offset ranges from the broker. The oracle is therefore run over the records the topic holds
minus those the late-record output lists, and the job's rows must equal its rows exactly.
"""
from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

from attribution.events import Event, parse_event
from attribution.oracle import attribute_batch
from attribution.spark.kafka_output import changelog_rows, read_changelog
from attribution.spark.late_records import read_late_records
from commandline.exits import Failure, report_failure
from generators.dataset import GenerationResult
from generators.params import KafkaTarget
from generators.topic import TopicWriter, ensure_topic
from generators.writers import file_record_values
from jobs import attribution_job
from jobs.example import example_parser, generate_example, matches_oracle
from jvm import kafka_local

EVENTS_TOPIC = "events"
OUTPUT_TOPIC = "attributions"
PARTITIONS = 3
FORMAT = "json"  # each record's value: one line of the JSON event files (the job's default)


def produce_events(dataset: GenerationResult, bootstrap: str) -> list[Event]:
    """Produce the dataset's event files, in arrival order, to ``EVENTS_TOPIC`` (created with
    ``PARTITIONS`` partitions).

    :param dataset: the generated dataset, in ``FORMAT``.
    :param bootstrap: the broker's ``HOST:PORT``.
    :returns: the events produced, one per record.
    """
    records = [pair for path in dataset.event_files for pair in file_record_values(path, FORMAT)]
    with TopicWriter(KafkaTarget(bootstrap, EVENTS_TOPIC, kafka_partitions=PARTITIONS),
                     FORMAT) as writer:
        writer.send(records)
    return [parse_event(json.loads(value)) for _, value in records]


def create_output_topic(bootstrap: str) -> None:
    """Create ``OUTPUT_TOPIC`` with ``PARTITIONS`` partitions: the job writes only to a topic
    that exists.

    :param bootstrap: the broker's ``HOST:PORT``.
    :raises Failure: the broker refused it.
    """
    ensure_topic(KafkaTarget(bootstrap, OUTPUT_TOPIC, kafka_partitions=PARTITIONS))


def not_late(events: list[Event], late_dir: Path) -> tuple[list[Event], int]:
    """The events without the records the late-record output lists (each listed record removes
    one copy: a redelivered record can be late once and on time once).

    :param events: every event the topic holds.
    :param late_dir: the job's late-record output.
    :returns: the events left, and how many were late.
    """
    late = Counter(parse_event(json.loads(raw)) for raw in
                   read_late_records(str(late_dir)).column("raw_record").to_pylist())
    left = Counter(events)
    left.subtract(late)
    if any(count < 0 for count in left.values()):
        raise ValueError(f"{late_dir} lists records the topic does not hold")
    return list(left.elements()), sum(late.values())


def run(args, out: Path, broker_dir: Path) -> int:
    """Generate, start the broker, produce, run the job and compare (the broker is left
    running: ``main`` stops it).

    :param args: the parsed options.
    :param out: the working directory.
    :param broker_dir: the broker's directory.
    :returns: the job's exit code, or 1 when its output differs from the oracle's.
    """
    dataset = generate_example(args.users, out / "data", truth=False, files=args.files)
    print(f"starting a local Kafka broker under {broker_dir} ...", file=sys.stderr, flush=True)
    bootstrap = kafka_local.start(str(broker_dir))
    print(f"  bootstrap.servers={bootstrap}", file=sys.stderr)
    events = produce_events(dataset, bootstrap)
    print(f"produced {len(events)} records to topic {EVENTS_TOPIC} ({PARTITIONS} partitions)",
          file=sys.stderr)
    create_output_topic(bootstrap)
    print(f"created the output topic {OUTPUT_TOPIC} ({PARTITIONS} partitions)", file=sys.stderr)

    late_dir = out / "late-records"
    per_trigger = max(1, len(events) // dataset.dataset.params.files)
    job_args = ["--kafka-bootstrap-servers", bootstrap, "--kafka-topics", EVENTS_TOPIC,
                "--format", FORMAT, "--output-topic", OUTPUT_TOPIC,
                "--checkpoint", str(out / "checkpoint"), "--dead-letter", str(out / "dead-letter"),
                "--late-records", str(late_dir), "--max-offsets-per-trigger", str(per_trigger)]
    if args.backend:
        job_args += ["--backend", args.backend]
    status = attribution_job.main(job_args)

    print(f"reading topic {OUTPUT_TOPIC} by the consumer's rule ...", file=sys.stderr)
    produced = changelog_rows(read_changelog(bootstrap, OUTPUT_TOPIC, timeout_s=60))
    kept, late = not_late(events, late_dir)
    same = matches_oracle(produced, attribute_batch(kept),  # the job's default rules
                          f"from the oracle over the {len(kept)} records not late; {late} late "
                          f"records in {late_dir}")
    return status if same else 1


def main(argv=None) -> int:
    """Run the job from and to Kafka topics on a generated example and check it against the
    batch oracle; the broker is stopped whatever happens.

    :param argv: the arguments (default: the command line).
    :returns: the job's exit code, 1 when its output differs from the oracle's, or the code of
        a failure to start the broker, to produce or to create the output topic.
    """
    args = example_parser(__doc__, "out/example-kafka").parse_args(argv)
    out = Path(args.out)
    broker_dir = out / "broker"
    kafka_local.stop(str(broker_dir))  # a broker an earlier run left, before its files go
    if out.exists():
        shutil.rmtree(out)
    try:
        return run(args, out, broker_dir)
    except Failure as failure:
        return report_failure(failure)
    finally:
        if kafka_local.BrokerDir(str(broker_dir)).pid() is not None:
            print(f"stopping the broker under {broker_dir} ...", file=sys.stderr, flush=True)
            kafka_local.stop(str(broker_dir))


if __name__ == "__main__":
    sys.exit(main())
