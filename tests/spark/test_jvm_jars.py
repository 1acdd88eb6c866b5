"""The project's Spark session has its JVM jars by itself: Spark's Kafka source reads what a
client produced to the suite's broker, and Delta Lake writes and reads a table."""
from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def test_the_session_reads_a_topic_with_sparks_kafka_source(spark, kafka_bootstrap):
    topic = "jvm-jars-read"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # alive until the topic exists
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    sent = {f"user-{n}": f'{{"n": {n}}}' for n in range(10)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic).load()
            .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition")
            .collect())
    assert {r.k: r.v for r in rows} == sent
    assert len(rows) == len(sent)
    assert {r.partition for r in rows} == {0, 1}  # keyed records spread over both partitions


def test_the_session_writes_and_reads_delta_tables(spark, tmp_path):
    table = str(tmp_path / "table")
    spark.range(3).write.format("delta").save(table)
    spark.range(3, 5).write.format("delta").mode("append").save(table)
    assert sorted(r.id for r in spark.read.format("delta").load(table).collect()) == list(range(5))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version").collect()
    assert sorted(r.version for r in history) == [0, 1]
