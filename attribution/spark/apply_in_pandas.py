"""The ``applyInPandasWithState`` backend (Spark's flatMapGroupsWithState for Python).

Per key the whole state is one text column (``STATE_DDL``): the core's versioned blob for a user,
or the compressed map of a bucket's users, in base64 (see ``state_text``). The
single event-time timeout is the user's next wake-up: the min pending goal or, with none
pending, the watermark at which garbage collection empties the state.

Spark fires an event-time timeout when the watermark moves *past* the timestamp and rejects a
timestamp below the current watermark. Every call therefore first attributes whatever is already
due (``advance(W)`` fires all goals ``<= W``), so the next wake-up ``T`` is always ``> W`` and the
timeout is set to ``T - 1``: it fires exactly when the watermark reaches ``T``.
"""
from __future__ import annotations

import binascii
import io
import pickle
import struct
import warnings
from typing import Callable, Iterator, Optional

import fastavro
import pandas as pd
import pyarrow as pa

from ..config import AttributionConfig
from ..core import WATERMARK_INFINITY, UserAttribution
from ..state_codec import loads_builtins
from .bucket_scheduler import BucketScheduler
from .frames import (
    STATE_USERS_CHANGE,
    events_from_arrow,
    events_from_json_list,
    events_from_packed,
    on_time_watermark,
    output_arrow_schema,
    packed_by_user,
    rows_to_arrow,
    rows_to_frame,
    spark_timeout,
    users_change_frame,
)

STATE_DDL = "state string"
# How the state column holds a blob; pinned in a job's checkpoint (jobs/attribution_job.py).
# Checkpoints written before it was text hold "binary", which Spark cannot read as this column.
STATE_COLUMN_FORMAT = "base64 text"


def state_text(blob: bytes) -> str:
    """A state blob as the text stored in Spark's state column.

    Text, not binary, because of how Spark hands the state to Python: it pickles the state row
    on the JVM with Pyrolite, which turns a ``byte[]`` into a Latin-1 string one character at a
    time and then encodes that as UTF-8, and Python decodes it back the same slow way. For a
    compressed blob of a few hundred kilobytes per key and micro-batch, that was a fifth of the
    JVM's time. An ASCII string crosses both ways by plain copies; base64 costs a third more
    bytes and microseconds per blob.

    :param blob: the state blob (bytes) to store.
    """
    return binascii.b2a_base64(blob, newline=False).decode("ascii")


def state_blob(text: str) -> bytes:
    """The blob that ``state_text`` stored as ``text``.

    :param text: the state column's text, as ``state_text`` wrote it.
    """
    return binascii.a2b_base64(text)


# PySpark 4.3's applyInPandasWithState worker pads its output with all-NA frames and concatenates
# them, which pandas 2 warns about on every micro-batch (the warning names pyspark/worker.py). The
# padding rows are dropped again by PySpark, so the warning says nothing about our rows; this
# module is imported by every worker that runs the functions below, so the filter lives here.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message="The behavior of DataFrame concatenation with empty or all-NA")


