"""The ``transformWithState`` backend: ``StatefulProcessor``s in event-time mode.

Two state layouts, the same rules (the engine-free core) and the same timer:

* ``CompactAttributionProcessor`` (what the job runs): per user, one value state holding the
  core's versioned blob (``to_bytes``) and the registered timer. Every state call of the
  Python ``transformWithState`` API is a round trip to the JVM's state server; a call here makes
  two (one read, one write), plus timer calls only when the wake-up moves. The benchmark's levers
  (``python -m benchmarks.streaming --levers``) measured the declared layout below spending more
  CPU on those round trips than on the attribution itself.
* ``AttributionProcessor``: the state declared, not hidden in a blob, so it can be read entry by
  entry (e.g. with Spark's state data source):

  * ``visits``: list state, one entry per stored visit (goals included);
  * ``impressions``: list state, one entry per impression held: the canonical ones and the
    click-spam members that lost to them (rule 3), which ``UserAttribution.restore`` sorts out
    again, so that a copy of a member is judged by rule 1;
  * ``spent``: list state of event ids whose one-shot fact has happened: a goal that was
    attributed, or an impression that ``last_touch`` consumed;
  * ``consumed``: list state of ``(event id, models)``: an impression and the consumption bits
    (``models.model_bit``) it had when a model other than ``last_touch`` consumed it. The
    entries of one impression add up (their bits are or-ed); a ``last_touch``-only run writes
    none, so its state is the same as before other models existed;
  * ``campaigns``: list state of ``(event id, campaign)`` for impressions that have one;
  * ``goal_values``: list state of ``(event id, value)`` for goals that have one;
  * ``superseded``: list state of ``(event id, dedup bucket)`` of click-spam members kept by
    an earlier layout, which stored their ids alone: such an id keeps the copy it has; never
    appended to, it empties as garbage collection drops the buckets;
  * ``wakeup``: value state holding the min pending goal (the min-goal timer) and the registered
    timer, so the timer can be replaced without listing timers.

  Entries are immutable facts, so a micro-batch touches state with at most one ``appendList``
  per list; only garbage collection, or a copy that replaces a larger one (rule 1), removes
  entries, and then the lists are rewritten with one ``put`` each.
  Spark's row count sums the entries of all five, so a call that adds or removes its user says
  so in a marker row (``frames.STATE_USERS_CHANGE``, one more output column).

Spark fires an event-time timer once the watermark is ``>=`` its expiry, so the timer is
registered at the next wake-up itself: the min pending goal or, with none pending, the watermark
at which garbage collection empties the state.
"""
from __future__ import annotations

from typing import Iterator, Optional

from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from ..config import AttributionConfig
from ..core import UserAttribution
from ..models import LAST_TOUCH
from ..paths import Impression, Visit
from .frames import (
    events_from_rows,
    on_time_watermark,
    row_to_spark,
    spark_timer,
    users_change_row,
)

VISIT_STATE = "event_id string, ts long, url string, referer string, is_goal boolean"
IMPRESSION_STATE = ("event_id string, impression_id long, ts long, source_url string, "
                    "target_url string")
SPENT_STATE = "event_id string"
CONSUMED_STATE = "event_id string, models long"
CAMPAIGN_STATE = "event_id string, campaign string"
GOAL_VALUE_STATE = "event_id string, value double"
SUPERSEDED_STATE = "event_id string, bucket long"
WAKEUP_STATE = "min_goal long, timer long"


class _Loaded:
    """The entries in state before this call, to write back only the difference."""

    __slots__ = ("visits", "impressions", "campaigns", "goal_values", "spent", "consumed",
                 "superseded")

    def __init__(self, visits: set, impressions: set, campaigns: set, goal_values: set,
                 spent: set, consumed: dict, superseded: set):
        self.visits = visits
        self.impressions = impressions
        self.campaigns = campaigns
        self.goal_values = goal_values
        self.spent = spent
        self.consumed = consumed
        self.superseded = superseded


