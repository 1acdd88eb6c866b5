"""Path search over one user's referer graph (spec rules 2, 4, 5 and 6).

The graph is never materialised. Its edges follow from two equalities, so sorted per-URL lists
are enough to walk it:

* visit ``p -> v`` when ``p.url == v.referer`` and ``p`` precedes ``v``;
* impression ``i -> v`` when ``(i.source_url, i.target_url) == (v.referer, v.url)`` and ``i``
  precedes ``v``.

"Precedes" is the order ``(ts, event_id)``, so every edge points forward in time: the graph is
acyclic even when URLs form cycles, and every search below terminates.

Both searches use the same trick to stay linear in the part of the state they touch: the
predecessors of ``v`` through URL ``X`` are a *prefix* of the visits to ``X``. Walking backwards
in decreasing order, the first visit that needs URL ``X`` asks for the longest prefix, so every
later request for ``X`` is already covered and costs nothing. Each URL list is therefore read by
one cursor, and each visit is looked at most once per search.
"""
from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Optional


# Nodes a fallback search may pop before the best map is recomputed instead (see last_touch).
SEARCH_BUDGET = 2_000


@dataclass(slots=True)
class Visit:
    """A visit held in state. ``pending`` is true for a goal that still awaits attribution."""

    event_id: str
    ts: int
    url: str
    referer: Optional[str]
    is_goal: bool = False
    pending: bool = False

    @property
    def key(self) -> tuple[int, str]:
        return (self.ts, self.event_id)


@dataclass(slots=True)
class Impression:
    """The canonical impression of one logical impression (rule 3), held in state."""

    event_id: str
    impression_id: int
    ts: int
    source_url: str
    target_url: str
    consumed: bool = False

    @property
    def key(self) -> tuple[int, str]:
        return (self.ts, self.event_id)

    @property
    def rank(self) -> tuple[int, int, str]:
        """The canonical order of a logical impression's members (rule 3)."""
        return (self.ts, self.impression_id, self.event_id)

    def leads_to(self, visit: Visit) -> bool:
        """True when the edge ``self -> visit`` exists."""
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
        group.sort(key=lambda x: (x.ts, x.event_id))
        out[group_key] = _Sorted(group, [(x.ts, x.event_id) for x in group])
    return out


