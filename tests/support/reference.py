"""What the outputs are compared with, computed independently of the code under test.

* ``reference_attribution``: a brute-force reading of the rules on networkx
  (``reference_records``: its rule 1, the records that count; ``COVERAGE``: the situations the
  property saw);
* ``assert_same_rows``: rows equal, credits and credited values within rounding;
* ``dropped_by_spark``: the records a one-file-per-micro-batch stream drops as late;
* ``folded_rows``, ``revisions_by_goal``: a changelog's net table and revision numbers.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable, Sequence

import networkx as nx

from attribution import AttributionConfig, Event
from attribution.core import Attribution
from attribution.oracle import sort_key

# How often the property saw each interesting situation; a test below asserts that every one
# of them was exercised, so the property cannot pass by only ever seeing trivial inputs.
COVERAGE: Counter = Counter()


def _order(e: Event) -> tuple[int, str]:
    return (e.ts, e.event_id)


def _reference_credits(model: str, candidates: list[Event], goal: Event,
                       config: AttributionConfig) -> list[tuple[Event, float]]:
    """Spec section 6's table, literally: the credited impressions and their credits."""
    n = len(candidates)
    if model == "last_touch":  # rule 5: greatest ts, then smallest impression_id, event_id
        return [(min(candidates, key=lambda i: (-i.ts, i.impression_id, i.event_id)), 1.0)]
    if model == "first_touch":
        return [(candidates[0], 1.0)]
    if model == "linear":
        return [(i, 1 / n) for i in candidates]
    if model == "position_based":
        if n <= 2:
            return [(i, 1 / n) for i in candidates]
        return [(i, 0.4 if k in (0, n - 1) else 0.2 / (n - 2)) for k, i in enumerate(candidates)]
    if model == "time_decay":
        weights = [2 ** (-(goal.ts - i.ts) / config.half_life_ms) for i in candidates]
        return [(i, w / sum(weights)) for i, w in zip(candidates, weights)]
    raise AssertionError(f"the reference does not know model {model!r}")


def _reference_copy_key(e: Event) -> tuple:
    """Rule 1's order of the copies of a record, as semantics.md states it: ``ts``, then
    ``event_type``, then the type's fields in the event schema's order, a missing value first,
    false before true, -0.0 before 0.0; a visit's value counts on goals only."""
    if e.event_type == "impression":
        fields = [e.impression_id, e.source_url, e.target_url, e.campaign]
    else:
        fields = [e.url, e.referer, e.is_goal, e.value if e.is_goal else None]
    return (e.ts, e.event_type,
            [(f is not None, f, math.copysign(1.0, f) if isinstance(f, float) else 0)
             for f in fields])


def reference_records(arrivals: Iterable[Event]) -> dict[str, dict[str, Event]]:
    """Rule 1 literally: per user and ``event_id``, the smallest copy (heartbeats left out)."""
    smallest: dict[str, dict[str, Event]] = defaultdict(dict)
    for e in arrivals:
        if e.event_type != "heartbeat":
            held = smallest[e.user_id].get(e.event_id)
            if held is None or _reference_copy_key(e) < _reference_copy_key(held):
                smallest[e.user_id][e.event_id] = e
    return smallest


