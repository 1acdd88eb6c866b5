"""Reading attribution output from a Kafka topic (``sinks.KafkaSink``) without Spark, by the
consumer's rule.

The sink writes at least once: a micro-batch that a crash interrupts after its records reached
the topic and before the query committed it is written again on restart, so the topic can hold a
row twice or more. Every copy carries the same key, which identifies the row
(``sinks.kafka.CHANGELOG_KEY``), and the same value. **The consumer's rule**: read each
partition in offset order and drop a record whose key was already seen; the first one wins.
What is left is the changelog exactly as the file sink's committed output holds it, each row
once, ready to fold or to merge (docs/reading-output.md).

Records of one goal are in one partition, in the order the job wrote them; a repeated record
therefore always follows its first copy in the same partition.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Iterable, Mapping, NamedTuple, Optional


class TopicRecord(NamedTuple):
    """One record of a topic: where it is, its key and its value as text (UTF-8)."""

    partition: int
    offset: int
    key: Optional[str]
    value: Optional[str]


def _text(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else data.decode("utf-8")


def read_topic(bootstrap_servers: str, topic: str, timeout_s: float = 30.0,
               config: Optional[Mapping[str, object]] = None) -> list[TopicRecord]:
    """Every record of ``topic``, from the start of each partition to its end at the time of the
    call (its high watermark), partition by partition in offset order. Repeated records are
    kept: ``read_changelog`` applies the consumer's rule.

    :param bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
    :param topic: the topic.
    :param timeout_s: how long the whole read may take, in seconds.
    :param config: more settings of the consumer (librdkafka's names, e.g.
        ``security.protocol``); no consumer group is joined and no offset is committed.
    :raises ValueError: the topic does not exist.
    :raises TimeoutError: the end of some partition was not reached within ``timeout_s``.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s

    def remaining() -> float:
        return max(0.0, deadline - time.monotonic())

    consumer = Consumer({"bootstrap.servers": bootstrap_servers,
                         "group.id": f"read-topic-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "log_level": 0, **(config or {})})
    try:
        described = consumer.list_topics(topic, timeout=remaining()).topics.get(topic)
        if described is None or described.error is not None:
            raise ValueError(f"topic {topic} does not exist at {bootstrap_servers}")
        ends, starts = {}, {}
        for partition in sorted(described.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=remaining())
            if high > low:
                starts[partition], ends[partition] = low, high
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in starts])
        records: dict[int, list[TopicRecord]] = {p: [] for p in ends}
        pending = set(ends)
        while pending:
            if remaining() <= 0:
                raise TimeoutError(
                    f"topic {topic}: partitions {sorted(pending)} were not read to their end "
                    f"within {timeout_s:g} s")
            message = consumer.poll(min(1.0, remaining()))
            if message is not None:
                if message.error() is not None:
                    raise KafkaException(message.error())
                partition, offset = message.partition(), message.offset()
                if partition in pending and offset < ends[partition]:
                    records[partition].append(TopicRecord(partition, offset, _text(message.key()),
                                                          _text(message.value())))
            # The position, not the last offset seen, says a partition is done: it moves past
            # offsets that hold no record for a consumer (transaction markers, compacted ones).
            positions = consumer.position([TopicPartition(topic, p) for p in sorted(pending)])
            done = [tp for tp in positions if tp.offset >= ends[tp.partition]]
            if done:
                consumer.pause(done)
                pending -= {tp.partition for tp in done}
        return [record for partition in sorted(records) for record in records[partition]]
    finally:
        consumer.close()


def first_of_each_key(records: Iterable[TopicRecord]) -> list[TopicRecord]:
    """The consumer's rule: ``records`` without those whose key an earlier one has.

    :param records: records in the order they are to be judged (each partition in offset
        order, as ``read_topic`` returns them).
    """
    seen: set = set()
    first = []
    for record in records:
        if record.key not in seen:
            seen.add(record.key)
            first.append(record)
    return first


def read_changelog(bootstrap_servers: str, topic: str, timeout_s: float = 30.0,
                   config: Optional[Mapping[str, object]] = None) -> list[dict]:
    """The attribution rows a ``KafkaSink`` wrote to ``topic``, each once: the topic read from
    its start to its current end (``read_topic``), every record whose key was already seen
    dropped (the first one wins), each value parsed from JSON.

    Rows are dicts of the output columns; timestamps are ISO-8601 UTC text with milliseconds
    (``2024-01-01T12:00:00.000Z``, ``attribution.events.ts_to_ms`` converts them), ``trail`` a
    list. They come partition by partition, each partition's in the order written.

    :param bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
    :param topic: the topic.
    :param timeout_s: how long the whole read may take, in seconds.
    :param config: more settings of the consumer (librdkafka's names).
    :raises ValueError: the topic does not exist.
    :raises TimeoutError: the end of some partition was not reached within ``timeout_s``.
    """
    records = read_topic(bootstrap_servers, topic, timeout_s, config)
    return [json.loads(record.value) for record in first_of_each_key(records)]


def changelog_rows(records: Iterable[Mapping]) -> list:
    """``read_changelog``'s rows as the core's ``Attribution`` rows (timestamps in epoch
    milliseconds, ``trail`` a tuple), as ``output.read_attribution_rows`` gives a directory's.

    :param records: rows as ``read_changelog`` returns them.
    """
    from ..events import ts_to_ms
    from ..rows import Attribution

    rows = []
    for record in records:
        fields = {name: record[name] for name in Attribution._fields if name in record}
        fields["goal_ts"] = ts_to_ms(record["goal_ts"])
        if record.get("impression_ts") is not None:
            fields["impression_ts"] = ts_to_ms(record["impression_ts"])
        fields["trail"] = tuple(record["trail"])
        rows.append(Attribution(**fields))
    return rows
