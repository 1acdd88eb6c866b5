"""Producing generated events to a Kafka topic, for ``streamgen generate|stream
--kafka-bootstrap-servers ... --topic T``.

Records are ``writers.record_values`` pairs: keyed by ``user_id``, so that a user's events keep
their order within one partition, and valued with one event each, as a line of the JSON files or
Avro binary in the event schema. The partitioner is the Java client's (murmur2), so a user's
records land in the partition a Java producer would choose; the producer is idempotent, so its
own retries neither reorder nor repeat records. Record timestamps are the producer's clock (the
arrival time; event time is the value's ``ts``), which also keeps the broker's time-based
retention from deleting a historical dataset on arrival.

A topic that does not exist is created with the asked number of partitions and the broker's
default replication factor.
"""
from __future__ import annotations

from typing import Iterable, Optional

from commandline.exits import ExitCode, Failure

from .params import TOPIC_FORMATS, KafkaTarget

CONNECT_TIMEOUT_S = 30.0


def ensure_topic(target: KafkaTarget) -> None:
    """Create ``target.topic`` with ``target.kafka_partitions`` partitions unless the cluster
    has it (an existing topic is used as it is).

    :param target: the bootstrap servers, the topic and the partitions of a new topic.
    :raises Failure: no broker answered, or the topic could not be created.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    servers = target.kafka_bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers, "log_level": 0})
    try:
        topics = admin.list_topics(timeout=CONNECT_TIMEOUT_S).topics
    except KafkaException:
        raise Failure(ExitCode.OUTPUT, f"no Kafka broker answered at {servers} within "
                                       f"{CONNECT_TIMEOUT_S:g} s; check "
                                       f"--kafka-bootstrap-servers (a local one: "
                                       f"'kafka-local start --dir DIR')") from None
    if target.topic in topics:
        return
    created = admin.create_topics([NewTopic(target.topic, target.kafka_partitions, -1)])
    try:
        created[target.topic].result(CONNECT_TIMEOUT_S)
    except KafkaException as err:
        if "TOPIC_ALREADY_EXISTS" not in str(err):  # created meanwhile by someone else
            raise Failure(ExitCode.OUTPUT, f"cannot create topic {target.topic} at {servers}: "
                                           f"{err.args[0].str()}") from None


class TopicWriter:
    """A producer to one topic, failing with one line when the broker is unreachable or a
    record is refused.

    :param target: the bootstrap servers, the topic and the partitions of a new topic.
    :param fmt: the values' format (``json`` or ``avro``).
    """

    def __init__(self, target: KafkaTarget, fmt: str):
        from confluent_kafka import Producer

        if fmt not in TOPIC_FORMATS:
            raise Failure(ExitCode.USAGE, f"--format {fmt} cannot be a Kafka record's value: one "
                                          f"event per record is {' or '.join(TOPIC_FORMATS)}")
        self.target = target
        self.topic = target.topic
        ensure_topic(target)
        self._error: Optional[str] = None
        self._producer = Producer({
            "bootstrap.servers": target.kafka_bootstrap_servers,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 20,
            "log_level": 3,
        })

    def _delivered(self, err, _msg) -> None:
        if err is not None and self._error is None:
            self._error = err.str()

    def send(self, records: Iterable[tuple[str, bytes]]) -> int:
        """Queue ``(key, value)`` records in order; returns how many (``flush`` delivers them).

        :param records: the records, as ``writers.record_values`` makes them.
        """
        count = 0
        for key, value in records:
            while True:
                try:
                    self._producer.produce(self.topic, value=value, key=key,
                                           on_delivery=self._delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._producer.poll(0.1)
            count += 1
            if count % 10_000 == 0:
                self._producer.poll(0)
        return count

    def flush(self) -> None:
        """Deliver every queued record, or fail with the broker's reason."""
        left = self._producer.flush(CONNECT_TIMEOUT_S * 4)
        if self._error is None and left:
            self._error = f"{left} records still undelivered after {CONNECT_TIMEOUT_S * 4:g} s"
        if self._error is not None:
            raise Failure(ExitCode.OUTPUT, f"producing to topic {self.topic} at "
                                           f"{self.target.kafka_bootstrap_servers} failed: "
                                           f"{self._error}")

    def close(self) -> None:
        """Deliver what is queued (``flush``), then release the producer's connections."""
        try:
            self.flush()
        finally:
            self._producer.close()

    def __enter__(self) -> "TopicWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
