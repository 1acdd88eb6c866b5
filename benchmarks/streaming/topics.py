"""The Kafka input of the Kafka-source kind: one local broker per benchmark run, and each
dataset's events produced once to a topic of their own, before any timed run reads them.

The broker is ``kafka-local``'s (``jvm.kafka_local``), under the benchmark's work directory,
started when a run first asks for a topic and stopped by its process id when the benchmark
ends (``KafkaInput.close``, which the benchmark calls in a ``finally``).

A dataset's records go to its topic in the files' order, each keyed by its user id (a
heartbeat by its event id) and valued with the event's Avro binary encoding in the event schema
(the job's ``--format avro``): the typed encoding, as the files are Parquet. The topic has one
partition, so that the two sources differ in their transport and encoding only: one partition
delivers the records in the files' order, so the topic's micro-batches cut the same arrival
sequence as the files', and one Spark task reads each micro-batch, as one task reads each file.
(With several partitions, Spark's Kafka source would split each micro-batch's limit over them
in proportion to their backlog, and each micro-batch would hold another mix of the events.)
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from .console import log
from .datasets import Dataset

KAFKA_FORMAT = "avro"  # the job's --format of a Kafka value
PARTITIONS = 1


def offsets_per_trigger(dataset: Dataset, max_files_per_trigger: int) -> int:
    """The ``--max-offsets-per-trigger`` that cuts ``dataset``'s records into as many
    micro-batches as the file source makes of its files with ``max_files_per_trigger``.

    :param dataset: the dataset (its records and files, heartbeat included).
    :param max_files_per_trigger: the file source's files per micro-batch.
    """
    return math.ceil(dataset.records / math.ceil(dataset.files / max_files_per_trigger))


def file_records(path: Path) -> list[tuple[str, bytes]]:
    """The records of one of the benchmark's Parquet event files as ``(key, value)`` pairs of
    Kafka records, in file order: keyed by user id (a heartbeat by its event id), valued with
    the event's Avro binary encoding.

    :param path: a Parquet event file of the generator.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.schema import EVENT_FIELDS
    from generators.writers import avro_value

    table = pq.read_table(path, columns=list(EVENT_FIELDS))
    # Avro's timestamp-millis takes epoch milliseconds; the files hold microseconds.
    ms = pc.divide(table.column("ts").cast("int64"), 1000)
    table = table.set_column(EVENT_FIELDS.index("ts"), "ts", ms)
    return [(r["user_id"] or r["event_id"], avro_value(r)) for r in table.to_pylist()]


class KafkaInput:
    """The benchmark's broker and the topic of each dataset.

    :param directory: the broker's directory (its data, settings, log and process id).
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.bootstrap: Optional[str] = None
        self._topics: dict[Path, str] = {}

    def topic(self, dataset: Dataset) -> tuple[str, str]:
        """``(bootstrap servers, topic)`` holding ``dataset``'s records: the broker is started
        on the first call, the records produced on the first call for that dataset.

        :param dataset: the dataset to read from Kafka.
        :raises commandline.exits.Failure: the broker did not start, or refused the records.
        """
        if self.bootstrap is None:
            from jvm import kafka_local

            self.bootstrap = kafka_local.start(str(self.directory))
            log(f"started the Kafka broker at {self.bootstrap} under {self.directory}")
        if dataset.root not in self._topics:
            name = f"bench-{len(self._topics) + 1}-{dataset.label}"
            self._produce(dataset, name)
            self._topics[dataset.root] = name
        return self.bootstrap, self._topics[dataset.root]

    def _produce(self, dataset: Dataset, name: str) -> None:
        import time

        from attribution.spark.files import data_files
        from generators.params import KafkaTarget
        from generators.topic import TopicWriter

        started = time.perf_counter()
        with TopicWriter(KafkaTarget(self.bootstrap, name, kafka_partitions=PARTITIONS),
                         KAFKA_FORMAT) as writer:
            produced = sum(writer.send(file_records(f)) for f in data_files(dataset.events_dir))
        if produced != dataset.records:
            raise RuntimeError(f"produced {produced} records of {dataset.label}'s "
                               f"{dataset.records} to topic {name}")
        log(f"produced {dataset.label}: {produced:,} records to topic {name} "
            f"({time.perf_counter() - started:.1f}s)")

    def close(self) -> None:
        """Stop the broker by its recorded process id, if this benchmark started it."""
        if self.bootstrap is None:
            return
        from jvm import kafka_local

        kafka_local.stop(str(self.directory))
        self.bootstrap = None
        log(f"stopped the Kafka broker under {self.directory}")
