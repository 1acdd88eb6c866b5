"""The key values of applyInPandasWithState's buckets: Spark's own hash, and an even spread."""
from __future__ import annotations

from collections import Counter

import pytest

from attribution.spark.bucket_keys import MAX_ALIGNED_BUCKETS, aligned_bucket_keys, spark_hash_long


def test_the_hash_is_sparks_hash_of_a_bigint(spark):
    from pyspark.sql import functions as F

    values = [0, 1, -1, 42, 2 ** 31, -(2 ** 31) - 1, 2 ** 40 + 7, 2 ** 63 - 1, -(2 ** 63),
              *aligned_bucket_keys(64)]
    rows = (spark.createDataFrame([(v,) for v in values], "k bigint")
            .select("k", F.hash("k").alias("h")).collect())
    assert {r.k: r.h for r in rows} == {v: spark_hash_long(v) for v in values}


def test_spark_places_the_keys_of_64_buckets_evenly_on_its_partitions(spark):
    from pyspark.sql import functions as F

    keys = spark.createDataFrame([(k,) for k in aligned_bucket_keys(64)], "k bigint")
    for partitions in (2, 4):
        per_partition = (keys.repartition(partitions, "k")
                         .groupBy(F.spark_partition_id()).count().collect())
        assert sorted(r["count"] for r in per_partition) == [64 // partitions] * partitions


@pytest.mark.parametrize("buckets", [1, 2, 7, 64, 100, 256])
def test_bucket_b_is_keyed_by_the_smallest_value_hashing_to_b(buckets):
    keys = aligned_bucket_keys(buckets)
    assert len(set(keys)) == buckets
    for b, key in enumerate(keys):
        assert spark_hash_long(key) % buckets == b
        assert all(spark_hash_long(k) % buckets != b for k in range(key))


def test_any_partition_count_dividing_the_buckets_gets_an_equal_share():
    keys = aligned_bucket_keys(64)
    for partitions in (1, 2, 4, 8, 16, 32, 64):
        spread = Counter(spark_hash_long(k) % partitions for k in keys)
        assert sorted(spread.values()) == [64 // partitions] * partitions
    # Keyed by the bucket number itself, two partitions got 36 and 28 of the 64 buckets.
    assert sorted(Counter(spark_hash_long(b) % 2 for b in range(64)).values()) == [28, 36]


def test_too_many_buckets_for_a_key_table_are_refused():
    with pytest.raises(ValueError, match=f"1 to {MAX_ALIGNED_BUCKETS} buckets"):
        aligned_bucket_keys(MAX_ALIGNED_BUCKETS + 1)
