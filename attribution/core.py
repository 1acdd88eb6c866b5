"""The engine-free attribution state machine for one user: the ch. 7 ``AttributionFn``, fixed.

``UserAttribution`` holds what the DoFn holds (visits, impressions, pending goals and the
min-goal timer) and exposes the DoFn's moves as plain methods:

* ``add(events, watermark)``: buffer a batch of the user's events (late ones are counted and
  dropped, redeliveries deduplicated by ``event_id``);
* ``fire(watermark)``: attribute every pending goal at or below the watermark, in order, under
  every model of the configuration (section 6);
* ``gc(watermark)``: forget what can no longer matter (spec section 3);
* ``next_timer()``: the minimum pending goal time, where the event-time timer belongs;
* ``to_bytes()`` / ``from_bytes()``: the whole state as one compact, versioned blob.

A Spark backend is an adapter: state bytes and events in, rows and a timer out.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

import fastavro

from .config import LAST_TOUCH, AttributionConfig, model_bit
from .events import Event
from .models import credits
from .paths import Impression, ReferrerIndex, Visit
from .revisions import Emitted, emit_timing, revise
from .schema import OUTPUT_DEFAULTS

# The watermark of batch mode: past every event time (year ~146 million), yet far from overflow.
WATERMARK_INFINITY = 2 ** 62


class Attribution(NamedTuple):
    """One output row (spec sections 4, 6-8): a goal, a model and the impression it credits
    (none for an organic row). Timestamps are epoch milliseconds. The fields with a default are
    the output schema's optional columns, with its defaults.

    A named tuple with the output schema's fields in its order (``schema.OUTPUT_FIELDS``): a
    firing creates one per goal, model and credited impression, and a tuple is built several
    times faster than a frozen dataclass.
    """

    user_id: str
    goal_event_id: str
    goal_url: str
    goal_ts: int
    impression_id: Optional[int]
    impression_event_id: Optional[str]
    impression_source_url: Optional[str]
    impression_target_url: Optional[str]
    impression_ts: Optional[int]
    trail: tuple[str, ...]
    model: str
    credit: float
    impression_campaign: Optional[str] = OUTPUT_DEFAULTS["impression_campaign"]
    goal_value: Optional[float] = OUTPUT_DEFAULTS["goal_value"]
    credited_value: Optional[float] = OUTPUT_DEFAULTS["credited_value"]
    sign: int = OUTPUT_DEFAULTS["sign"]
    revision: int = OUTPUT_DEFAULTS["revision"]
    emit_timing: str = OUTPUT_DEFAULTS["emit_timing"]

    @property
    def organic(self) -> bool:
        return self.impression_id is None

    def to_record(self) -> dict:
        """The row as a dict in the Avro output schema (``trail`` as a list)."""
        record = self._asdict()
        record["trail"] = list(self.trail)
        return record


@dataclass(frozen=True, slots=True)
class AddResult:
    """What ``add`` did with a batch: stored, dropped as redelivered copies, dropped as too late
    (``late``); and how many records behind the watermark were within the allowed lateness
    (``late_accepted``: used like any record, so some may be copies)."""

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    late_accepted: int = 0


class UserAttribution:
    """The attribution state of one user and the rules that act on it."""

    def __init__(self, user_id: str, config: AttributionConfig = AttributionConfig()):
        self.user_id = user_id
        self.config = config
        self.visits: dict[str, Visit] = {}
        # One canonical impression per logical impression: (source, target, bucket) -> impression.
        self.impressions: dict[tuple[str, str, int], Impression] = {}
        self.pending_goals: dict[str, Visit] = {}
        self._impression_event_ids: set[str] = set()
        # Event ids of click-spam members that lost to their logical impression's canonical one,
        # with that impression's dedup bucket: a later record reusing such an id is a copy too.
        self.superseded: dict[str, int] = {}
        # The highest watermark this user has been advanced to; events at or below it are late.
        self.watermark: Optional[int] = None
        # With revisions (section 8): what was emitted for each goal not yet final, per model.
        self.open_goals: dict[str, dict[str, Emitted]] = {}

    # -- events in ------------------------------------------------------------------------------
    def add(self, events: Iterable[Event], watermark: Optional[int] = None) -> AddResult:
        """Buffer a batch of this user's events.

        :param events: the user's records, in arrival order.
        :param watermark: the watermark in force when they arrived (``W[k-1]``); by default the
            last one this state fired at. It becomes this state's watermark if it is higher.

        Events with ``ts <= W`` are late. Without allowed lateness they are counted and dropped,
        never used; with allowed lateness ``L`` only those with ``ts <= W - L`` are, and the
        others are used like any record (``fire`` revises the rows they change). Heartbeats are
        ignored. A record whose ``event_id`` is already held is a redelivery: the first copy
        counts (rule 1). An impression that is not the canonical member of its logical
        impression is dropped too, and counted with the duplicates (rule 3).
        """
        limit = self.watermark = self._max_watermark(watermark)
        drop_limit = None if limit is None else limit - self.config.allowed_lateness_ms
        accepted = duplicates = late = late_accepted = 0
        impression_ids = self._impression_event_ids
        for e in events:
            if e.event_type == "heartbeat":
                continue
            if drop_limit is not None and e.ts <= drop_limit:
                late += 1
                continue
            if limit is not None and e.ts <= limit:
                late_accepted += 1
            if (e.event_id in self.visits or e.event_id in impression_ids
                    or e.event_id in self.superseded):
                duplicates += 1
                continue
            if e.event_type == "visit":
                v = Visit(e.event_id, e.ts, e.url, e.referer, e.is_goal, e.is_goal,
                          e.value if e.is_goal else None)
                self.visits[e.event_id] = v
                if v.pending:
                    self.pending_goals[e.event_id] = v
                accepted += 1
            elif self._add_impression(e, impression_ids):
                accepted += 1
            else:
                duplicates += 1
        return AddResult(accepted, duplicates, late, late_accepted)

    def _add_impression(self, e: Event, impression_ids: set) -> bool:
        """Keep ``e`` if it becomes its logical impression's canonical member (rule 3)."""
        group = (e.source_url, e.target_url, e.ts // self.config.dedup_window_ms)
        new = Impression(e.event_id, e.impression_id, e.ts, e.source_url, e.target_url,
                         campaign=e.campaign)
        old = self.impressions.get(group)
        if old is not None:
            if old.rank <= new.rank:
                self.superseded[new.event_id] = group[2]  # a click-spam copy of an earlier click
                return False
            # Only reachable with late data: a consumed logical impression stays consumed.
            new.consumed = old.consumed
            impression_ids.discard(old.event_id)
            self.superseded[old.event_id] = group[2]
        self.impressions[group] = new
        impression_ids.add(e.event_id)
        return True

    # -- the timer ------------------------------------------------------------------------------
    def next_timer(self) -> Optional[int]:
        """The min-goal timer: the earliest pending goal's ``ts``, or ``None`` when none is pending."""
        if not self.pending_goals:
            return None
        return min(g.ts for g in self.pending_goals.values())

    def fire(self, watermark: int) -> list[Attribution]:
        """Attribute every pending goal with ``ts <= watermark`` in ``(ts, event_id)`` order
        (rule 7): per goal, the rows of every configured model, in ``config.MODELS`` order.

        With allowed lateness or early results the rows are a changelog (section 8): see
        ``_revise``.
        """
        previous = self.watermark
        self.watermark = self._max_watermark(watermark)
        if self.config.revising:
            return self._revise(previous, self.watermark)
        due = sorted((g for g in self.pending_goals.values() if g.ts <= watermark),
                     key=lambda g: (g.ts, g.event_id))
        if not due:
            return []
        rows = self._attribute(ReferrerIndex(self.visits.values(), self.impressions.values()),
                               due)
        for goal in due:
            goal.pending = False
            del self.pending_goals[goal.event_id]
        return rows

    def _revise(self, previous: Optional[int], watermark: int) -> list[Attribution]:
        """Section 8: recompute every goal of the table that is not final, in goal order, from
        the consumption final goals left, and emit what changed.

        The table's goals are the due ones (``ts <= watermark``), or every goal with early
        results. A goal is final once ``ts <= watermark - L``: no record that can still be
        accepted can change it, so what was emitted for it is forgotten and what it consumed
        stays consumed for good.
        """
        config = self.config
        goals = {g.event_id: g for g in self.pending_goals.values()
                 if config.early_results or g.ts <= watermark}
        for event_id in self.open_goals:
            goal = goals[event_id] = self.visits[event_id]
            goal.pending = True  # awaits attribution again (the candidate sweep asks for it)
        if not goals:
            return []
        # What goals not final consumed is given back, then taken again in goal order. A
        # logical impression is found by its group, which a late canonical member keeps.
        window = config.dedup_window_ms
        for by_model in self.open_goals.values():
            for model, emitted in by_model.items():
                bit = model_bit(model)
                for r in emitted.rows:
                    if r.impression_event_id is not None:
                        held = self.impressions.get((r.impression_source_url,
                                                     r.impression_target_url,
                                                     r.impression_ts // window))
                        if held is not None:
                            held.consumed &= ~bit
        ordered = sorted(goals.values(), key=lambda g: (g.ts, g.event_id))
        computed: dict[tuple[str, str], list[Attribution]] = {}
        index = ReferrerIndex(self.visits.values(), self.impressions.values())
        for row in self._attribute(index, ordered):
            computed.setdefault((row.goal_event_id, row.model), []).append(row)
        out: list[Attribution] = []
        final = watermark - config.allowed_lateness_ms
        for goal in ordered:
            timing = emit_timing(goal.ts, previous, watermark)
            before = self.open_goals.get(goal.event_id, {})
            now: dict[str, Emitted] = {}
            for model in config.models:
                entries, now[model] = revise(before.get(model),
                                             computed[(goal.event_id, model)], timing)
                out.extend(entries)
            if goal.ts <= watermark:
                goal.pending = False
                self.pending_goals.pop(goal.event_id, None)
            if goal.ts <= final:
                self.open_goals.pop(goal.event_id, None)
            else:
                self.open_goals[goal.event_id] = now
        return out

    def _attribute(self, index: ReferrerIndex, due: list[Visit]) -> list[Attribution]:
        """The rows of the ``due`` goals under every configured model: a goal's candidate set is
        found once, as a bit mask, and each model takes from it what its own consumption left
        (section 6)."""
        config = self.config
        models = [(m, model_bit(m)) for m in config.models]
        # Per model, the mask of the impressions it has consumed.
        spent = dict.fromkeys(config.models, 0)
        for k, i in enumerate(index.ordered):
            if i.consumed:
                for m, bit in models:
                    if i.consumed & bit:
                        spent[m] |= 1 << k
        rows = []
        for goal in due:
            found = index.candidates(goal, config.lookback_ms)
            trails: dict = {}  # impression event id -> its trail to this goal, shared by models
            for m, bit in models:
                available = found & ~spent[m]
                if not available:
                    rows.append(self._organic(goal, m))
                    continue
                if m == "last_touch":
                    chosen = index.last_of(available)
                elif m == "first_touch":
                    chosen = available & -available
                else:
                    chosen = available
                spent[m] |= chosen
                credited = index.impressions_in(chosen)
                shares = credits(m, [i.ts for i in credited], config.half_life_ms)
                for i, credit in zip(credited, shares):
                    i.consumed |= bit
                    trail = trails.get(i.event_id)
                    if trail is None:
                        trail = trails[i.event_id] = tuple(v.url for v in index.trail(i, goal))
                    rows.append(self._attributed(goal, i, trail, m, credit))
        return rows

    def gc(self, watermark: int) -> int:
        """Drop what no future goal can use (spec section 3); return how many items were dropped.

        Visits go once ``ts < W - L - lookback``; impressions once their dedup bucket ends at or
        before ``W - L - lookback`` (``L``, the allowed lateness, keeps everything a record
        still acceptable may need). Pending goals are never dropped: call ``fire`` first.
        """
        horizon = watermark - self.config.allowed_lateness_ms - self.config.lookback_ms
        window = self.config.dedup_window_ms
        stale_visits = [k for k, v in self.visits.items() if v.ts < horizon and not v.pending
                        and k not in self.open_goals]
        for k in stale_visits:
            del self.visits[k]
        stale_impressions = [g for g in self.impressions if (g[2] + 1) * window <= horizon]
        for g in stale_impressions:
            self._impression_event_ids.discard(self.impressions.pop(g).event_id)
        if stale_impressions and self.superseded:
            # A superseded id lives exactly as long as its logical impression's bucket.
            self.superseded = {k: b for k, b in self.superseded.items()
                               if (b + 1) * window > horizon}
        return len(stale_visits) + len(stale_impressions)

    def expires_at(self) -> Optional[int]:
        """The smallest watermark at which ``gc`` would empty this state, or ``None`` if empty.

        Backends set a timer here so an idle user's state is dropped, not kept forever.
        """
        window = self.config.dedup_window_ms
        keep = self.config.lookback_ms + self.config.allowed_lateness_ms
        ends = [(g[2] + 1) * window + keep for g in self.impressions]
        if self.visits:
            ends.append(self.earliest_expiry(max(v.ts for v in self.visits.values()), self.config))
        return max(ends) if ends else None

    @staticmethod
    def earliest_expiry(max_ts: int, config: AttributionConfig) -> int:
        """When a visit at ``max_ts`` stops mattering, and so a lower bound of ``expires_at`` for
        any state holding an event at ``max_ts`` (an impression lives to its bucket's end): a
        backend can schedule a wake-up for events it has not decoded yet, knowing only their
        times."""
        return max_ts + config.lookback_ms + config.allowed_lateness_ms + 1

    def next_wakeup(self) -> Optional[int]:
        """When this user next needs the engine: its next goal, else the time its state expires.

        With revisions (section 8) the state also asks to see every move of the watermark: it
        then knows the previous micro-batch's watermark, by which lateness and ``emit_timing``
        are judged, and finalizes its open goals in time.
        """
        goal = self.next_timer()
        wakeup = goal if goal is not None else self.expires_at()
        if self.config.revising and self.watermark is not None and wakeup is not None:
            return min(wakeup, self.watermark + 1)
        return wakeup

    def advance(self, watermark: int) -> list[Attribution]:
        """Fire, then garbage-collect, at ``watermark``: what a timer firing does."""
        rows = self.fire(watermark)
        self.gc(watermark)
        return rows

    # -- introspection ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of events held (visits, goals included, plus canonical impressions)."""
        return len(self.visits) + len(self.impressions)

    @property
    def is_empty(self) -> bool:
        return not self.visits and not self.impressions

    # -- helpers ----------------------------------------------------------------------------------
    def _max_watermark(self, watermark: Optional[int]) -> Optional[int]:
        if watermark is None:
            return self.watermark
        if self.watermark is None:
            return watermark
        return max(watermark, self.watermark)

    def _organic(self, goal: Visit, model: str) -> Attribution:
        value = goal.value
        return Attribution(self.user_id, goal.event_id, goal.url, goal.ts,
                           None, None, None, None, None, (), model, 0.0,
                           None, value, None if value is None else 0.0)

    def _attributed(self, goal: Visit, i: Impression, trail: tuple[str, ...], model: str,
                    credit: float) -> Attribution:
        value = goal.value
        return Attribution(self.user_id, goal.event_id, goal.url, goal.ts,
                           i.impression_id, i.event_id, i.source_url, i.target_url, i.ts,
                           trail, model, credit,
                           i.campaign, value, None if value is None else credit * value)

    # -- state bytes --------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Encode the whole state as one versioned blob (see ``STATE_VERSION``).

        A user's URLs repeat (a visit's referer is the previous visit's url, an impression's
        target the visit it led to). Pickle writes an object it has already written as a short
        back-reference, so equal URLs are first made one object: on the benchmark's data the
        blobs shrink by 29%, and every later step that copies, compresses or decodes them has
        less to do.
        """
        url = {}.setdefault  # campaigns repeat too, and are interned the same way
        return _STATE_HEADER + pickle.dumps((
            self.user_id, self.watermark,
            [(v.event_id, v.ts, url(v.url, v.url), v.referer and url(v.referer, v.referer),
              (2 if v.pending else 1) if v.is_goal else 0, v.value)
             for v in self.visits.values()],
            [(i.event_id, i.impression_id, i.ts, url(i.source_url, i.source_url),
              url(i.target_url, i.target_url), i.consumed, i.campaign and url(i.campaign, i.campaign))
             for i in self.impressions.values()],
            list(self.superseded.items()),
            [(goal, [(model, e.revision, [tuple(r) for r in e.rows])
                     for model, e in by_model.items()])
             for goal, by_model in self.open_goals.items()],
        ), protocol=5)

    @classmethod
    def from_bytes(cls, blob: bytes, config: AttributionConfig = AttributionConfig()) -> "UserAttribution":
        """Decode a blob written by ``to_bytes`` of this or an earlier state version."""
        if not blob:
            raise ValueError("empty attribution state blob")
        version = blob[0]
        if version in _AVRO_READERS:
            return cls._from_avro(blob, config)
        if version not in (3, STATE_VERSION):
            raise ValueError(f"attribution state version {version} is newer than this code "
                             f"understands (max {STATE_VERSION})")
        parts = loads_builtins(memoryview(blob)[1:])
        user_id, watermark, visits, impressions, superseded = parts[:5]
        open_goals = parts[5] if len(parts) > 5 else ()
        if version == 3:  # no values or campaigns; "consumed" was last_touch's
            visits = [(*v, None) for v in visits]
            impressions = [(*i[:5], LAST_TOUCH if i[5] else 0, None) for i in impressions]
        # The blob holds a state ``to_bytes`` wrote: its impressions are already the canonical
        # members, so the dedup of ``restore`` is skipped; this runs on every touched user.
        state = cls(user_id, config)
        state.watermark = watermark
        held, pending = state.visits, state.pending_goals
        for event_id, ts, url, referer, goal, value in visits:
            held[event_id] = v = Visit(event_id, ts, url, referer, goal != 0, goal == 2, value)
            if goal == 2:
                pending[event_id] = v
        window, canonical = config.dedup_window_ms, state.impressions
        for event_id, impression_id, ts, source, target, consumed, campaign in impressions:
            canonical[(source, target, ts // window)] = Impression(
                event_id, impression_id, ts, source, target, consumed, campaign)
        state._impression_event_ids = {i[0] for i in impressions}
        state.superseded = dict(superseded)
        for goal, by_model in open_goals:
            state.open_goals[goal] = {
                model: Emitted(revision, tuple(Attribution(*values) for values in rows))
                for model, revision, rows in by_model}
        return state

    @classmethod
    def _from_avro(cls, blob: bytes, config: AttributionConfig) -> "UserAttribution":
        record = fastavro.schemaless_reader(io.BytesIO(blob[1:]), _AVRO_READERS[blob[0]],
                                            _STATE_SCHEMA_V2)
        visits = (Visit(r["event_id"], r["ts"], r["url"], r["referer"], r["goal"] != 0, r["goal"] == 2)
                  for r in record["visits"])
        impressions = (Impression(r["event_id"], r["impression_id"], r["ts"], r["source_url"],
                                  r["target_url"], LAST_TOUCH if r["consumed"] else 0)
                       for r in record["impressions"])
        superseded = {r["event_id"]: r["bucket"] for r in record["superseded"]}
        return cls.restore(record["user_id"], visits, impressions, record["watermark"], config,
                           superseded)

    @classmethod
    def restore(cls, user_id: str, visits: Iterable[Visit], impressions: Iterable[Impression],
                watermark: Optional[int] = None,
                config: AttributionConfig = AttributionConfig(),
                superseded: Optional[dict[str, int]] = None) -> "UserAttribution":
        """Rebuild a state from its parts, as a backend that stores them separately holds them.

        Impressions may include superseded members of a logical impression; only the canonical
        one is kept, the consumed marks of every member stay with the logical impression, and
        the other members' ids join ``superseded`` (event id -> dedup bucket).
        """
        state = cls(user_id, config)
        state.watermark = watermark
        state.superseded.update(superseded or {})
        for v in visits:
            state.visits[v.event_id] = v
            if v.pending:
                state.pending_goals[v.event_id] = v
        window = config.dedup_window_ms
        for i in impressions:
            group = (i.source_url, i.target_url, i.ts // window)
            old = state.impressions.get(group)
            if old is None or i.rank < old.rank:
                if old is not None:
                    i.consumed |= old.consumed
                    state._impression_event_ids.discard(old.event_id)
                    state.superseded[old.event_id] = group[2]
                state.impressions[group] = i
                state._impression_event_ids.add(i.event_id)
            else:
                old.consumed |= i.consumed
                state.superseded[i.event_id] = group[2]
        return state


# Version 4, the current one: a pickle (protocol 5) of built-in values only, read back by an
# unpickler that refuses anything else:
#   (user_id, watermark,
#    [(event_id, ts, url, referer, goal, value)],
#        goal: 0 = plain visit, 1 = attributed, 2 = pending; value: a goal's value or None
#    [(event_id, impression_id, ts, source_url, target_url, consumed, campaign)],
#        canonical impressions; consumed: one bit per model that credited it (config.model_bit)
#    [(event_id, dedup bucket)],             superseded click-spam ids (rule 1)
#    [(goal event_id, [(model, revision, [row values in OUTPUT_FIELDS order])])])
#        with revisions (section 8), what was last emitted for each goal not yet final; a
#        blob without this element has none
# Version 3 had neither values nor campaigns, and a boolean ``consumed``: it knew last_touch
# alone, and reads as last_touch's consumption. Versions 1 and 2, Avro records of version 3's
# fields, are read the same way; pickle replaced them because a streaming backend decodes and
# re-encodes a user's state on every micro-batch that touches it, and pickle's C codec does that
# about 3x faster than fastavro's records.
STATE_VERSION = 4
_STATE_HEADER = bytes([STATE_VERSION])


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler for state blobs: built-in values only, never a class or a callable."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"attribution state may not reference {module}.{name}")


def loads_builtins(data) -> object:
    """Unpickle ``data`` (bytes or a buffer) holding built-in values only: a state blob never
    names a class, so one that does is refused instead of run."""
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

# Writer schemas of the Avro versions (fastavro resolves version 1 to version 2).
_AVRO_READERS = {1: fastavro.parse_schema(_STATE_SCHEMA_V1), 2: _STATE_SCHEMA_V2}
