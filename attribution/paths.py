"""Path search over one user's referer graph (spec rules 2, 4, 5 and 6, and section 6).

The graph is never materialised. Its edges follow from two equalities, so sorted per-URL lists
are enough to walk it:

* visit ``p -> v`` when ``p.url == v.referer`` and ``p`` precedes ``v``;
* impression ``i -> v`` when ``(i.source_url, i.target_url) == (v.referer, v.url)`` and ``i``
  precedes ``v``.

"Precedes" is the order ``(ts, event_id)``, so every edge points forward in time: the graph is
acyclic even when URLs form cycles, and every search below terminates.

Every search rests on one fact: the predecessors of ``v`` through URL ``X`` (or through the
pair ``(v.referer, v.url)``) are a *prefix*, in that order, of the visits to ``X`` (or of the
pair's impressions). The last-touch sweep keeps a running maximum per such list and the
candidate sweep of the other models a running union, so both are linear; the trail walk reads
each list with one cursor.
"""
from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Optional

from .config import model_bit

LAST_TOUCH = model_bit("last_touch")


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


# Up to this many nodes between an impression and its goal, the trail's reachable visits are
# found by scanning those nodes; beyond it, by a walk whose cost is the reachable visits only.
SCAN_LIMIT = 512


class ReferrerIndex:
    """Indexes over one user's visits and canonical impressions, for one firing.

    Two sweeps over the nodes in ``(ts, event_id)`` order, each done lazily up to the goal being
    attributed (nodes after the last due goal are never swept):

    * ``last_touch``: the rule-5 best unconsumed impression of every visit, for a firing that
      computes ``last_touch`` alone. Impressions its goals consume must be reported with
      ``consume``.
    * ``candidates``: every impression with a path to a goal, as a bit mask over the impressions
      in impression order (``ordered``), consumption aside: what every model's candidates are
      drawn from (section 6).

    The per-URL lists used only by trails are built on first use.
    """

    def __init__(self, visits: Iterable[Visit], impressions: Iterable[Impression]):
        self._visits = list(visits)
        self._impressions = list(impressions)
        nodes = sorted([*self._visits, *self._impressions], key=lambda n: (n.ts, n.event_id))
        self._nodes = nodes
        self._pos = {n.event_id: p for p, n in enumerate(nodes)}
        self._prefix: Optional[dict] = None  # the last-touch sweep's tables, built on first use
        self._running: dict = {}  # the candidate sweep's union per group
        self._goal_reach: dict = {}  # goal position -> the candidate sweep's mask
        self._reached = 0  # nodes [0, _reached) were swept for candidates

    def _prepare_last_touch(self) -> None:
        nodes = self._nodes
        # A group is the visits to one URL (keyed by the URL) or the impressions of one
        # (source_url, target_url) pair (keyed by the pair): the two ways into a visit.
        groups: dict = defaultdict(list)
        slot = []
        for p, n in enumerate(nodes):
            members = groups[n.url if type(n) is Visit else (n.source_url, n.target_url)]
            slot.append(len(members))
            members.append(p)
        self._groups = dict(groups)
        self._slot = slot
        # prefix[key][k]: the best candidate over the group's first k+1 members (see _sweep).
        self._prefix = {key: [None] * len(members) for key, members in groups.items()}
        self._best: list = [None] * len(nodes)
        self._swept = 0  # nodes [0, _swept) have a value
        self._exact = 0  # values before this position count no consumed impression

    def consume(self, impression: Impression) -> None:
        """Mark ``impression`` consumed for ``last_touch`` by a goal of this firing (rule 7)."""
        impression.consumed |= LAST_TOUCH
        if self._prefix is not None:
            self._exact = min(self._exact, self._pos[impression.event_id])

    @cached_property
    def _event_id_rank(self) -> dict:
        return {eid: r for r, eid in enumerate(sorted(i.event_id for i in self._impressions))}

    def _sweep(self, start: int, stop: int) -> None:
        """Give nodes ``[start, stop)`` their value: for a visit, the rule-5 best unconsumed
        impression with a path to it, as ``(score, impression)``, or None.

        Edges come from two equalities, so a visit's candidates are the candidates of the
        earlier visits to its referer URL and the earlier impressions of its
        ``(referer, url)`` pair: two prefix maxima, kept per group as the sweep goes. Values
        before ``start`` are read from those prefix arrays, so a sweep can resume or redo any
        suffix.

        Consumption only removes candidates, so a value is always the best over a *superset*
        of what is still available: if the impression it names is unconsumed it is exactly
        right; if not, ``last_touch`` sweeps again from the earliest consumed position.
        """
        nodes, slot, prefix, groups, best = (self._nodes, self._slot, self._prefix,
                                             self._groups, self._best)
        erank = self._event_id_rank
        running: dict = {}

        def before_start(key):
            members = groups.get(key)
            if members is None:
                return None
            k = bisect_left(members, start) - 1
            return prefix[key][k] if k >= 0 else None

        for p in range(start, stop):
            node = nodes[p]
            if type(node) is Impression:
                key = (node.source_url, node.target_url)
                current = running[key] if key in running else before_start(key)
                if not node.consumed & LAST_TOUCH:
                    # Rule 5's order as one max-able key: latest ts, then smallest ids.
                    score = (node.ts, -node.impression_id, -erank[node.event_id])
                    if current is None or score > current[0]:
                        current = (score, node)
            else:
                found = None
                referer = node.referer
                if referer is not None:
                    if referer not in running:
                        running[referer] = before_start(referer)
                    found = running[referer]
                    pair = (referer, node.url)
                    if pair not in running:
                        running[pair] = before_start(pair)
                    direct = running[pair]
                    if direct is not None and (found is None or direct[0] > found[0]):
                        found = direct
                best[p] = found
                key = node.url
                current = running[key] if key in running else before_start(key)
                if found is not None and (current is None or found[0] > current[0]):
                    current = found
            running[key] = current
            prefix[key][slot[p]] = current

    # -- rule 4 + 5: the last-touch candidate -------------------------------------------------
    def last_touch(self, goal: Visit, lookback_ms: int) -> Optional[Impression]:
        """The credited impression for ``goal`` under ``last_touch``, or ``None`` (organic).

        Goals must be asked in ``(ts, event_id)`` order. The latest candidate wins, so if the
        best one is older than the lookback every candidate is. Only when the best one was
        consumed earlier in this firing is the sweep redone, from the earliest impression
        consumed since the last exact sweep: usually a click a few events back.
        """
        if self._prefix is None:
            self._prepare_last_touch()
        p = self._pos[goal.event_id]
        if p >= self._swept:
            exact = self._exact == self._swept
            self._sweep(self._swept, p + 1)
            self._swept = p + 1
            if exact:
                self._exact = p + 1
        found = self._best[p]
        if found is not None and found[1].consumed & LAST_TOUCH:
            self._sweep(self._exact, p + 1)
            self._exact = p + 1
            found = self._best[p]
        if found is None or found[1].ts < goal.ts - lookback_ms:
            return None
        return found[1]

    # -- rule 4 for every model: candidate sets as bit masks -------------------------------------
    @cached_property
    def ordered(self) -> list[Impression]:
        """The impressions in impression order, ascending ``(ts, impression_id, event_id)``:
        bit ``k`` of a candidate mask stands for ``ordered[k]``."""
        return sorted(self._impressions, key=lambda i: i.rank)

    @cached_property
    def _bit(self) -> dict:
        return {i.event_id: 1 << k for k, i in enumerate(self.ordered)}

    @cached_property
    def _ordered_ts(self) -> list[int]:
        return [i.ts for i in self.ordered]

    def candidates(self, goal: Visit, lookback_ms: int) -> int:
        """Rule 4 without its consumption clause: the impressions with a path to ``goal`` and at
        most ``lookback_ms`` older, as a mask over ``ordered``.

        One sweep in ``(ts, event_id)`` order serves every goal: a visit's mask is the union of
        the masks of the earlier visits to its referer URL and of the earlier impressions of its
        ``(referer, url)`` pair, two prefix unions kept per group as the sweep goes. The sweep
        never depends on consumption, so consuming never makes it redo anything. Goals may be
        asked in any order.
        """
        p = self._pos[goal.event_id]
        if p >= self._reached:
            self._sweep_candidates(p + 1)
        reach = self._goal_reach.get(p, 0)
        # Impression order starts with ts, so the impressions inside the lookback are a suffix.
        oldest = bisect_left(self._ordered_ts, goal.ts - lookback_ms)
        return reach >> oldest << oldest if oldest else reach

    def _sweep_candidates(self, stop: int) -> None:
        nodes, running, bit, goal_reach = self._nodes, self._running, self._bit, self._goal_reach
        for p in range(self._reached, stop):
            node = nodes[p]
            if type(node) is Impression:
                key = (node.source_url, node.target_url)
                running[key] = running.get(key, 0) | bit[node.event_id]
                continue
            referer = node.referer
            if referer is None:
                continue
            reach = running.get(referer, 0) | running.get((referer, node.url), 0)
            if reach:
                url = node.url
                running[url] = running.get(url, 0) | reach
                if node.is_goal:
                    goal_reach[p] = reach
        self._reached = stop

    def last_of(self, mask: int) -> int:
        """The bit of rule 5's choice among the impressions of a non-empty ``mask``: the greatest
        ``ts``, then the smallest ``impression_id`` and ``event_id``, i.e. the first in
        impression order of those at the greatest ``ts``."""
        first_at_ts = bisect_left(self._ordered_ts, self.ordered[mask.bit_length() - 1].ts)
        at_ts = mask >> first_at_ts
        return (at_ts & -at_ts) << first_at_ts

    def impressions_in(self, mask: int) -> list[Impression]:
        """The impressions of ``mask``, in impression order."""
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
        ordered = sorted(self._visits, key=lambda v: (v.ts, v.event_id))
        return {v.event_id: r for r, v in enumerate(ordered)}

    @cached_property
    def _by_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None), lambda v: v.referer)

    @cached_property
    def _by_url_referer(self) -> dict:
        return _index((v for v in self._visits if v.referer is not None),
                      lambda v: (v.url, v.referer))

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