def make_group_state_function(config: AttributionConfig) -> Callable:
    """The function for ``groupBy('user_id').applyInPandasWithState(...)``.

    :param config: the attribution settings (models, lookback, ...).
    """

    def attribute_user(key, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        watermark = on_time_watermark(state.getCurrentWatermarkMs(), config)
        core = (UserAttribution.from_bytes(state_blob(state.get[0]), config) if state.exists
                else UserAttribution(user_id, config))
        for frame in frames:
            # Spark already dropped (and counted) rows behind the previous batch's watermark.
            # Rows between that and ``watermark`` are on time: they are added before any goal
            # at or below ``watermark`` fires. The core still guards against rows at or below
            # a watermark it already fired at.
            core.add(events_from_packed(user_id, frame))
        rows = core.advance(watermark)
        if core.is_empty:
            state.remove()
        else:
            state.update((state_text(core.to_bytes()),))
            # One user per key: only the calls it gets tell it the watermark (see next_wakeup).
            state.setTimeoutTimestamp(spark_timeout(core.next_wakeup(every_move=True), config))
        if rows:
            yield rows_to_frame(rows)

    return attribute_user


def make_batch_function(config: AttributionConfig) -> Callable:
    """The function for batch mode's ``mapInArrow``: the same core, fed each user's whole input,
    fired at a watermark of +infinity.

    Its input partitions are hash-partitioned and sorted by ``user_id``, so a user's events are
    consecutive (possibly across Arrow batches). Working a partition at a time rather than
    ``groupBy().applyInPandas`` saves a pandas frame in and out per user, which cost more than
    the attribution itself.

    :param config: the attribution settings (models, lookback, ...).
    """
    schema = output_arrow_schema()

    def attribute_partition(batches):
        user_id, events, rows = None, [], []
        for batch in batches:
            for event in events_from_arrow(batch):
                if event.user_id != user_id:
                    rows.extend(_attribute_user(user_id, events, config))
                    user_id, events = event.user_id, []
                events.append(event)
            if len(rows) >= BATCH_OUTPUT_ROWS:
                yield rows_to_arrow(rows, schema)
                rows = []
        rows.extend(_attribute_user(user_id, events, config))
        if rows:
            yield rows_to_arrow(rows, schema)

    return attribute_partition


# Output rows per Arrow batch of batch mode: large enough to amortise the conversion.
BATCH_OUTPUT_ROWS = 10_000


def _attribute_user(user_id, events: list, config: AttributionConfig) -> list:
    if not events:
        return []
    core = UserAttribution(user_id, config)
    core.add(events)
    return core.fire(WATERMARK_INFINITY)


# -- many users per key ---------------------------------------------------------------------------
BUCKET_COLUMN = "state_bucket"
BUCKET_STATE_VERSION = 3
_BUCKET_SCHEMA_V1 = {
    "type": "record", "name": "UserBucketStateV1", "namespace": "streamjoin.attribution",
    "fields": [{"name": "users", "type": {"type": "map", "values": {
        "type": "record", "name": "BucketUser", "fields": [
            {"name": "wakeup", "type": "long"},   # when the user next needs the engine
            {"name": "state", "type": "bytes"},   # the core's own versioned blob
        ]}}}],
}
# Version 2: a user's entry is a tuple ``(wakeup, state, inbox)``. The inbox holds events received
# but not yet given to the core, as the packed JSON objects they arrived in, comma-joined (a
# version-1 bucket reads as having empty inboxes); ``state`` is empty while a user has only an
# inbox. The map is a pickle of built-in values, like the core's own blob (pickle's C codec is
# several times faster than fastavro here, and this runs on every micro-batch), compressed with
# zstd: a bucket's state crosses between the JVM and Python and is written to the state store on
# every micro-batch, and that traffic, not the attribution, bounded the job's throughput. Its
# users' urls repeat, so it shrinks about 5x for a few milliseconds per megabyte.
# Version 3: the pickle is ``(map, watermark)``, the watermark the bucket last advanced to
# (``BucketScheduler.watermark``; None in a bucket read from an earlier version).
_BUCKET_V1_READER = fastavro.parse_schema(_BUCKET_SCHEMA_V1)
_CODEC = pa.Codec("zstd", compression_level=1)
_SIZE = struct.Struct("<I")   # the uncompressed size, which zstd's decoder is given


def encode_bucket(users: dict, watermark: Optional[int] = None) -> bytes:
    """A bucket's users (``user_id -> (wakeup, state, inbox)``) and the watermark it last
    advanced to, as one versioned, compressed value.

    :param users: the bucket's users, ``user_id -> (wakeup, state, inbox)``.
    :param watermark: the watermark the bucket last advanced to, or ``None``.
    """
    raw = pickle.dumps((users, watermark), protocol=5)
    return b"".join((bytes([BUCKET_STATE_VERSION]), _SIZE.pack(len(raw)),
                     _CODEC.compress(raw, asbytes=True)))


def decode_bucket(blob: bytes) -> tuple[dict, Optional[int]]:
    """The users and watermark of a bucket written by ``encode_bucket`` of this or an earlier
    version (earlier versions hold no watermark: None).

    :param blob: the stored bucket value.
    """
    version = blob[0] if blob else None
    if version == 1:
        users = fastavro.schemaless_reader(io.BytesIO(blob[1:]), _BUCKET_V1_READER, None)["users"]
        return {u: (e["wakeup"], e["state"], "") for u, e in users.items()}, None
    if version not in (2, BUCKET_STATE_VERSION):
        raise ValueError(f"unknown bucket state version {blob[:1]!r}; this code reads versions "
                         f"up to {BUCKET_STATE_VERSION}")
    (size,) = _SIZE.unpack_from(blob, 1)
    held = loads_builtins(_CODEC.decompress(memoryview(blob)[1 + _SIZE.size:], size))
    if version == 2:
        return held, None
    users, watermark = held
    return users, watermark


def bucket_user_count(text: str) -> int:
    """How many users a bucket's stored state (its state column's text) holds.

    :param text: the bucket's state column text; empty: no state.
    """
    return len(decode_bucket(state_blob(text))[0]) if text else 0


def make_bucket_state_function(config: AttributionConfig) -> Callable:
    """The function for ``groupBy(BUCKET_COLUMN).applyInPandasWithState(...)``.

    Spark's pandas machinery costs milliseconds per key and micro-batch (a frame in, a state
    frame out), whatever the function does. Keyed by a hash bucket of ``user_id``, one call
    serves every user of the bucket; ``BucketScheduler`` decides which of them the core must see
    (see ``bucket_scheduler``), and the bucket's timeout is its users' earliest wake-up. Each
    user's rows and timing are those of the one-user-per-key function above.

    Its output has one more column, ``STATE_USERS_CHANGE``: Spark counts the buckets it holds,
    not the users, so a call whose bucket gained or lost users says so in a marker row.

    :param config: the attribution settings (models, lookback, ...).
    """

    def attribute_bucket(key, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        watermark = on_time_watermark(state.getCurrentWatermarkMs(), config)
        users, last_watermark = (decode_bucket(state_blob(state.get[0])) if state.exists
                                 else ({}, None))
        bucket = BucketScheduler(config, events_from_json_list, users, last_watermark)
        users_before = len(bucket)
        for user_id, batch in packed_by_user(frames).items():
            bucket.receive(user_id, batch.packed, batch.min_ts_ms, batch.max_ts_ms,
                           batch.min_goal_ms)
        rows = bucket.advance(watermark)
        wakeup = bucket.next_wakeup()
        if wakeup is None:
            state.remove()
        else:  # with revisions, a bucket without users still keeps the watermark it saw
            state.update((state_text(encode_bucket(bucket.users, bucket.watermark)),))
            state.setTimeoutTimestamp(spark_timeout(wakeup, config))
        if rows:
            frame = rows_to_frame(rows)
            frame[STATE_USERS_CHANGE] = None
            yield frame
        if len(bucket) != users_before:
            yield users_change_frame(len(bucket) - users_before)

    return attribute_bucket
