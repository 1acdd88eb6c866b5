"""A Kafka topic as a ``Sink``, through Spark's Kafka connector (``format("kafka")``, the
``spark-sql-kafka-0-10`` jar of the session's Spark version).

**Records.** One record per row. Its value is the row as one JSON object with every column of
the rows written (explicit ``null`` included), timestamps as ISO-8601 UTC text with milliseconds
(``2024-01-01T12:00:00.000Z``, the event files' form), arrays as JSON arrays. Its key identifies
the row: a JSON object of the key columns, in their order, with ``null`` for a null value
(distinct from any text), e.g. for an organic row of the attribution changelog::

    {"user_id":"u1","goal_event_id":"g1","model":"last_touch","impression_event_id":null,"revision":0,"sign":1}

Records are placed by the goal, not by the whole key: ``pmod(hash(user_id, goal_event_id), n)``
over the topic's ``n`` partitions, counted when a query or a batch write starts, so that a
goal's retractions and rows stay in one partition, in the order the job wrote them. (Kafka's
own key hashing would spread one goal's rows over partitions, since their keys differ.)
Partitions added to the topic while a query runs are used from its next start on.

**At least once.** Spark's Kafka sink does not commit with the query: a micro-batch that a crash
interrupts after its records reached the topic, and before the checkpoint recorded it, is written
again on restart. Replays compute the same rows, so each copy carries the same key and value;
readers drop a record whose key was already seen (``kafka_output.read_changelog``). For the
same reason a topic belongs to one query: a query on a new checkpoint, or a batch run, refuses a
topic that already holds records, whose keys it could repeat with other rows.
"""
from __future__ import annotations

import time
from typing import Mapping, Optional, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..pipeline import apply_trigger
from ..sources.kafka import python_admin
from ..storage import is_uri, location
from .base import REPLACE_ALL, REPLACE_DATES, Sink

# The columns that identify one record of the attribution changelog (semantics section 8): the
# goal, whose event_id identifies it only within its user (rule 1); the model; the credited
# impression by its own event_id (two impressions of a user can share an impression_id, never an
# event_id), null for the one organic row of a goal and model; the revision, which a retraction
# repeats from the row it cancels; and the sign, which tells the two apart. ``emit_timing`` is
# not one: all rows of one revision of a goal and model carry the same timing, and a retraction
# repeats its row's.
CHANGELOG_KEY = ("user_id", "goal_event_id", "model", "impression_event_id", "revision", "sign")
# The columns whose rows share a partition: a goal.
GOAL_COLUMNS = ("user_id", "goal_event_id")

_JSON_OPTIONS = {"ignoreNullFields": "false", "timeZone": "UTC",
                 "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"}
_ADMIN_TIMEOUT_MS = 30_000
_NEW_TOPIC_WAIT_S = 10.0  # how long a topic unknown to the broker is asked for again
_KAFKA_PREFIX = "kafka."  # Spark's prefix of the Kafka client's own settings


class TopicRefused(ValueError):
    """The topic cannot take this write; the message says why, in one line.
    ``unknown_topic``: the broker does not know the topic (yet)."""

    unknown_topic = False


