"""The stored form of one user's attribution state: ``Snapshot``, the state's contents as plain
values, and its versioned blob (``encode`` / ``decode``), with the readers of every earlier
version.

The rules (``core.UserAttribution``) know nothing of bytes: they hand over a ``Snapshot`` and
are rebuilt from one. This module changes when the storage does (a new version, a faster
encoding), never when a rule does. The formats are described in ``docs/state-formats.md``.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Collection, Mapping, Optional, Union

import fastavro

from .models import LAST_TOUCH
from .paths import Impression, Visit
from .revisions import Emitted
from .rows import Attribution


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one user's state holds, as values a store can keep.

    ``UserAttribution.snapshot()`` gives one and ``UserAttribution.from_snapshot()`` takes one.
    A snapshot taken from a live state is a view of it: its collections and records are the
    state's own, valid until the state's next move, and never to be changed.

    :param user_id: the user.
    :param watermark: the highest watermark the state was advanced to, or None.
    :param visits: every visit held, goals included (``pending``: not yet attributed).
    :param impressions: the canonical impression of each logical impression (rule 3), with its
        consumption marks; when ``deduplicated`` is false, possibly several members of one.
    :param superseded: the click-spam members that lost to a canonical one (rule 3), by event
        id: whole, or as the dedup bucket alone for an id kept by an earlier version.
    :param open_goals: with revisions (section 8), what was last emitted for each goal that is
        not final, per model.
    :param deduplicated: true when ``impressions`` holds one member per logical impression (a
        state written by this code); false when rule 3 must sort them out again on the way in.
    """

    user_id: str
    watermark: Optional[int]
    visits: Collection[Visit]
    impressions: Collection[Impression]
    superseded: Mapping[str, Union[Impression, int]]
    open_goals: Mapping[str, Mapping[str, Emitted]]
    deduplicated: bool = True

    @property
    def superseded_members(self) -> list[Impression]:
        """The superseded click-spam members kept whole."""
        return [m for m in self.superseded.values() if isinstance(m, Impression)]

    @property
    def superseded_buckets(self) -> dict[str, int]:
        """The superseded ids kept by an earlier version, with their dedup bucket (their
        contents unknown: such an id keeps the copy it has)."""
        return {k: m for k, m in self.superseded.items() if isinstance(m, int)}


# Version 5, the current one: a pickle (protocol 5) of built-in values only, read back by an
# unpickler that refuses anything else:
#   (user_id, watermark,
#    [(event_id, ts, url, referer, goal, value)],
#        goal: 0 = plain visit, 1 = attributed, 2 = pending; value: a goal's value or None
#    [(event_id, impression_id, ts, source_url, target_url, consumed, campaign)],
#        canonical impressions; consumed: one bit per model that credited it (config.model_bit)
#    [(event_id, impression_id, ts, source_url, target_url, campaign) or (event_id, bucket)],
#        superseded click-spam members (rule 3), whole so that a copy of one is judged by
#        rule 1; the short form is a member kept by an earlier version, its dedup bucket alone
#    [(goal event_id, [(model, revision, [row values in OUTPUT_FIELDS order])])])
#        with revisions (section 8), what was last emitted for each goal not yet final; a
#        blob without this element has none
# Version 4 kept every superseded member in the short form. Version 3 had neither values nor
# campaigns, and a boolean ``consumed``: it knew last_touch alone, and reads as last_touch's
# consumption. Versions 1 and 2, Avro records of version 3's fields, are read the same way;
# pickle replaced them because a streaming backend decodes and re-encodes a user's state on
# every micro-batch that touches it, and pickle's C codec does that about 3x faster than
# fastavro's records.
STATE_VERSION = 5
_STATE_HEADER = bytes([STATE_VERSION])
_PICKLE_VERSIONS = (3, 4, STATE_VERSION)


def encode(snapshot: Snapshot) -> bytes:
    """The state as one blob of the current version (``STATE_VERSION``).

    A user's URLs repeat (a visit's referer is the previous visit's url, an impression's
    target the visit it led to). Pickle writes an object it has already written as a short
    back-reference, so equal URLs are first made one object: on the benchmark's data the
    blobs shrink by 29%, and every later step that copies, compresses or decodes them has
    less to do.

    :param snapshot: the state's contents, with ``deduplicated`` true.
    """
    url = {}.setdefault  # campaigns repeat too, and are interned the same way
    return _STATE_HEADER + pickle.dumps((
        snapshot.user_id, snapshot.watermark,
        [(v.event_id, v.ts, url(v.url, v.url), v.referer and url(v.referer, v.referer),
          (2 if v.pending else 1) if v.is_goal else 0, v.value)
         for v in snapshot.visits],
        [(i.event_id, i.impression_id, i.ts, url(i.source_url, i.source_url),
          url(i.target_url, i.target_url), i.consumed, i.campaign and url(i.campaign, i.campaign))
         for i in snapshot.impressions],
        [(k, m) if isinstance(m, int) else
         (k, m.impression_id, m.ts, url(m.source_url, m.source_url),
          url(m.target_url, m.target_url), m.campaign and url(m.campaign, m.campaign))
         for k, m in snapshot.superseded.items()],
        [(goal, [(model, e.revision, [tuple(r) for r in e.rows])
                 for model, e in by_model.items()])
         for goal, by_model in snapshot.open_goals.items()],
    ), protocol=5)


