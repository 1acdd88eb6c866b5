"""Path search over one user's referer graph (spec rules 2, 4, 5 and 6).

The graph is never materialised. Its edges follow from two equalities, so sorted per-URL lists
are enough to walk it:

* visit ``p -> v`` when ``p.url == v.referer`` and ``p`` precedes ``v``;
* impression ``i -> v`` when ``(i.source_url, i.target_url) == (v.referer, v.url)`` and ``i``
  precedes ``v``.

"Precedes" is the order ``(ts, event_id)``, so every edge points forward in time: the graph is
acyclic even when URLs form cycles, and every search below terminates.

Both searches rest on one fact: the predecessors of ``v`` through URL ``X`` (or through the
pair ``(v.referer, v.url)``) are a *prefix*, in that order, of the visits to ``X`` (or of the
pair's impressions). The candidate sweep keeps a running union per such list, so it is linear;
the trail walk reads each list with one cursor.
"""
from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Iterable, Optional

# The order ``(ts, event_id)`` of visits and impressions, and the impression order of rule 5,
# as sort keys (``attrgetter`` builds the key tuple without a Python frame).
BY_TIME = attrgetter("ts", "event_id")
BY_RANK = attrgetter("ts", "impression_id", "event_id")
_EVENT_ID = attrgetter("event_id")


@dataclass(slots=True)
class Visit:
    """A visit held in state. ``pending`` is true for a goal that still awaits attribution;
    ``value`` is a goal's conversion value (None for other visits)."""

    event_id: str
    ts: int
    url: str
    referer: Optional[str]
    is_goal: bool = False
    pending: bool = False
    value: Optional[float] = None

    @property
    def key(self) -> tuple[int, str]:
        return (self.ts, self.event_id)


@dataclass(slots=True)
class Impression:
    """The canonical impression of one logical impression (rule 3), held in state.

    ``consumed`` holds one bit per model (``config.model_bit``) that credited it (section 6).
    """

    event_id: str
    impression_id: int
    ts: int
    source_url: str
    target_url: str
    consumed: int = 0
    campaign: Optional[str] = None

    @property
    def key(self) -> tuple[int, str]:
        return (self.ts, self.event_id)

    @property
    def rank(self) -> tuple[int, int, str]:
        """The canonical order of a logical impression's members (rule 3)."""
        return (self.ts, self.impression_id, self.event_id)

    def leads_to(self, visit: Visit) -> bool:
        """True when the edge ``self -> visit`` exists.

        :param visit: the visit the edge would end at.
        """
        return (self.target_url == visit.url and self.source_url == visit.referer
                and self.key < visit.key)


@dataclass
class _Sorted:
    """Items sorted by ``(ts, event_id)``, with the keys alongside for bisection."""

    items: list = field(default_factory=list)
    keys: list = field(default_factory=list)


def _index(items: Iterable, key_of) -> dict:
    groups: dict = defaultdict(list)
    for item in items:
        groups[key_of(item)].append(item)
    out = {}
    for group_key, group in groups.items():
        group.sort(key=BY_TIME)
        out[group_key] = _Sorted(group, [(x.ts, x.event_id) for x in group])
    return out


# Up to this many nodes between an impression and its goal, the trail's reachable visits are
# found by scanning those nodes; beyond it, by a walk whose cost is the reachable visits only.
SCAN_LIMIT = 512