def reference_attribution(arrivals: Iterable[Event],
                          config: AttributionConfig) -> list[Attribution]:
    """Spec rules 1-7 and sections 6-7 applied literally: every edge enumerated, candidates by
    graph ancestry, each model with its own set of consumed impressions."""
    rows = []
    for user_id, by_id in reference_records(arrivals).items():
        events = list(by_id.values())
        graph = nx.DiGraph()
        graph.add_nodes_from(by_id)
        for v in events:  # rule 2
            if v.event_type != "visit":
                continue
            for a in events:
                if _order(a) >= _order(v):
                    continue
                impression_edge = (a.event_type == "impression" and a.target_url == v.url
                                   and a.source_url == v.referer)
                visit_edge = a.event_type == "visit" and a.url == v.referer
                if impression_edge or visit_edge:
                    graph.add_edge(a.event_id, v.event_id)

        groups: dict[tuple, list[Event]] = defaultdict(list)  # rule 3
        for e in events:
            if e.event_type == "impression":
                groups[(e.source_url, e.target_url, e.ts // config.dedup_window_ms)].append(e)
        canonical = [min(g, key=lambda i: (i.ts, i.impression_id, i.event_id))
                     for g in groups.values()]

        consumed: dict[str, set[str]] = {m: set() for m in config.models}
        goals = sorted((e for e in events if e.event_type == "visit" and e.is_goal), key=_order)
        for goal in goals:  # rule 7
            ancestors = nx.ancestors(graph, goal.event_id)
            within = sorted((i for i in canonical if i.event_id in ancestors  # rule 4
                             and goal.ts - i.ts <= config.lookback_ms),
                            key=lambda i: (i.ts, i.impression_id, i.event_id))
            COVERAGE["goals with an impression upstream beyond the lookback"] += any(
                i.event_id in ancestors and goal.ts - i.ts > config.lookback_ms for i in canonical)
            COVERAGE["goals with a superseded click upstream"] += any(
                e.event_type == "impression" and e.event_id in ancestors and e not in canonical
                for e in events)
            value = goal.value
            for model in config.models:  # section 6, in the models' fixed order
                candidates = [i for i in within if i.event_id not in consumed[model]]
                COVERAGE["goals with a consumed impression upstream"] += (
                    len(candidates) < len(within))
                COVERAGE[f"{model} with {min(len(candidates), 3)} candidate(s)"] += 1
                if not candidates:
                    rows.append(Attribution(user_id, goal.event_id, goal.url, goal.ts, None, None,
                                            None, None, None, (), model, 0.0, None, value,
                                            None if value is None else 0.0))
                    continue
                for winner, credit in _reference_credits(model, candidates, goal, config):
                    consumed[model].add(winner.event_id)
                    rows.append(Attribution(
                        user_id, goal.event_id, goal.url, goal.ts, winner.impression_id,
                        winner.event_id, winner.source_url, winner.target_url, winner.ts,
                        _reference_trail(graph, by_id, winner, goal), model, credit,
                        winner.campaign, value, None if value is None else credit * value))
    return sorted(rows, key=sort_key)


def _reference_trail(graph, by_id: dict, winner: Event, goal: Event) -> tuple[str, ...]:
    """Rule 6, walking back from the goal over explicit graph edges."""
    reachable = nx.descendants(graph, winner.event_id)
    trail: list[str] = []
    current = goal
    while not graph.has_edge(winner.event_id, current.event_id):
        predecessors = [by_id[p] for p in graph.predecessors(current.event_id)
                        if by_id[p].event_type == "visit" and p in reachable]
        current = max(predecessors, key=_order)
        trail.insert(0, current.url)
    return tuple(trail)


def assert_same_rows(actual: Sequence[Attribution], expected: Sequence[Attribution],
                     what: str = "rows") -> None:
    """Assert equal rows, allowing rounding differences in ``credit`` and ``credited_value``
    (a sum of floats in another order, ``time_decay``'s weights computed another way)."""
    def exact(rows):
        return [r._replace(credit=0.0,
                           credited_value=None if r.credited_value is None else 0.0)
                for r in rows]

    assert exact(actual) == exact(expected), f"{what} differ"
    for a, e in zip(actual, expected):
        for name in ("credit", "credited_value"):
            x, y = getattr(a, name), getattr(e, name)
            assert x is None and y is None or math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12), (
                f"{what}: {name} {x} != {y} in {a}")


def dropped_by_spark(files: Sequence[Sequence[Event]], spark_delay_ms: int) -> dict[int, list]:
    """Per file number, the records a stream reading one file per micro-batch drops as late.

    Micro-batch ``k`` reads file ``k`` and drops (heartbeats aside, which never reach the
    stateful stage) the records with ``ts <= S[k-1]``, where ``S[j]``, Spark's watermark of
    micro-batch ``j``, is the maximum event time of the files before ``j`` minus
    ``spark_delay_ms``, never below 0 (``S[0] = 0``). The attribution job gives Spark a delay of
    its watermark delay plus the allowed lateness. The rule assumes no micro-batch without data
    runs between two files.
    """
    dropped, watermark, previous, seen = {}, 0, 0, None
    for k, records in enumerate(files):
        # ``previous`` is S[k-1]; ``watermark`` becomes S[k].
        dropped[k] = [e for e in records if e.event_type != "heartbeat" and e.ts <= previous]
        previous = watermark
        times = [e.ts for e in records]
        if times:
            seen = max(times) if seen is None else max(seen, *times)
            watermark = max(watermark, seen - spark_delay_ms)
    return dropped


def folded_rows(changelog: Sequence[Attribution]) -> list[Attribution]:
    """The table a changelog folds to (``attribution.spark.changelog.fold_changelog``), its rows
    with the changelog columns at their defaults, in ``sort_key`` order."""
    import pandas as pd

    from attribution.spark.changelog import fold_changelog

    frame = pd.DataFrame([r._asdict() for r in changelog]).assign(position=range(len(changelog)))
    return sorted((changelog[k]._replace(sign=1, revision=0, emit_timing="ON_TIME")
                   for k in fold_changelog(frame)["position"]), key=sort_key)


def revisions_by_goal(changelog: Sequence[Attribution]) -> dict[tuple[str, str], set[int]]:
    """The revisions of each ``(goal_event_id, model)`` that a ``+1`` row carries."""
    revisions: dict = defaultdict(set)
    for r in changelog:
        if r.sign == 1:
            revisions[(r.goal_event_id, r.model)].add(r.revision)
    return revisions
