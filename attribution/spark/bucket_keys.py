"""The key values of applyInPandasWithState's state buckets, chosen so that Spark spreads the
buckets evenly over its shuffle partitions.

Spark places a stateful operator's key on partition ``pmod(murmur3(key, 42), partitions)``.
Keyed by the bucket number itself (0..63), that put 36 of 64 buckets, and 56% of the
benchmark's events, on one of two partitions: every micro-batch waited for the larger task while
the other core idled. Bucket ``b`` is therefore keyed by the smallest non-negative integer whose
hash is ``b`` modulo the bucket count. For any partition count that divides the bucket count
(the default 64 buckets over 1, 2, 4, ... 64 partitions) each partition then holds the same
number of buckets, and users are spread over buckets by their own hash. Nothing here depends on
the partition count, so a checkpoint's keys stay valid whatever it was started with.
"""
from __future__ import annotations

from functools import lru_cache

# Spark's HashPartitioning hashes with Murmur3Hash(seed = 42): Murmur3_x86_32.hashLong.
_SEED = 42
_MASK = 0xFFFFFFFF
# Beyond this the key table, a literal array in the query plan, gets unwieldy.
MAX_ALIGNED_BUCKETS = 4096


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h1: int, k1: int) -> int:
    k1 = _rotl((k1 * 0xCC9E2D51) & _MASK, 15) * 0x1B873593 & _MASK
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def spark_hash_long(value: int) -> int:
    """Spark's ``hash()`` of a BIGINT (Murmur3 x86 32-bit, seed 42), as a signed 32-bit int.

    :param value: the BIGINT (a Python int within 64 bits).
    """
    h1 = _mix(_mix(_SEED, value & _MASK), (value >> 32) & _MASK)
    h1 ^= 8  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@lru_cache(maxsize=None)
def aligned_bucket_keys(buckets: int) -> tuple[int, ...]:
    """Key value of each bucket: ``keys[b]`` is the smallest ``k >= 0`` with
    ``spark_hash_long(k) mod buckets == b``.

    :param buckets: the bucket count, 1 to ``MAX_ALIGNED_BUCKETS``.
    :raises ValueError: the count is out of that range.
    """
    if not 1 <= buckets <= MAX_ALIGNED_BUCKETS:
        raise ValueError(f"aligned bucket keys need 1 to {MAX_ALIGNED_BUCKETS} buckets, "
                         f"got {buckets}")
    keys: list = [None] * buckets
    missing, candidate = buckets, 0
    while missing:
        slot = spark_hash_long(candidate) % buckets  # Python's % is already a pmod
        if keys[slot] is None:
            keys[slot] = candidate
            missing -= 1
        candidate += 1
    return tuple(keys)
