"""The ``applyInPandasWithState`` backend (Spark's flatMapGroupsWithState for Python).

Per ``user_id`` the whole core state is one binary column, the core's versioned Avro blob. The
single event-time timeout is the user's next wake-up: the min pending goal or, with none
pending, the watermark at which garbage collection empties the state.

Spark fires an event-time timeout when the watermark moves *past* the timestamp and rejects a
timestamp below the current watermark. Every call therefore first attributes whatever is already
due (``advance(W)`` fires all goals ``<= W``), so the next wake-up ``T`` is always ``> W`` and the
timeout is set to ``T - 1``: it fires exactly when the watermark reaches ``T``.
"""
from __future__ import annotations

import io
from typing import Callable, Iterator

import fastavro
import pandas as pd

from ..config import AttributionConfig
from ..core import WATERMARK_INFINITY, UserAttribution
from .frames import (events_by_user, events_from_arrow, events_from_packed, output_arrow_schema,
                     rows_to_arrow, rows_to_frame)

STATE_DDL = "state binary"


def make_group_state_function(config: AttributionConfig) -> Callable:
    """The function for ``groupBy('user_id').applyInPandasWithState(...)``."""

    def attribute_user(key, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        watermark = state.getCurrentWatermarkMs()
        core = (UserAttribution.from_bytes(state.get[0], config) if state.exists
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
            state.update((core.to_bytes(),))
            state.setTimeoutTimestamp(core.next_wakeup() - 1)
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
BUCKET_STATE_VERSION = 1
_BUCKET_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "UserBucketStateV1", "namespace": "streamjoin.attribution",
    "fields": [{"name": "users", "type": {"type": "map", "values": {
        "type": "record", "name": "BucketUser", "fields": [
            {"name": "wakeup", "type": "long"},   # when the user next needs the engine
            {"name": "state", "type": "bytes"},   # the core's own versioned blob
        ]}}}],
})


def encode_bucket(users: dict) -> bytes:
    """A bucket's users (``user_id -> {"wakeup", "state"}``) as one versioned Avro value."""
    buf = io.BytesIO()
    buf.write(bytes([BUCKET_STATE_VERSION]))
    fastavro.schemaless_writer(buf, _BUCKET_SCHEMA, {"users": users})
    return buf.getvalue()


def decode_bucket(blob: bytes) -> dict:
    if not blob or blob[0] != BUCKET_STATE_VERSION:
        raise ValueError(f"unknown bucket state version {blob[:1]!r}; this code reads "
                         f"version {BUCKET_STATE_VERSION}")
    return fastavro.schemaless_reader(io.BytesIO(blob[1:]), _BUCKET_SCHEMA, None)["users"]


def make_bucket_state_function(config: AttributionConfig) -> Callable:
    """The function for ``groupBy(BUCKET_COLUMN).applyInPandasWithState(...)``.

    Spark's pandas machinery costs milliseconds per key and micro-batch (a frame in, a state
    frame out), whatever the function does. Keyed by a hash bucket of ``user_id``, one call
    serves every user of the bucket. The bucket's state maps each user to the core's blob and
    the user's next wake-up; the bucket's timeout is the earliest of those, and a call advances
    only the users with input or with a wake-up the watermark has reached, decoding no one else.
    Each user's rows and timing are exactly those of the one-user-per-key function above.
    """

    def attribute_bucket(key, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        watermark = state.getCurrentWatermarkMs()
        users = decode_bucket(state.get[0]) if state.exists else {}
        incoming = events_by_user(frames)
        due = [u for u, entry in users.items() if entry["wakeup"] <= watermark
               and u not in incoming]
        rows = []
        for user_id in [*incoming, *due]:
            entry = users.get(user_id)
            core = (UserAttribution.from_bytes(entry["state"], config) if entry is not None
                    else UserAttribution(user_id, config))
            core.add(incoming.get(user_id, ()))
            rows.extend(core.advance(watermark))
            if core.is_empty:
                users.pop(user_id, None)
            else:
                users[user_id] = {"wakeup": core.next_wakeup(), "state": core.to_bytes()}
        if users:
            state.update((encode_bucket(users),))
            state.setTimeoutTimestamp(min(e["wakeup"] for e in users.values()) - 1)
        else:
            state.remove()
        if rows:
            yield rows_to_frame(rows)

    return attribute_bucket