class KafkaSink(Sink):
    """Records of a Kafka topic; at least once (see the module docstring).

    :param bootstrap_servers: ``HOST:PORT[,...]`` of the cluster.
    :param topic: the topic; it must exist (its partition count is a choice to make once, and
        places each goal's records).
    :param options: more options of Spark's Kafka sink, as it names them (``kafka.``-prefixed
        producer settings such as ``kafka.security.protocol``); the ``kafka.`` ones also reach
        the driver's admin client that counts partitions and records.
    :param key_columns: the columns whose values identify a row (the record's key).
    :param partition_columns: the columns whose rows share a partition.
    """

    exactly_once = False

    def __init__(self, bootstrap_servers: str, topic: str,
                 options: Optional[Mapping[str, str]] = None,
                 key_columns: Sequence[str] = CHANGELOG_KEY,
                 partition_columns: Sequence[str] = GOAL_COLUMNS):
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.options = dict(options or {})
        self.key_columns = tuple(key_columns)
        self.partition_columns = tuple(partition_columns)

    def check(self) -> Optional[str]:
        if not self.bootstrap_servers.strip():
            return "--kafka-bootstrap-servers is empty; give HOST:PORT[,...]"
        if not self.topic.strip():
            return "--output-topic is empty; give the name of an existing topic"
        return None

    def records(self, rows: DataFrame, partitions: int) -> DataFrame:
        """``rows`` as the connector's records: ``key``, ``value`` and ``partition``.

        :param rows: the rows to write (batch or streaming).
        :param partitions: the topic's partition count.
        """
        missing = [c for c in {*self.key_columns, *self.partition_columns}
                   if c not in rows.columns]
        if missing:
            raise ValueError(f"the rows lack the columns {', '.join(sorted(missing))} that key "
                             "or place their records")
        return rows.select(_json(self.key_columns).alias("key"),
                           _json(rows.columns).alias("value"),
                           F.pmod(F.hash(*self.partition_columns), F.lit(partitions))
                           .alias("partition"))

    def _topic_options(self, writer):
        writer = (writer.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
                  .option("topic", self.topic))
        for key, value in self.options.items():
            writer = writer.option(key, value)
        return writer

    def start_stream(self, rows, checkpoint: str, trigger: str, query_name: str):
        """Start the streaming query writing ``rows`` to the topic. A new checkpoint (no
        micro-batch started under it) refuses a topic that holds records.

        :param rows: a streaming DataFrame.
        :param checkpoint: the query's checkpoint location.
        :param trigger: ``available-now`` or a processing-time interval.
        :param query_name: the query's name in Spark's progress and UI.
        :raises TopicRefused: the topic does not exist, cannot be reached, or holds records of
            another query.
        """
        spark = rows.sparkSession
        partitions, held = _TopicAdmin(spark, self).describe()
        if held and not _started(checkpoint):
            raise TopicRefused(self._held_by_another_query(held, checkpoint))
        writer = (self._topic_options(self.records(rows, partitions).writeStream)
                  .outputMode("append").option("checkpointLocation", checkpoint)
                  .queryName(query_name))
        return apply_trigger(writer, trigger).start()

    def _held_by_another_query(self, held: int, checkpoint: str) -> str:
        return (f"topic {self.topic} holds {held} records and checkpoint {checkpoint} is new: "
                "this query's rows would repeat their keys, and readers keep the first record "
                "of each key. Give a new topic (or delete and recreate this one), or the "
                "checkpoint that wrote it.")

    def _absent(self) -> str:
        return (f"topic {self.topic} does not exist at {self.bootstrap_servers}: create it "
                "first, with the partitions its readers need")

    def refusal_before_start(self, checkpoint: str, timeout: float = 10.0) -> Optional[str]:
        """Why a streaming query on ``checkpoint`` cannot write to the topic, asked with the
        Python Kafka client before Spark starts (``kafka.``-prefixed options become its
        settings): no broker answers, the topic does not exist, or it holds records while the
        checkpoint is new. ``start_stream`` asks again through Spark's client.

        :param checkpoint: the query's checkpoint; one on a Hadoop URI is not read before
            Spark starts, so only the topic's existence is checked for it.
        :param timeout: seconds to wait for the cluster's answers.
        :returns: the refusal in one line, or ``None`` (also when the Python client cannot be
            set up as Spark's is, e.g. with ``kafka.sasl.jaas.config``: Spark's then checks).
        """
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        admin = python_admin(self.bootstrap_servers, self.options)
        if admin is None:
            return None
        try:
            # Every topic, not this one by name: a request naming it could create it on a
            # broker that creates topics on first use.
            described = admin.list_topics(timeout=timeout).topics.get(self.topic)
            if described is None:
                return self._absent()
            if is_uri(checkpoint) or _started(checkpoint):
                return None
            partitions = [TopicPartition(self.topic, p) for p in described.partitions]
            total = []
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
                answers = admin.list_offsets({p: spec for p in partitions},
                                             request_timeout=timeout)
                total.append(sum(answer.result().offset for answer in answers.values()))
        except KafkaException as err:
            return (f"no Kafka broker at {self.bootstrap_servers} answered within {timeout:g} s "
                    f"({err.args[0].str()}); check --kafka-bootstrap-servers")
        held = total[1] - total[0]
        return self._held_by_another_query(held, checkpoint) if held else None

    def write_batch(self, rows, replace: str = REPLACE_ALL) -> None:
        """Write ``rows`` to the topic once. A topic keeps what it holds, so ``REPLACE_ALL``
        means the rows are the whole output and the topic must be empty: the write appends to
        an empty topic, and refuses one that holds records. ``REPLACE_DATES`` (a backfill of
        some dates) is refused: records of other dates cannot stay while these are replaced.

        :param rows: a batch DataFrame.
        :param replace: ``REPLACE_ALL``; ``REPLACE_DATES`` is refused.
        :raises TopicRefused: the topic does not exist, cannot be reached, holds records, or
            ``replace`` is ``REPLACE_DATES``.
        """
        if replace == REPLACE_DATES:
            raise TopicRefused(f"topic {self.topic}: a Kafka topic cannot replace the rows of "
                               "some goal dates (a backfill); write the backfill to files")
        if replace != REPLACE_ALL:
            raise ValueError(f"replace must be one of {REPLACE_ALL}, {REPLACE_DATES}, "
                             f"got {replace!r}")
        partitions, held = _TopicAdmin(rows.sparkSession, self).describe()
        if held:
            raise TopicRefused(
                f"topic {self.topic} holds {held} records: a batch run writes the whole output "
                "and a topic cannot be replaced. Give a new topic (or delete and recreate "
                "this one).")
        self._topic_options(self.records(rows, partitions).write).save()