class ReferrerIndex:
    """Read-only indexes over one user's visits and canonical impressions.

    Built once per firing; consumption marks on impressions are read live, so one index serves
    all goals attributed in that firing. The per-URL lists used only by the fallback search and
    by trails are built on first use.
    """

    def __init__(self, visits: Iterable[Visit], impressions: Iterable[Impression]):
        self._visits = list(visits)
        self._impressions = sorted(impressions, key=lambda i: (i.ts, i.event_id))
        # Every node in (ts, event_id) order, sorted once; rebuilding the best map reuses it.
        self._nodes = sorted([(v.ts, v.event_id, v) for v in self._visits]
                             + [(i.ts, i.event_id, i) for i in self._impressions],
                             key=lambda n: (n[0], n[1]))
        self._best = self._best_reachable()
        self._oldest = 0  # index of the oldest possibly-unconsumed impression in _impressions

    @cached_property
    def _rank(self) -> dict:
        # A visit's rank in (ts, event_id) order lets the max-heap pop visits without comparing
        # event_id strings in reverse.
        ordered = sorted(self._visits, key=lambda v: (v.ts, v.event_id))
        return {v.event_id: r for r, v in enumerate(ordered)}

    @cached_property
    def _by_url(self) -> dict:
        return _index(self._visits, lambda v: v.url)

    @cached_property
    def _by_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None), lambda v: v.referer)

    @cached_property
    def _by_url_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None),
                      lambda v: (v.url, v.referer))

    @cached_property
    def _by_pair(self) -> dict:
        return _index(self._impressions, lambda i: (i.source_url, i.target_url))

    def _best_reachable(self) -> dict:
        """For every visit, the rule-5 best unconsumed impression with a path to it (or None).

        One pass in ``(ts, event_id)`` order: a visit's best is the better of the best over
        earlier visits to its referer URL (a running maximum per URL) and the best earlier
        impression of its ``(referer, url)`` pair (a running maximum per pair). Consumption
        only removes candidates, so later in the firing an answer is either still right, or
        consumed (then ``last_touch`` falls back to a search), and "no candidate" stays true.
        """
        erank = self._event_id_rank
        best_by_url: dict = {}
        best_by_pair: dict = {}
        best: dict = {}
        for _, event_id, node in self._nodes:
            if isinstance(node, Impression):
                if node.consumed:
                    continue
                # Rule 5's order as one max-able key: latest ts, then smallest ids.
                score = (node.ts, -node.impression_id, -erank[event_id])
                pair = (node.source_url, node.target_url)
                current = best_by_pair.get(pair)
                if current is None or score > current[0]:
                    best_by_pair[pair] = (score, node)
                continue
            found = None
            if node.referer is not None:
                found = best_by_url.get(node.referer)
                direct = best_by_pair.get((node.referer, node.url))
                if direct is not None and (found is None or direct[0] > found[0]):
                    found = direct
            if found is not None:
                best[event_id] = found[1]
                current = best_by_url.get(node.url)
                if current is None or found[0] > current[0]:
                    best_by_url[node.url] = found
        return best

    @cached_property
    def _event_id_rank(self) -> dict:
        return {eid: r for r, eid in enumerate(sorted(i.event_id for i in self._impressions))}

    def _oldest_unconsumed_ts(self) -> Optional[int]:
        impressions = self._impressions
        while self._oldest < len(impressions) and impressions[self._oldest].consumed:
            self._oldest += 1
        return impressions[self._oldest].ts if self._oldest < len(impressions) else None

    # -- rule 4 + 5: the last-touch candidate -------------------------------------------------
    def last_touch(self, goal: Visit, lookback_ms: int) -> Optional[Impression]:
        """The credited impression for ``goal`` under ``last_touch``, or ``None`` (organic).

        The best reachable impression is precomputed (``_best_reachable``): the latest one wins,
        so if it is older than the lookback every candidate is. Only when an earlier goal of this
        firing consumed it does a search run.
        """
        lo = goal.ts - lookback_ms
        best = self._best.get(goal.event_id)
        if best is None or best.ts < lo:
            return None
        if not best.consumed:
            return best
        oldest = self._oldest_unconsumed_ts()
        if oldest is None:
            return None
        # Usually the next-best impression is close behind (an earlier click of the session);
        # a short search finds it. When it is not, recomputing the best map (linear, no sort)
        # costs less than walking everything back to the oldest unconsumed impression.
        found, finished = self._search(goal, max(lo, oldest), SEARCH_BUDGET)
        if finished:
            return found
        self._best = self._best_reachable()
        best = self._best.get(goal.event_id)
        return best if best is not None and best.ts >= lo else None

    def _search(self, goal: Visit, lo: int, budget: int) -> tuple[Optional[Impression], bool]:
        """A best-first walk backwards from the goal, visiting nodes in decreasing time.

        Visits at a given ``ts`` are expanded before impressions at that ``ts``, and impressions
        at equal ``ts`` pop in ``(impression_id, event_id)`` order, so the first unconsumed
        impression popped is exactly the rule-5 winner. Nothing older than ``lo`` is read.
        Returns ``(answer, True)``, or ``(None, False)`` when ``budget`` pops did not settle it.
        """
        heap: list = []
        seen_urls: set = set()
        seen_pairs: set = set()

        def push_visit(cursor: _Sorted, idx: int) -> None:
            v = cursor.items[idx]
            if v.ts >= lo:
                heapq.heappush(heap, (-v.ts, 0, -self._rank[v.event_id], cursor, idx))

        def push_impression(cursor: _Sorted, idx: int) -> None:
            i = cursor.items[idx]
            if i.ts >= lo:
                heapq.heappush(heap, (-i.ts, 1, (i.impression_id, i.event_id), cursor, idx))

        def expand(v: Visit) -> None:
            if v.referer is None:
                return
            if v.referer not in seen_urls:
                seen_urls.add(v.referer)
                cursor = self._by_url.get(v.referer)
                if cursor is not None:
                    idx = bisect_left(cursor.keys, v.key) - 1
                    if idx >= 0:
                        push_visit(cursor, idx)
            pair = (v.referer, v.url)
            if pair not in seen_pairs:
                seen_pairs.add(pair)
                cursor = self._by_pair.get(pair)
                if cursor is not None:
                    idx = bisect_left(cursor.keys, v.key) - 1
                    if idx >= 0:
                        push_impression(cursor, idx)

        expand(goal)
        while heap:
            budget -= 1
            if budget < 0:
                return None, False
            _, kind, _, cursor, idx = heapq.heappop(heap)
            node = cursor.items[idx]
            if idx > 0:
                (push_visit if kind == 0 else push_impression)(cursor, idx - 1)
            if kind == 0:
                expand(node)
            elif not node.consumed:
                return node, True
        return None, True

    # -- rule 6: the trail --------------------------------------------------------------------
    def trail(self, impression: Impression, goal: Visit) -> list[Visit]:
        """The visits strictly between ``impression`` and ``goal``, in forward order (rule 6)."""
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

        A forward best-first walk in increasing time; the first request for referer URL ``X``
        has the earliest bound, so it covers every later one.
        """
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
                heapq.heappush(heap, (nxt.ts, self._rank[nxt.event_id], next(tiebreak), cursor, idx + 1))
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