class AttributionProcessor(StatefulProcessor):
    """Conversion attribution per ``user_id`` (Row mode, for ``transformWithState``).

    Its declared entries hold no emitted rows, so it does not revise (section 8): a
    configuration with allowed lateness or early results is refused.
    """

    def __init__(self, config: AttributionConfig = AttributionConfig()):
        """A processor for ``config``; one that revises rows is refused.

        :param config: the attribution rules' parameters.
        """
        if config.revising:
            raise ValueError("transformWithState's declared state layout cannot revise rows; "
                             "use --tws-state compact for --allowed-lateness or --early-results")
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state entries.

        :param handle: Spark's handle to the processor's state and timers.
        """
        self.handle = handle
        self.visits = handle.getListState("visits", VISIT_STATE)
        self.impressions = handle.getListState("impressions", IMPRESSION_STATE)
        self.spent = handle.getListState("spent", SPENT_STATE)
        self.consumed = handle.getListState("consumed", CONSUMED_STATE)
        self.campaigns = handle.getListState("campaigns", CAMPAIGN_STATE)
        self.goal_values = handle.getListState("goal_values", GOAL_VALUE_STATE)
        self.superseded = handle.getListState("superseded", SUPERSEDED_STATE)
        self.wakeup = handle.getValueState("wakeup", WAKEUP_STATE)

    def handleInputRows(self, key, rows, timerValues: TimerValues) -> Iterator:
        """Add a user's new events, then fire and garbage-collect at the watermark.

        :param key: the grouping key, ``(user_id,)``.
        :param rows: the user's new rows, with ``INPUT_COLUMNS``.
        :param timerValues: Spark's current watermark and processing time.
        """
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, loaded = self._load(key[0])
        # Spark filtered late rows already (by the previous batch's watermark); the rest are
        # added before any goal at or below ``watermark`` fires, as the streaming rules require.
        core.add(events_from_rows(rows))
        return self._advance(core, loaded, watermark)

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator:
        """Fire and garbage-collect a user's state at the watermark.

        :param key: the grouping key, ``(user_id,)``.
        :param timerValues: Spark's current watermark and processing time.
        :param expiredTimerInfo: the timer that fired (not read: the watermark decides what fires).
        """
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, loaded = self._load(key[0])
        return self._advance(core, loaded, watermark)

    def close(self) -> None:
        pass

    # -- state <-> core ---------------------------------------------------------------------------
    def _load(self, user_id: str) -> tuple[UserAttribution, _Loaded]:
        # Every state call is a round trip to the JVM; get() on a missing list or value yields
        # nothing (or None), so no exists() call is needed first.
        spent = {r[0] for r in self.spent.get()}
        consumed: dict = {}
        for event_id, models in self.consumed.get():
            consumed[event_id] = consumed.get(event_id, 0) | models
        campaign_entries = [tuple(r) for r in self.campaigns.get()]
        value_entries = [tuple(r) for r in self.goal_values.get()]
        visit_entries = [tuple(r) for r in self.visits.get()]
        impression_entries = [tuple(r) for r in self.impressions.get()]
        superseded = [tuple(r) for r in self.superseded.get()]
        campaigns, values = dict(campaign_entries), dict(value_entries)
        visits = [Visit(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[4]) and r[0] not in spent,
                        values.get(r[0]))
                  for r in visit_entries]
        impressions = [Impression(r[0], r[1], r[2], r[3], r[4],
                                  (LAST_TOUCH if r[0] in spent else 0) | consumed.get(r[0], 0),
                                  campaigns.get(r[0]))
                       for r in impression_entries]
        loaded = _Loaded(set(visit_entries), set(impression_entries), set(campaign_entries),
                         set(value_entries), spent, consumed, set(superseded))
        core = UserAttribution.restore(user_id, visits, impressions, config=self.config,
                                       superseded=dict(superseded))
        return core, loaded

    def _advance(self, core: UserAttribution, loaded: _Loaded, watermark: int) -> Iterator:
        rows = core.advance(watermark)
        if core.is_empty:
            self._clear()
        else:
            self._store(core, loaded)
            self._set_timer(core.next_timer(), spark_timer(core.next_wakeup(), self.config))
        out = [row_to_spark(r, users_change_column=True) for r in rows]
        held_before = bool(loaded.visits or loaded.impressions)
        if held_before == core.is_empty:  # the user arrived in state, or left it
            out.append(users_change_row(-1 if held_before else 1))
        return iter(out)

    def _store(self, core: UserAttribution, loaded: _Loaded) -> None:
        snapshot = core.snapshot()
        held = [*snapshot.impressions, *snapshot.superseded_members]
        spent = {g.event_id for g in snapshot.visits if g.is_goal and not g.pending}
        spent.update(i.event_id for i in snapshot.impressions if i.consumed & LAST_TOUCH)
        # The other models' consumption, as it stands (see ``consumed`` in the module docstring).
        consumed = {i.event_id: i.consumed for i in snapshot.impressions
                    if i.consumed & ~LAST_TOUCH}
        # Per list: its state, its entries now, and those it held before this call.
        lists = [
            (self.visits, [_visit_entry(v) for v in snapshot.visits], loaded.visits),
            (self.impressions, [_impression_entry(i) for i in held], loaded.impressions),
            (self.campaigns, _campaign_entries(held), loaded.campaigns),
            (self.goal_values, _goal_value_entries(snapshot.visits), loaded.goal_values),
            (self.superseded, list(snapshot.superseded_buckets.items()), loaded.superseded),
        ]
        if any(not before <= set(now) for _, now, before in lists):
            # An entry left (garbage collection, or a copy replaced by a smaller one, rule 1):
            # every list is rewritten, one put each.
            for state, now, _ in lists:
                self._put_or_clear(state, now)
            self._put_or_clear(self.spent, [(s,) for s in spent])
            self._put_or_clear(self.consumed, list(consumed.items()))
            return
        lists += [(self.spent, [(s,) for s in spent], {(s,) for s in loaded.spent}),
                  (self.consumed, [(k, bits) for k, bits in consumed.items()
                                   if bits & ~loaded.consumed.get(k, 0)], set())]
        for state, now, before in lists:
            new = [e for e in now if e not in before]
            if new:
                state.appendList(new)

    @staticmethod
    def _put_or_clear(state, entries: list) -> None:
        if entries:
            state.put(entries)
        else:
            state.clear()

    def _set_timer(self, min_goal: Optional[int], timer: int) -> None:
        old = self.wakeup.get()
        if old is not None and old[1] == timer and old[0] == min_goal:
            return
        if old is not None and old[1] != timer:
            self.handle.deleteTimer(old[1])
        if old is None or old[1] != timer:
            self.handle.registerTimer(timer)
        self.wakeup.update((min_goal, timer))

    def _clear(self) -> None:
        old = self.wakeup.get()
        if old is not None:
            self.handle.deleteTimer(old[1])
        for state in (self.visits, self.impressions, self.spent, self.consumed, self.campaigns,
                      self.goal_values, self.superseded, self.wakeup):
            state.clear()


def _visit_entry(v: Visit) -> tuple:
    return (v.event_id, v.ts, v.url, v.referer, v.is_goal)


def _impression_entry(i: Impression) -> tuple:
    return (i.event_id, i.impression_id, i.ts, i.source_url, i.target_url)


def _campaign_entries(impressions) -> list[tuple]:
    return [(i.event_id, i.campaign) for i in impressions if i.campaign is not None]


def _goal_value_entries(visits) -> list[tuple]:
    return [(v.event_id, v.value) for v in visits if v.value is not None]


COMPACT_STATE = "state binary, timer long"


class CompactAttributionProcessor(StatefulProcessor):
    """Conversion attribution per ``user_id`` with one value state per user (Row mode)."""

    def __init__(self, config: AttributionConfig = AttributionConfig()):
        """Keep the configuration.

        :param config: the attribution rules' parameters.
        """
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the one value state.

        :param handle: Spark's handle to the processor's state and timers.
        """
        self.handle = handle
        self.user = handle.getValueState("user", COMPACT_STATE)

    def handleInputRows(self, key, rows, timerValues: TimerValues) -> Iterator:
        """Add a user's new events, then fire and garbage-collect at the watermark.

        :param key: the grouping key, ``(user_id,)``.
        :param rows: the user's new rows, with ``INPUT_COLUMNS``.
        :param timerValues: Spark's current watermark and processing time.
        """
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, timer = self._load(key[0])
        # Spark filtered late rows already (by the previous batch's watermark); the rest are
        # added before any goal at or below ``watermark`` fires, as the streaming rules require.
        core.add(events_from_rows(rows))
        return self._advance(core, timer, watermark)

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator:
        """Fire and garbage-collect a user's state at the watermark.

        :param key: the grouping key, ``(user_id,)``.
        :param timerValues: Spark's current watermark and processing time.
        :param expiredTimerInfo: the timer that fired (unused: it is already deleted).
        """
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, _ = self._load(key[0])
        # The timer that fired is already gone: never delete it (a wasted round trip).
        return self._advance(core, None, watermark)

    def close(self) -> None:
        pass

    def _load(self, user_id: str) -> tuple[UserAttribution, Optional[int]]:
        """The user's state and registered timer (a fresh state and no timer for a new user)."""
        stored = self.user.get()
        if stored is None:
            return UserAttribution(user_id, self.config), None
        return UserAttribution.from_bytes(stored[0], self.config), stored[1]

    def _advance(self, core: UserAttribution, timer: Optional[int], watermark: int) -> Iterator:
        rows = core.advance(watermark)
        if core.is_empty:
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.user.clear()
        else:
            # One user per key: only the calls it gets tell it the watermark (see next_wakeup).
            wakeup = spark_timer(core.next_wakeup(every_move=True), self.config)
            if wakeup != timer:
                if timer is not None:
                    self.handle.deleteTimer(timer)
                self.handle.registerTimer(wakeup)
            self.user.update((core.to_bytes(), wakeup))
        return iter([row_to_spark(r) for r in rows])
