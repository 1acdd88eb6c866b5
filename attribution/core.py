"""The engine-free attribution state machine for one user: the ch. 7 ``AttributionFn``, fixed.

``UserAttribution`` holds what the DoFn holds (visits, impressions, pending goals and the
min-goal timer) and exposes the DoFn's moves as plain methods:

* ``add(events, watermark)``: buffer a batch of the user's events (late ones are counted and
  dropped; copies of one ``event_id`` resolved by rule 1's order, ``copy_order``);
* ``fire(watermark)``: attribute every pending goal at or below the watermark, in order, under
  every model of the configuration (section 6, the models of ``models.MODEL_TABLE``);
* ``gc(watermark)``: forget what can no longer matter (spec section 3);
* ``next_timer()`` / ``next_wakeup()``: when the state next needs the engine;
* ``snapshot()`` / ``from_snapshot()``: the whole state as plain values, and back;
  ``to_bytes()`` / ``from_bytes()`` put them in the versioned blob of ``state_codec``.

A Spark backend is an adapter: state bytes and events in, rows and a timer out. The rows are
``rows.Attribution``; the changelog of revised rows is ``revisions``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from .config import AttributionConfig
from .events import Event
from .models import MODEL_BITS, MODEL_TABLE, model_bit
from .paths import BY_TIME, Impression, ReferrerIndex, Visit
from .revisions import Emitted, emit_timing, retract, revise
from .rows import CHANGELOG_DEFAULTS, Attribution, make_row
from .state_codec import STATE_VERSION, Snapshot, decode, encode

# The watermark of batch mode: past every event time (year ~146 million), yet far from overflow.
WATERMARK_INFINITY = 2 ** 62

# Also importable from here: the row type and the version ``to_bytes`` writes.
__all__ = ["AddResult", "Attribution", "STATE_VERSION", "UserAttribution", "WATERMARK_INFINITY",
           "copy_order"]


def copy_order(record: Union[Visit, Impression]) -> tuple:
    """Rule 1's total order on the copies of one record: the copy with the smallest key is the
    one kept, whatever the arrival order.

    The key is ``ts``, then ``event_type`` as text (``impression`` before ``visit``), then the
    type's own fields in the event schema's order: ``impression_id``, ``source_url``,
    ``target_url``, ``campaign`` for an impression; ``url``, ``referer``, ``is_goal``, ``value``
    for a visit (a value counts on goals only, as only goals keep one). A missing value comes
    before any value, ``false`` before ``true``, text compares by code points and ``-0.0`` comes
    before ``0.0``. Two copies with equal keys hold the same stored record.

    :param record: one copy of a visit or an impression.
    """
    if isinstance(record, Impression):
        return (record.ts, "impression", record.impression_id, record.source_url,
                record.target_url, _nullable(record.campaign))
    value = record.value
    return (record.ts, "visit", record.url, _nullable(record.referer), record.is_goal,
            () if value is None else (value, math.copysign(1.0, value)))


def _bucket(member: Union[Impression, int], window: int) -> int:
    """The dedup bucket of a superseded member (``UserAttribution.superseded``)."""
    return member if isinstance(member, int) else member.ts // window


def _nullable(text: Optional[str]) -> tuple:
    """A value that may be missing, as a key in which missing comes first."""
    return () if text is None else (text,)


@dataclass(frozen=True, slots=True)
class AddResult:
    """What ``add`` did with a batch: stored (``accepted``: visits and canonical impressions),
    dropped as copies (``duplicates``: copies no smaller than the one held, rule 1, and
    click-spam members that are not canonical, rule 3), dropped as too late (``late``); how many
    records behind the watermark were within the allowed lateness (``late_accepted``: used like
    any record, so some may be copies); and how many records took the place of a larger copy
    held before (``replaced``, rule 1; each also counted as accepted or as a click-spam member).
    """

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    late_accepted: int = 0
    replaced: int = 0


class UserAttribution:
    """The attribution state of one user and the rules that act on it.

    **Call protocol.** A backend keeps one instance per user key and drives it, for each
    micro-batch ``k`` that touches the key (its records, or a timer that came due), in this
    order:

    1. *Load*: ``UserAttribution(user_id, config)`` for a user with no state, else
       ``from_bytes`` / ``from_snapshot`` / ``restore`` of what was stored, under the
       configuration the state was written with (a checkpoint pins it).
    2. *Add*: ``add(records, W[k-1])`` with the micro-batch's records of the user, in any order
       and in any number of calls, before anything fires at ``W[k]`` (a timer call adds none).
    3. *Advance*: ``advance(W[k], previous=W[k-1])``, once: ``fire`` then ``gc``. Its rows are
       the user's output for the micro-batch, in order; all of them are emitted.
    4. *Store*: if ``is_empty``, drop the stored state and its timer; otherwise store
       ``to_bytes()`` (or the entries of ``snapshot()``) and set the timer to
       ``next_wakeup()``.

    Nothing else is needed between calls, and the order is not optional: ``gc`` before
    ``fire`` would drop visits a due goal still needs, and records added after a firing at
    ``W[k]`` count as late for ``W[k]``. Watermarks never go back: a lower one than the state
    has seen is read as the highest seen. The batch oracle is the same protocol run once, with
    every record and ``W = WATERMARK_INFINITY``.

    **Invariants** (hold between calls; ``check_invariants`` tests those it can see):

    * ``visits`` holds one visit per event id; ``pending_goals`` is exactly its goals that
      still await attribution (``pending``), so ``next_timer`` is the earliest of them.
    * ``impressions`` holds one canonical member per logical impression
      ``(source_url, target_url, ts // dedup_window)`` (rule 3), and ``_canonical`` holds the
      same records by event id. Every whole member of ``superseded`` belongs to a logical
      impression held, and ranks after its canonical member.
    * An event id is held at most once: in ``visits``, ``_canonical`` or ``superseded``.
    * ``watermark`` is the highest watermark given; every record at or below
      ``watermark - allowed_lateness`` was dropped on arrival.
    * An impression's ``consumed`` has the bit of each model that credited it to a goal that
      fired (``models.model_bit``); with revisions, ``open_goals`` holds what was emitted for
      each goal that is not final yet, and ``gc`` keeps those goals' visits.

    The attributes are the rules' storage: adapters and other code read the state through
    ``snapshot()`` and the methods, never through them.
    """

    def __init__(self, user_id: str, config: AttributionConfig = AttributionConfig()):
        """An empty state for one user.

        :param user_id: the user whose events this state holds.
        :param config: the attribution rules' parameters.
        """
        self.user_id = user_id
        self.config = config
        self.visits: dict[str, Visit] = {}
        # One canonical impression per logical impression: (source, target, bucket) -> impression.
        self.impressions: dict[tuple[str, str, int], Impression] = {}
        self.pending_goals: dict[str, Visit] = {}
        # The canonical impressions by event id (the values of ``impressions``).
        self._canonical: dict[str, Impression] = {}
        # Click-spam members that lost to their logical impression's canonical one, by event id:
        # kept whole, so that a copy of one is judged by rule 1 and the best of them takes over
        # if the canonical one is replaced by a copy outside its group. A state written by an
        # earlier version kept only their dedup bucket (an int here): such an id keeps the copy
        # it has, as the rule of that version did.
        self.superseded: dict[str, Union[Impression, int]] = {}
        # The highest watermark this user has been advanced to; events at or below it are late.
        self.watermark: Optional[int] = None
        # With revisions (section 8): what was emitted for each goal not yet final, per model.
        self.open_goals: dict[str, dict[str, Emitted]] = {}

    # -- events in ------------------------------------------------------------------------------
    def add(self, events: Iterable[Event], watermark: Optional[int] = None) -> AddResult:
        """Buffer a batch of this user's events.

        :param events: the user's records, in any order.
        :param watermark: the watermark in force when they arrived (``W[k-1]``); by default the
            last one this state fired at. It becomes this state's watermark if it is higher.

        Events with ``ts <= W`` are late. Without allowed lateness they are counted and dropped,
        never used; with allowed lateness ``L`` only those with ``ts <= W - L`` are, and the
        others are used like any record (``fire`` revises the rows they change). Heartbeats are
        ignored. Of the copies of one ``event_id``, the one smallest in ``copy_order`` is kept
        (rule 1): a copy no smaller than the one held is dropped, a smaller one replaces it. An
        impression that is not the canonical member of its logical impression is dropped from
        the candidates too, and counted with the duplicates (rule 3).
        """
        limit = self.watermark = self._max_watermark(watermark)
        drop_limit = None if limit is None else limit - self.config.allowed_lateness_ms
        accepted = duplicates = late = late_accepted = replaced = 0
        # Locals: this loop runs once per record of every batch.
        visits, canonical, superseded = self.visits, self._canonical, self.superseded
        pending_goals = self.pending_goals
        for e in events:
            event_type, ts, event_id = e.event_type, e.ts, e.event_id
            if event_type == "heartbeat":
                continue
            if drop_limit is not None and ts <= drop_limit:
                late += 1
                continue
            if limit is not None and ts <= limit:
                late_accepted += 1
            if event_type == "visit":
                goal = e.is_goal
                record = Visit(event_id, ts, e.url, e.referer, goal, goal,
                               e.value if goal else None)
            else:
                record = Impression(event_id, e.impression_id, ts, e.source_url, e.target_url,
                                    campaign=e.campaign)
            held = visits.get(event_id) or canonical.get(event_id)  # ``_held``, inlined
            if held is None:
                held = superseded.get(event_id)
            if held is not None:
                if isinstance(held, int) or copy_order(held) <= copy_order(record):
                    duplicates += 1
                    continue
                self._forget(held)
                replaced += 1
            if event_type == "visit":
                visits[event_id] = record
                if record.pending:
                    pending_goals[event_id] = record
                accepted += 1
            elif self._add_impression(record):
                accepted += 1
            else:
                duplicates += 1
        return AddResult(accepted, duplicates, late, late_accepted, replaced)

    def _group(self, i: Impression) -> tuple[str, str, int]:
        """The logical impression of ``i`` (rule 3): ``(source_url, target_url, dedup bucket)``."""
        return (i.source_url, i.target_url, i.ts // self.config.dedup_window_ms)

    def _add_impression(self, new: Impression) -> bool:
        """Keep ``new`` if it becomes its logical impression's canonical member (rule 3)."""
        group = self._group(new)
        old = self.impressions.get(group)
        if old is not None:
            if old.rank <= new.rank:
                self.superseded[new.event_id] = new  # a click-spam copy of an earlier click
                return False
            # A consumed logical impression stays consumed (reachable with late data only).
            new.consumed, old.consumed = old.consumed, 0
            del self._canonical[old.event_id]
            self.superseded[old.event_id] = old
        self.impressions[group] = new
        self._canonical[new.event_id] = new
        return True

    def _forget(self, held: Union[Visit, Impression]) -> None:
        """Drop ``held``, a copy that a smaller copy of its record replaces (rule 1).

        A canonical impression hands its logical impression, consumed marks included, to the
        best member left of its group, if any. The held copy is never one a final goal used: a
        replacing copy is accepted, so ``ts > W - L``, and the held one is no earlier.
        """
        if isinstance(held, Visit):
            del self.visits[held.event_id]
            self.pending_goals.pop(held.event_id, None)
            return
        if self._canonical.get(held.event_id) is not held:
            del self.superseded[held.event_id]
            return
        del self._canonical[held.event_id]
        group = self._group(held)
        del self.impressions[group]
        members = [m for m in self.superseded.values()
                   if isinstance(m, Impression) and self._group(m) == group]
        if members:
            best = min(members, key=lambda m: m.rank)
            del self.superseded[best.event_id]
            best.consumed = held.consumed
            self.impressions[group] = best
            self._canonical[best.event_id] = best

    def _held(self, event_id: str) -> Union[Visit, Impression, int, None]:
        """The copy of ``event_id`` this state holds (an int: a superseded id of an earlier
        version, its content unknown), or None."""
        held = self.visits.get(event_id) or self._canonical.get(event_id)
        return self.superseded.get(event_id) if held is None else held

    # -- firing: attribution and revisions ------------------------------------------------------
    def next_timer(self) -> Optional[int]:
        """The min-goal timer: the earliest pending goal's ``ts``, or ``None`` when none is
        pending."""
        if not self.pending_goals:
            return None
        return min(g.ts for g in self.pending_goals.values())

    def fire(self, watermark: int, previous: Optional[int] = None,
             multi_candidate: Optional[dict[str, int]] = None) -> list[Attribution]:
        """Attribute every pending goal with ``ts <= watermark`` in ``(ts, event_id)`` order
        (rule 7): per goal, the rows of every configured model, in ``config.MODELS`` order.

        With allowed lateness or early results the rows are a changelog (section 8): see
        ``_revise``.

        :param watermark: ``W[k]``, the watermark to fire at.
        :param previous: ``W[k-1]``, the watermark in force when the micro-batch's records
            arrived, if the caller knows it; it judges ``emit_timing``. By default the highest
            watermark this state has seen, which is ``W[k-1]`` for a state that saw every move
            of the watermark.
        :param multi_candidate: if given, a count per model that is raised by one for each goal
            computed here with two or more candidates under the model (rule 4 with the model's
            own consumption), i.e. a goal whose credit the model could split. A goal revised
            by a later firing is counted again.
        """
        previous = self._max_watermark(previous)
        self.watermark = self._max_watermark(watermark)
        if self.config.revising:
            return self._revise(previous, self.watermark, multi_candidate)
        due = sorted((g for g in self.pending_goals.values() if g.ts <= watermark), key=BY_TIME)
        if not due:
            return []
        rows = self._attribute(ReferrerIndex(self.visits.values(), self.impressions.values()),
                               due, multi_candidate)
        for goal in due:
            goal.pending = False
            del self.pending_goals[goal.event_id]
        return rows

    def _revise(self, previous: Optional[int], watermark: int,
                multi_candidate: Optional[dict[str, int]] = None) -> list[Attribution]:
        """Section 8: recompute every goal of the table that is not final, in goal order, from
        the consumption final goals left, and emit what changed.

        The table's goals are the due ones (``ts <= watermark``), or every goal with early
        results. A goal is final once ``ts <= watermark - L``: no record that can still be
        accepted can change it, so what was emitted for it is forgotten and what it consumed
        stays consumed for good.

        A goal emitted before may be gone: a smaller copy of its record that is no goal took
        its place (rule 1). Its rows are retracted; its revision count is kept until the copy
        held is final, as a smaller copy that is a goal may still arrive until then.
        """
        config = self.config
        goals = {g.event_id: g for g in self.pending_goals.values()
                 if config.early_results or g.ts <= watermark}
        gone = []
        for event_id in self.open_goals:
            goal = self.visits.get(event_id)
            if goal is None or not goal.is_goal:
                gone.append(event_id)
                continue
            goals[event_id] = goal
            goal.pending = True  # awaits attribution again (the candidate sweep asks for it)
        if not goals and not gone:
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
        ordered = sorted(goals.values(), key=BY_TIME)
        computed: dict[tuple[str, str], list[Attribution]] = {}
        index = ReferrerIndex(self.visits.values(), self.impressions.values())
        for row in self._attribute(index, ordered, multi_candidate):
            computed.setdefault((row.goal_event_id, row.model), []).append(row)
        out: list[Attribution] = []
        final = watermark - config.allowed_lateness_ms
        for event_id in gone:
            by_model = self.open_goals[event_id]
            for model, emitted in by_model.items():
                entries, by_model[model] = retract(emitted)
                out.extend(entries)
            held = self._held(event_id)
            if held is None or isinstance(held, int) or held.ts <= final:
                del self.open_goals[event_id]
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

    def _attribute(self, index: ReferrerIndex, due: list[Visit],
                   multi_candidate: Optional[dict[str, int]] = None) -> list[Attribution]:
        """The rows of the ``due`` goals under every configured model: a goal's candidate set is
        found once, as a bit mask, and each model takes from it what its own consumption left
        (section 6). ``multi_candidate``: see ``fire``."""
        config = self.config
        # Per model: its name, bit, choice, credit rule and the values of its options.
        models = [(m, MODEL_BITS[m], spec.choose, spec.credits,
                   tuple(getattr(config, option) for option in spec.options))
                  for m, spec in ((m, MODEL_TABLE[m]) for m in config.models)]
        # Per model, the mask of the impressions it has consumed.
        spent = dict.fromkeys(config.models, 0)
        for k, i in enumerate(index.ordered):
            if i.consumed:
                for m, bit, *_ in models:
                    if i.consumed & bit:
                        spent[m] |= 1 << k
        rows = []
        # Locals: this loop runs once per goal and model of every firing.
        lookback = config.lookback_ms
        candidates, organic, attributed = index.candidates, self._organic, self._attributed
        for goal in due:
            found = candidates(goal, lookback)
            if not found:
                rows.extend([organic(goal, m) for m in config.models])
                continue
            # Shared by the models of this goal: a chosen set's impressions (the models crediting
            # every candidate usually choose the same set), and an impression's trail.
            listed: dict = {}
            trails: dict = {}
            for m, bit, choose, credits, options in models:
                available = found & ~spent[m]
                if not available:
                    rows.append(organic(goal, m))
                    continue
                if multi_candidate is not None and available & (available - 1):  # 2+ bits set
                    multi_candidate[m] = multi_candidate.get(m, 0) + 1
                chosen = choose(index, available)
                spent[m] |= chosen
                credited = listed.get(chosen)
                if credited is None:
                    credited = listed[chosen] = index.impressions_in(chosen)
                shares = credits([i.ts for i in credited], *options)
                for i, credit in zip(credited, shares):
                    i.consumed |= bit
                    trail = trails.get(i.event_id)
                    if trail is None:
                        trail = trails[i.event_id] = tuple(v.url for v in index.trail(i, goal))
                    rows.append(attributed(goal, i, trail, m, credit))
        return rows

    # -- lifecycle: garbage collection and wake-ups ----------------------------------------------
    def gc(self, watermark: int) -> int:
        """Drop what no future goal can use (spec section 3); return how many items were dropped.

        Visits go once ``ts < W - L - lookback``; impressions once their dedup bucket ends at or
        before ``W - L - lookback`` (``L``, the allowed lateness, keeps everything a record
        still acceptable may need). Pending goals are never dropped: call ``fire`` first.

        :param watermark: the event-time watermark, in epoch milliseconds.
        """
        horizon = watermark - self.config.allowed_lateness_ms - self.config.lookback_ms
        window = self.config.dedup_window_ms
        stale_visits = [k for k, v in self.visits.items() if v.ts < horizon and not v.pending
                        and k not in self.open_goals]
        for k in stale_visits:
            del self.visits[k]
        stale_impressions = [g for g in self.impressions if (g[2] + 1) * window <= horizon]
        for g in stale_impressions:
            del self._canonical[self.impressions.pop(g).event_id]
        if stale_impressions and self.superseded:
            # A superseded member lives exactly as long as its logical impression's bucket.
            self.superseded = {k: m for k, m in self.superseded.items()
                               if (_bucket(m, window) + 1) * window > horizon}
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
        times.

        :param max_ts: the latest event time held, in epoch milliseconds.
        :param config: the attribution rules' parameters (its lookback and allowed lateness count).
        """
        return max_ts + config.lookback_ms + config.allowed_lateness_ms + 1

    def next_wakeup(self, every_move: bool = False) -> Optional[int]:
        """When this user next needs the engine: the watermark at which something can happen
        to its state, or ``None`` when it is empty.

        That is its earliest pending goal (due; with early results, emitted early and due for
        its on-time revision), else the time its state expires. With revisions (section 8) it
        is also the time its earliest open goal becomes final (``g.ts <= W - L``), when what was
        emitted for it can be dropped. Records that arrive never need a wake-up: the backend
        hands them over with their micro-batch, early results included.

        :param every_move: with revisions, also wake at the watermark's next move. A backend
            that keeps one user per key learns ``W[k-1]``, by which ``emit_timing`` is judged,
            only from the calls it gets; one that tracks the watermark elsewhere passes
            ``previous`` to ``fire``/``advance`` instead.
        """
        goal = self.next_timer()
        wakeup = goal if goal is not None else self.expires_at()
        if not self.config.revising or wakeup is None:
            return wakeup
        if self.open_goals:
            # An open goal may be held as another copy now: a smaller one that is no goal took
            # its place, and its retraction is revised until that copy is final (``fire``).
            lateness = self.config.allowed_lateness_ms
            held = [self._held(g) for g in self.open_goals]
            known = [h.ts for h in held if h is not None and not isinstance(h, int)]
            if known:
                wakeup = min(wakeup, min(known) + lateness)
            if len(known) < len(held) and self.watermark is not None:
                wakeup = min(wakeup, self.watermark + 1)  # fire drops an entry of no copy
        if every_move and self.watermark is not None:
            wakeup = min(wakeup, self.watermark + 1)
        return wakeup

    def advance(self, watermark: int, previous: Optional[int] = None) -> list[Attribution]:
        """Fire, then garbage-collect, at ``watermark``: what a timer firing does (``previous``:
        see ``fire``).

        :param watermark: the event-time watermark, in epoch milliseconds.
        :param previous: the watermark of the previous firing, or ``None`` (see ``fire``).
        """
        rows = self.fire(watermark, previous)
        self.gc(watermark)
        return rows

    # -- introspection ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of events held (visits, goals included, plus canonical impressions)."""
        return len(self.visits) + len(self.impressions)

    @property
    def is_empty(self) -> bool:
        """True when the state holds nothing: the backend drops it and its timer."""
        return not self.visits and not self.impressions

    def check_invariants(self) -> None:
        """Check the invariants of the class docstring on this state (for tests: it costs a
        pass over everything held).

        :raises AssertionError: naming the invariant that does not hold.
        """
        def require(holds: bool, what: str) -> None:
            if not holds:
                raise AssertionError(f"user {self.user_id}: {what}")

        require(all(k == v.event_id for k, v in self.visits.items()),
                "visits are not keyed by their event ids")
        require(self.pending_goals == {k: v for k, v in self.visits.items() if v.pending},
                "pending_goals is not the pending visits")
        require(all(v.is_goal for v in self.pending_goals.values()), "a pending visit is no goal")
        require(all(self._group(i) == g for g, i in self.impressions.items()),
                "an impression is held under another logical impression")
        require(self._canonical == {i.event_id: i for i in self.impressions.values()},
                "_canonical is not the canonical impressions by event id")
        for k, m in self.superseded.items():
            if isinstance(m, int):
                continue
            canonical = self.impressions.get(self._group(m))
            require(k == m.event_id and canonical is not None and canonical.rank < m.rank,
                    f"superseded member {k} has no canonical member ranking before it")
        require(not (self.visits.keys() & self._canonical.keys())
                and not (self.visits.keys() & self.superseded.keys())
                and not (self._canonical.keys() & self.superseded.keys()),
                "an event id is held twice")
        every = sum(MODEL_BITS.values())
        require(all(not i.consumed & ~every for i in self.impressions.values()),
                "a consumption mark has a bit of no model")

    # -- helpers ----------------------------------------------------------------------------------
    def _max_watermark(self, watermark: Optional[int]) -> Optional[int]:
        if watermark is None:
            return self.watermark
        if self.watermark is None:
            return watermark
        return max(watermark, self.watermark)

    # Rows are built with ``_make`` from every field in order (the last three, the revision
    # columns, at their defaults): it skips the Python frame of the named tuple's constructor,
    # and a firing builds one row per goal and model.
    def _organic(self, goal: Visit, model: str) -> Attribution:
        value = goal.value
        return make_row((self.user_id, goal.event_id, goal.url, goal.ts,
                         None, None, None, None, None, (), model, 0.0,
                         None, value, None if value is None else 0.0, *CHANGELOG_DEFAULTS))

    def _attributed(self, goal: Visit, i: Impression, trail: tuple[str, ...], model: str,
                    credit: float) -> Attribution:
        value = goal.value
        return make_row((self.user_id, goal.event_id, goal.url, goal.ts,
                         i.impression_id, i.event_id, i.source_url, i.target_url, i.ts,
                         trail, model, credit,
                         i.campaign, value, None if value is None else credit * value,
                         *CHANGELOG_DEFAULTS))


    # -- the state as values and as bytes ------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Everything this state holds, as plain values (``state_codec.Snapshot``): what a
        backend stores, entry by entry or as one blob. A view of this state: read it before the
        next move, never change it."""
        return Snapshot(self.user_id, self.watermark, self.visits.values(),
                        self.impressions.values(), self.superseded, self.open_goals)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot,
                      config: AttributionConfig = AttributionConfig()) -> "UserAttribution":
        """The state a snapshot holds, under ``config`` (the one it was taken under).

        :param snapshot: the contents; its records become this state's own (not copied).
        :param config: the rules' parameters.
        """
        if not snapshot.deduplicated:
            state = cls.restore(snapshot.user_id, snapshot.visits,
                                [*snapshot.impressions, *snapshot.superseded_members],
                                snapshot.watermark, config, snapshot.superseded_buckets)
        else:
            # Its impressions are already the canonical members, so the dedup of ``restore`` is
            # skipped: this runs on every touched user of every micro-batch.
            state = cls(snapshot.user_id, config)
            state.watermark = snapshot.watermark
            state.visits = visits = {v.event_id: v for v in snapshot.visits}
            state.pending_goals = {k: v for k, v in visits.items() if v.pending}
            window = config.dedup_window_ms
            state.impressions = {(i.source_url, i.target_url, i.ts // window): i
                                 for i in snapshot.impressions}
            state._canonical = {i.event_id: i for i in snapshot.impressions}
            state.superseded = dict(snapshot.superseded)
        state.open_goals = {goal: dict(by_model)
                            for goal, by_model in snapshot.open_goals.items()}
        return state

    def to_bytes(self) -> bytes:
        """The whole state as one versioned blob (``state_codec.encode``, ``STATE_VERSION``)."""
        return encode(self.snapshot())

    @classmethod
    def from_bytes(cls, blob: bytes,
                   config: AttributionConfig = AttributionConfig()) -> "UserAttribution":
        """Decode a blob written by ``to_bytes`` of this or an earlier state version.

        :param blob: the blob.
        :param config: the rules' parameters (the ones the blob was written under).
        :raises ValueError: an empty blob, or one of a newer version than this code knows.
        """
        return cls.from_snapshot(decode(blob), config)

    @classmethod
    def restore(cls, user_id: str, visits: Iterable[Visit], impressions: Iterable[Impression],
                watermark: Optional[int] = None,
                config: AttributionConfig = AttributionConfig(),
                superseded: Optional[dict[str, int]] = None) -> "UserAttribution":
        """Rebuild a state from its parts, as a backend that stores them separately holds them.

        :param user_id: the user.
        :param visits: the visits held, one per event id.
        :param impressions: the impressions held, canonical members and the click-spam members
            that lost to them alike: the canonical one of each logical impression is found
            again, the consumed marks of every member stay with the logical impression, and the
            other members become ``superseded``.
        :param watermark: the highest watermark the state was advanced to, if known.
        :param config: the rules' parameters.
        :param superseded: ids of superseded members whose contents a state of an earlier
            version did not keep, with their dedup bucket.
        """
        state = cls(user_id, config)
        state.watermark = watermark
        state.superseded.update(superseded or {})
        for v in visits:
            state.visits[v.event_id] = v
            if v.pending:
                state.pending_goals[v.event_id] = v
        for i in impressions:
            group = state._group(i)
            old = state.impressions.get(group)
            marks = i.consumed if old is None else i.consumed | old.consumed
            i.consumed = 0
            state._add_impression(i)
            state.impressions[group].consumed = marks
        return state
