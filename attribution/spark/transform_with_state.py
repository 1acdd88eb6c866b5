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
  * ``impressions``: list state, one entry per canonical impression;
  * ``spent``: list state of event ids whose one-shot fact has happened: a goal that was
    attributed, or an impression that ``last_touch`` consumed;
  * ``consumed``: list state of ``(event id, models)``: an impression and the consumption bits
    (``config.model_bit``) it had when a model other than ``last_touch`` consumed it. The
    entries of one impression add up (their bits are or-ed); a ``last_touch``-only run writes
    none, so its state is the same as before other models existed;
  * ``campaigns``: list state of ``(event id, campaign)`` for impressions that have one;
  * ``goal_values``: list state of ``(event id, value)`` for goals that have one;
  * ``superseded``: list state of the event ids of click-spam members that lost to their
    logical impression's canonical one, with its dedup bucket (rule 1 drops later reuses);
  * ``wakeup``: value state holding the min pending goal (the min-goal timer) and the registered
    timer, so the timer can be replaced without listing timers.

  Entries are immutable facts, so a micro-batch touches state with at most one ``appendList``
  per list; only garbage collection, which removes entries, rewrites a list with one ``put``.
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

from ..config import LAST_TOUCH, AttributionConfig
from ..core import UserAttribution
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
    """What was in state before this call, to write back only the difference."""

    __slots__ = ("visit_ids", "impression_ids", "impression_entries", "spent", "consumed",
                 "superseded")

    def __init__(self, visit_ids: set, impression_ids: set, impression_entries: int, spent: set,
                 consumed: dict, superseded: set):
        self.visit_ids = visit_ids
        self.impression_ids = impression_ids
        self.impression_entries = impression_entries
        self.spent = spent
        self.consumed = consumed
        self.superseded = superseded


class AttributionProcessor(StatefulProcessor):
    """Conversion attribution per ``user_id`` (Row mode, for ``transformWithState``).

    Its declared entries hold no emitted rows, so it does not revise (section 8): a
    configuration with allowed lateness or early results is refused.
    """

    def __init__(self, config: AttributionConfig = AttributionConfig()):
        if config.revising:
            raise ValueError("transformWithState's declared state layout cannot revise rows; "
                             "use --tws-state compact for --allowed-lateness or --early-results")
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
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
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, loaded = self._load(key[0])
        # Spark filtered late rows already (by the previous batch's watermark); the rest are
        # added before any goal at or below ``watermark`` fires, as the streaming rules require.
        core.add(events_from_rows(rows))
        return self._advance(core, loaded, watermark)

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator:
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
        campaigns = dict(self.campaigns.get())
        values = dict(self.goal_values.get())
        visits = [Visit(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[4]) and r[0] not in spent,
                        values.get(r[0]))
                  for r in self.visits.get()]
        impressions = [Impression(r[0], r[1], r[2], r[3], r[4],
                                  (LAST_TOUCH if r[0] in spent else 0) | consumed.get(r[0], 0),
                                  campaigns.get(r[0]))
                       for r in self.impressions.get()]
        superseded = {r[0]: r[1] for r in self.superseded.get()}
        loaded = _Loaded({v.event_id for v in visits}, {i.event_id for i in impressions},
                         len(impressions), spent, consumed, set(superseded))
        core = UserAttribution.restore(user_id, visits, impressions, config=self.config,
                                       superseded=superseded)
        return core, loaded

    def _advance(self, core: UserAttribution, loaded: _Loaded, watermark: int) -> Iterator:
        rows = core.advance(watermark)
        if core.is_empty:
            self._clear()
        else:
            self._store(core, loaded)
            self._set_timer(core.next_timer(), spark_timer(core.next_wakeup(), self.config))
        out = [row_to_spark(r, users_change_column=True) for r in rows]
        held_before = bool(loaded.visit_ids or loaded.impression_ids)
        if held_before == core.is_empty:  # the user arrived in state, or left it
            out.append(users_change_row(-1 if held_before else 1))
        return iter(out)

    def _store(self, core: UserAttribution, loaded: _Loaded) -> None:
        spent = {g.event_id for g in core.visits.values() if g.is_goal and not g.pending}
        spent.update(i.event_id for i in core.impressions.values() if i.consumed & LAST_TOUCH)
        # The other models' consumption, as it stands (see ``consumed`` in the module docstring).
        consumed = {i.event_id: i.consumed for i in core.impressions.values()
                    if i.consumed & ~LAST_TOUCH}
        shrunk = (not loaded.visit_ids <= core.visits.keys()
                  or len(core.impressions) < loaded.impression_entries
                  or not loaded.impression_ids <= {i.event_id for i in core.impressions.values()}
                  or not loaded.superseded <= core.superseded.keys())
        if shrunk:  # GC dropped entries (or a superseded impression): rewrite, one put per list
            self.visits.put([_visit_entry(v) for v in core.visits.values()])
            self._put_or_clear(self.impressions, [_impression_entry(i)
                                                  for i in core.impressions.values()])
            self._put_or_clear(self.spent, [(s,) for s in spent])
            self._put_or_clear(self.consumed, list(consumed.items()))
            self._put_or_clear(self.campaigns, _campaign_entries(core.impressions.values()))
            self._put_or_clear(self.goal_values, _goal_value_entries(core.visits.values()))
            self._put_or_clear(self.superseded, list(core.superseded.items()))
            return
        new_visits = [v for k, v in core.visits.items() if k not in loaded.visit_ids]
        new_impressions = [i for i in core.impressions.values()
                           if i.event_id not in loaded.impression_ids]
        new_spent = [(s,) for s in spent - loaded.spent]
        new_consumed = [(k, bits) for k, bits in consumed.items()
                        if bits & ~loaded.consumed.get(k, 0)]
        new_superseded = [(k, b) for k, b in core.superseded.items() if k not in loaded.superseded]
        for state, entries in ((self.visits, [_visit_entry(v) for v in new_visits]),
                               (self.impressions, [_impression_entry(i) for i in new_impressions]),
                               (self.spent, new_spent), (self.consumed, new_consumed),
                               (self.campaigns, _campaign_entries(new_impressions)),
                               (self.goal_values, _goal_value_entries(new_visits)),
                               (self.superseded, new_superseded)):
            if entries:
                state.appendList(entries)

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
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.user = handle.getValueState("user", COMPACT_STATE)

    def handleInputRows(self, key, rows, timerValues: TimerValues) -> Iterator:
        watermark = on_time_watermark(timerValues.getCurrentWatermarkInMs(), self.config)
        core, timer = self._load(key[0])
        # Spark filtered late rows already (by the previous batch's watermark); the rest are
        # added before any goal at or below ``watermark`` fires, as the streaming rules require.
        core.add(events_from_rows(rows))
        return self._advance(core, timer, watermark)

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator:
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
            wakeup = spark_timer(core.next_wakeup(), self.config)
            if wakeup != timer:
                if timer is not None:
                    self.handle.deleteTimer(timer)
                self.handle.registerTimer(wakeup)
            self.user.update((core.to_bytes(), wakeup))
        return iter([row_to_spark(r) for r in rows])