class ReferrerIndex:
    """Indexes over one user's visits and canonical impressions, for one firing.

    ``candidates`` gives every impression with a path to a goal, as a bit mask over the
    impressions in impression order (``ordered``), consumption aside: what every model's
    candidates are drawn from (rule 4, section 6). It comes from one sweep over the nodes in
    ``(ts, event_id)`` order, done lazily up to the goal being attributed (nodes after the last
    due goal are never swept). The per-URL lists used only by trails are built on first use.
    """

    def __init__(self, visits: Iterable[Visit], impressions: Iterable[Impression]):
        """Index one user's records; the sweep itself is done lazily.

        :param visits: the user's visits.
        :param impressions: the user's canonical impressions.
        """
        self._visits = list(visits)
        self._impressions = list(impressions)
        nodes = sorted([*self._visits, *self._impressions], key=BY_TIME)
        self._nodes = nodes
        self._pos = dict(zip(map(_EVENT_ID, nodes), range(len(nodes))))
        self._running: dict = {}  # the candidate sweep's union per visited URL
        self._pair_bits: dict = {}  # (source_url, target_url) -> its impressions' bits so far
        self._goal_reach: dict = {}  # pending goal's position -> its mask, until asked for
        self._reached = 0  # nodes [0, _reached) were swept for candidates
        # The impressions in impression order, ascending ``(ts, impression_id, event_id)``: bit
        # ``k`` of a candidate mask stands for ``ordered[k]``. Every firing needs them, so they
        # are plain attributes (a cached property costs more to read than to build here).
        self.ordered: list[Impression] = sorted(self._impressions, key=BY_RANK)
        self._bit_number = dict(zip(map(_EVENT_ID, self.ordered), range(len(self.ordered))))
        self._ordered_ts: list[int] = [i.ts for i in self.ordered]

    # -- rule 4: candidate sets as bit masks ----------------------------------------------------

    def candidates(self, goal: Visit, lookback_ms: int) -> int:
        """Rule 4 without its consumption clause: the impressions with a path to the pending
        ``goal`` and at most ``lookback_ms`` older, as a mask over ``ordered``. Ask once per
        goal.

        One sweep in ``(ts, event_id)`` order serves every goal: a visit's mask is the union of
        the masks of the earlier visits to its referer URL and of the earlier impressions of its
        ``(referer, url)`` pair, two prefix unions kept per group as the sweep goes. The sweep
        never depends on consumption, so consuming never makes it redo anything.

        :param goal: the pending goal visit.
        :param lookback_ms: how much older than the goal an impression may be, in milliseconds.
        """
        p = self._pos[goal.event_id]
        if p >= self._reached:
            self._sweep_candidates(p + 1)
        reach = self._goal_reach.pop(p, 0)
        # Impression order starts with ts, so the impressions inside the lookback are a suffix.
        oldest = bisect_left(self._ordered_ts, goal.ts - lookback_ms)
        return reach >> oldest << oldest if oldest else reach

    def _sweep_candidates(self, stop: int) -> None:
        # A mask is a Python int as long as its highest bit: a pair's impressions are kept as
        # bit numbers and or-ed in when a visit reads them, since a user with many clicks has
        # as many pairs, each of which would otherwise hold an int as long as the clicks so far.
        nodes, running, pairs, goal_reach = (self._nodes, self._running, self._pair_bits,
                                             self._goal_reach)
        bit_number = self._bit_number
        for p in range(self._reached, stop):
            node = nodes[p]
            if type(node) is Impression:
                pairs.setdefault((node.source_url, node.target_url), []).append(
                    bit_number[node.event_id])
                continue
            referer = node.referer
            if referer is None:
                continue
            reach = running.get(referer, 0)
            for k in pairs.get((referer, node.url), ()):
                reach |= 1 << k
            if reach:
                url = node.url
                running[url] = running.get(url, 0) | reach
                if node.pending:
                    goal_reach[p] = reach
        self._reached = stop

    def last_of(self, mask: int) -> int:
        """The bit of rule 5's choice among the impressions of a non-empty ``mask``: the greatest
        ``ts``, then the smallest ``impression_id`` and ``event_id``, i.e. the first in
        impression order of those at the greatest ``ts``.

        :param mask: a non-empty bit mask over ``ordered``.
        """
        first_at_ts = bisect_left(self._ordered_ts, self.ordered[mask.bit_length() - 1].ts)
        at_ts = mask >> first_at_ts
        return (at_ts & -at_ts) << first_at_ts

    def impressions_in(self, mask: int) -> list[Impression]:
        """The impressions of ``mask``, in impression order.

        :param mask: a bit mask over ``ordered``.
        """
        ordered, out = self.ordered, []
        while mask:
            low = mask & -mask
            out.append(ordered[low.bit_length() - 1])
            mask ^= low
        return out

    # -- rule 6: the trail --------------------------------------------------------------------
    @cached_property
    def _rank(self) -> dict:
        # A visit's rank in (ts, event_id) order breaks heap ties without comparing strings.
        ordered = sorted(self._visits, key=BY_TIME)
        return {v.event_id: r for r, v in enumerate(ordered)}

    @cached_property
    def _by_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None), lambda v: v.referer)

    @cached_property
    def _by_url_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None),
                      lambda v: (v.url, v.referer))

    def trail(self, impression: Impression, goal: Visit) -> list[Visit]:
        """The visits strictly between ``impression`` and ``goal``, in forward order (rule 6).

        :param impression: the impression the trail starts after.
        :param goal: the goal visit the trail ends before.
        """
        reachable = self._reachable_by_url(impression, goal)
        trail: list[Visit] = []
        current = goal
        while not impression.leads_to(current):
            cursor = reachable.get(current.referer)
            idx = bisect_left(cursor.keys, current.key) - 1 if cursor else -1
            if idx < 0:  # cannot happen for a goal that last_touch() returned; fail loudly
                raise AssertionError(f"no path from impression {impression.event_id} "
                                     f"to visit {current.event_id}")
            current = cursor.items[idx]
            trail.append(current)
        trail.reverse()
        return trail

    def _reachable_by_url(self, impression: Impression, goal: Visit) -> dict:
        """Visits reachable from ``impression`` that precede or equal ``goal``, grouped by URL.

        Few nodes between the two (the usual case): one pass over them in order, since every
        edge points forward. Otherwise a best-first walk that touches only reachable visits.
        """
        start, stop = self._pos[impression.event_id] + 1, self._pos[goal.event_id] + 1
        if stop - start <= SCAN_LIMIT:
            return self._reachable_by_scan(impression, start, stop)
        return self._reachable_by_walk(impression, goal)

    def _reachable_by_scan(self, impression: Impression, start: int, stop: int) -> dict:
        out: dict = defaultdict(_Sorted)
        entry = (impression.source_url, impression.target_url)
        for node in self._nodes[start:stop]:
            if type(node) is Visit and node.referer is not None and (
                    node.referer in out or (node.referer, node.url) == entry):
                group = out[node.url]
                group.items.append(node)
                group.keys.append((node.ts, node.event_id))
        return out

    def _reachable_by_walk(self, impression: Impression, goal: Visit) -> dict:
        """A forward best-first walk in increasing time; the first request for referer URL ``X``
        has the earliest bound, so it covers every later one."""
        limit = goal.key
        heap: list = []
        seen_referers: set = set()
        reached: set = set()
        out: dict = defaultdict(_Sorted)
        tiebreak = itertools.count()  # the same visit may sit in two cursors

        def push_from(cursor: Optional[_Sorted], after: tuple) -> None:
            if cursor is None:
                return
            idx = bisect_right(cursor.keys, after)
            if idx < len(cursor.items) and cursor.keys[idx] <= limit:
                v = cursor.items[idx]
                heapq.heappush(heap, (v.ts, self._rank[v.event_id], next(tiebreak), cursor, idx))

        push_from(self._by_url_referer.get((impression.target_url, impression.source_url)),
                  impression.key)
        while heap:
            _, _, _, cursor, idx = heapq.heappop(heap)
            v = cursor.items[idx]
            if idx + 1 < len(cursor.items) and cursor.keys[idx + 1] <= limit:
                nxt = cursor.items[idx + 1]
                heapq.heappush(heap, (nxt.ts, self._rank[nxt.event_id], next(tiebreak), cursor,
                                      idx + 1))
            if v.event_id in reached:
                continue
            reached.add(v.event_id)
            group = out[v.url]
            group.items.append(v)
            group.keys.append(v.key)
            if v.url not in seen_referers:
                seen_referers.add(v.url)
                push_from(self._by_referer.get(v.url), v.key)
        return out