def _json(columns: Sequence[str]) -> Column:
    """The columns as one JSON object, in their order, nulls written as ``null``."""
    return F.to_json(F.struct(*columns), _JSON_OPTIONS)


def _started(checkpoint: str) -> bool:
    """True when a query has started a micro-batch under ``checkpoint`` (its offset log has an
    entry); read through ``storage``, so a checkpoint on any Hadoop file system counts too."""
    return any(not entry.name.startswith(".")
               for entry in (location(checkpoint) / "offsets").iterdir())


class _TopicAdmin:
    """The two facts about the topic a write needs, from the Kafka client of the session's JVM
    (the connector's own, configured by the same ``kafka.`` options as the sink)."""

    def __init__(self, spark, sink: KafkaSink):
        self.jvm = spark._jvm
        self.sink = sink

    def _admin(self):
        properties = self.jvm.java.util.Properties()
        properties.setProperty("bootstrap.servers", self.sink.bootstrap_servers)
        for key, value in self.sink.options.items():
            if key.startswith(_KAFKA_PREFIX):
                properties.setProperty(key[len(_KAFKA_PREFIX):], str(value))
        return self.jvm.org.apache.kafka.clients.admin.Admin.create(properties)

    def describe(self) -> tuple[int, int]:
        """The topic's partition count and how many records it holds (from each partition's
        earliest offset to its end). A topic unknown to the broker is asked again for
        ``_NEW_TOPIC_WAIT_S``: a topic created a moment ago reaches the brokers' metadata a
        little after its creation is acknowledged (Kafka's clients retry this error too).

        :raises TopicRefused: the topic does not exist or no broker answered in time.
        """
        deadline = time.monotonic() + _NEW_TOPIC_WAIT_S
        while True:
            try:
                return self._describe_once()
            except TopicRefused as refused:
                if not refused.unknown_topic or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _describe_once(self) -> tuple[int, int]:
        from py4j.protocol import Py4JJavaError

        jvm, topic = self.jvm, self.sink.topic
        unit = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
        admin = None
        try:
            admin = self._admin()
            described = (admin.describeTopics(jvm.java.util.Collections.singletonList(topic))
                         .allTopicNames().get(_ADMIN_TIMEOUT_MS, unit))
            count = described.get(topic).partitions().size()
            spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
            offsets = []
            for which in (spec.earliest(), spec.latest()):
                request = jvm.java.util.HashMap()
                for partition in range(count):
                    request.put(jvm.org.apache.kafka.common.TopicPartition(topic, partition),
                                which)
                answer = admin.listOffsets(request).all().get(_ADMIN_TIMEOUT_MS, unit)
                offsets.append(sum(info.offset() for info in answer.values()))
        except Py4JJavaError as err:
            raise self._refusal(err) from None
        finally:
            if admin is not None:
                # Every answer is in, or no longer awaited: nothing to wait for.
                admin.close(jvm.java.time.Duration.ZERO)
        return count, offsets[1] - offsets[0]

    def _refusal(self, err) -> Exception:
        """The one-line refusal for a failed admin request, or ``err`` itself when unforeseen."""
        cause = err.java_exception
        while cause.getCause() is not None and "ExecutionException" in cause.getClass().getName():
            cause = cause.getCause()
        name = cause.getClass().getSimpleName()
        servers = self.sink.bootstrap_servers
        if name == "UnknownTopicOrPartitionException":
            refused = TopicRefused(self.sink._absent())
            refused.unknown_topic = True
            return refused
        if name == "TimeoutException":
            return TopicRefused(f"no Kafka broker at {servers} answered within "
                                f"{_ADMIN_TIMEOUT_MS // 1000} s; check --kafka-bootstrap-servers")
        if name == "ConfigException":
            return TopicRefused(f"the Kafka client refuses its settings: {cause.getMessage()}")
        return err