def decode(blob: bytes) -> Snapshot:
    """The state in a blob written by ``encode`` of this or an earlier version.

    :param blob: the blob; its first byte is its version.
    :raises ValueError: an empty blob, or one of a version newer than this code knows.
    :raises pickle.UnpicklingError: a blob that names a class or a callable.
    """
    if not blob:
        raise ValueError("empty attribution state blob")
    version = blob[0]
    if version in AVRO_WRITER_SCHEMAS:
        return _decode_avro(blob)
    if version not in _PICKLE_VERSIONS:
        raise ValueError(f"attribution state version {version} is newer than this code "
                         f"understands (max {STATE_VERSION})")
    parts = loads_builtins(memoryview(blob)[1:])
    user_id, watermark, visits, impressions, superseded = parts[:5]
    open_goals = parts[5] if len(parts) > 5 else ()
    if version == 3:  # no values or campaigns; "consumed" was last_touch's
        visits = [(*v, None) for v in visits]
        impressions = [(*i[:5], LAST_TOUCH if i[5] else 0, None) for i in impressions]
    return Snapshot(
        user_id, watermark,
        [Visit(event_id, ts, url, referer, goal != 0, goal == 2, value)
         for event_id, ts, url, referer, goal, value in visits],
        [Impression(event_id, impression_id, ts, source, target, consumed, campaign)
         for event_id, impression_id, ts, source, target, consumed, campaign in impressions],
        # Up to version 4 a superseded member is (event_id, bucket); version 5 keeps it whole.
        {m[0]: m[1] if len(m) == 2 else Impression(m[0], m[1], m[2], m[3], m[4], 0, m[5])
         for m in superseded},
        {goal: {model: Emitted(revision, tuple(Attribution(*values) for values in rows))
                for model, revision, rows in by_model}
         for goal, by_model in open_goals})


def _decode_avro(blob: bytes) -> Snapshot:
    """A version-1 or version-2 blob, whose impressions rule 3 sorts out again on the way in
    (as the version that wrote it did)."""
    record = fastavro.schemaless_reader(io.BytesIO(blob[1:]), AVRO_WRITER_SCHEMAS[blob[0]],
                                        _STATE_SCHEMA_V2)
    return Snapshot(
        record["user_id"], record["watermark"],
        [Visit(r["event_id"], r["ts"], r["url"], r["referer"], r["goal"] != 0, r["goal"] == 2)
         for r in record["visits"]],
        [Impression(r["event_id"], r["impression_id"], r["ts"], r["source_url"], r["target_url"],
                    LAST_TOUCH if r["consumed"] else 0)
         for r in record["impressions"]],
        {r["event_id"]: r["bucket"] for r in record["superseded"]},
        {},
        deduplicated=False)


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler for state blobs: built-in values only, never a class or a callable."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"attribution state may not reference {module}.{name}")


def loads_builtins(data) -> object:
    """Unpickle ``data`` (bytes or a buffer) holding built-in values only: a state blob never
    names a class, so one that does is refused instead of run.

    :param data: the pickle's bytes.
    """
    return _BuiltinsOnly(io.BytesIO(data)).load()


_STATE_SCHEMA_V1 = {
    "type": "record", "name": "UserAttributionState", "namespace": "streamjoin.attribution",
    "fields": [
        {"name": "user_id", "type": "string"},
        {"name": "watermark", "type": ["null", "long"]},
        {"name": "visits", "type": {"type": "array", "items": {
            "type": "record", "name": "StateVisit", "fields": [
                {"name": "event_id", "type": "string"},
                {"name": "ts", "type": "long"},
                {"name": "url", "type": "string"},
                {"name": "referer", "type": ["null", "string"]},
                # 0 = plain visit, 1 = goal already attributed, 2 = goal pending
                {"name": "goal", "type": "int"},
            ]}}},
        {"name": "impressions", "type": {"type": "array", "items": {
            "type": "record", "name": "StateImpression", "fields": [
                {"name": "event_id", "type": "string"},
                {"name": "impression_id", "type": "long"},
                {"name": "ts", "type": "long"},
                {"name": "source_url", "type": "string"},
                {"name": "target_url", "type": "string"},
                {"name": "consumed", "type": "boolean"},
            ]}}},
    ],
}
# Version 2 remembers the ids of superseded click-spam members (rule 1); a version-1 blob reads
# as having none.
_STATE_SCHEMA_V2 = fastavro.parse_schema({**_STATE_SCHEMA_V1, "fields": [
    *_STATE_SCHEMA_V1["fields"],
    {"name": "superseded", "default": [], "type": {"type": "array", "items": {
        "type": "record", "name": "StateSupersededId", "fields": [
            {"name": "event_id", "type": "string"},
            {"name": "bucket", "type": "long"},   # the logical impression's dedup bucket
        ]}}},
]})

# Writer schemas of the Avro versions, by version (fastavro resolves version 1 to version 2).
AVRO_WRITER_SCHEMAS = {1: fastavro.parse_schema(_STATE_SCHEMA_V1), 2: _STATE_SCHEMA_V2}
