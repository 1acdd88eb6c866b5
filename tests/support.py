"""Helpers shared by test modules of every tier (tests import these, never each other).

* ``ROOT``, ``CH7_DIR``, ``CH7_ROWS``: the repository, the chapter 7 dataset in it and its two
  rows;
* ``PARQUET_OUTPUT``: the job's output options where the sink is not the subject;
* ``stage_in_arrival_order``: copy files so a file stream reads them in a given order;
* ``committed_attributions``: the rows a Spark file sink committed;
* ``attribution_record``, ``write_sink_output``, ``write_batch_output``: attribution output
  written without Spark, laid out as Spark's streaming file sink or batch writer lays it out;
* ``reference_attribution``: an independent brute-force reading of the rules, on networkx
  (``reference_records``: its rule 1, the records that count);
* ``conflicting_copy``: a hypothesis strategy for a copy of a record with other contents;
  ``noise_event``: a record off any session, drawn;
* ``assert_same_rows``: rows equal, credits and credited values within rounding;
* ``larger_event_set``: a few hundred random events of one user;
* ``conflicting_copies``, ``stage_conflicting_copies``, ``CONFLICTING_COPIES_ROWS``,
  ``conflicting_copies_row``: records with copies that differ, as files in either arrival
  order, and the rows rule 1 gives them;
* ``multi_touch_events``: generated event files with several ads upstream of many goals, and
  campaigns and values;
* ``dropped_by_spark``: the records a one-file-per-micro-batch stream drops as late;
* ``folded_rows``, ``revisions_by_goal``: a changelog's net table and revision numbers;
* ``command_environment``, ``obey_file_permissions``, ``assert_no_traceback``,
  ``error_line``, ``suite_jvm_options_without_spark_settings``: running a command as a user
  would, and reading its stderr.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import random
import sys
from collections import Counter, defaultdict
from datetime import timezone
from pathlib import Path
from typing import Iterable, Optional, Sequence

import networkx as nx
from hypothesis import strategies as st

from attribution import AttributionConfig, Event
from attribution.core import Attribution
from attribution.oracle import sort_key

ROOT = Path(__file__).resolve().parent.parent
CH7_DIR = ROOT / "tests" / "data" / "ch7"
# The chapter's two rows (semantics.md, section 5) as (goal, impression, trail).
CH7_ROWS = {
    ("g-signup", 123, ("http://xyz.com/",)),
    ("g-receipt", 456, ("http://xyz.com/thing", "http://xyz.com/thing/add-to-cart",
                        "http://xyz.com/thing/purchase")),
}
# Modification time (epoch seconds, 2026-05-28) of staged input files: after every event time of
# the test data, so that --max-future-skew (judged against a file's modification time) passes.
FILE_TIME = 1_780_000_000
# The output options of the tests whose subject is not the sink: Parquet files. An idempotent
# Delta append costs about as much again per micro-batch (Delta reconstructs the table's state to
# look up the writer's last version), and the Delta sink has tests of its own (test_delta_output,
# the crash tests, the report's).
PARQUET_OUTPUT = ("--output-format", "parquet")
PAGES = ("a", "b", "c")
SEARCH_PAGES = ("s1", "s2")

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


@st.composite
def conflicting_copy(draw, e: Event, spread: int, campaigns: Sequence[Optional[str]],
                     values: Sequence[Optional[float]]) -> Event:
    """A hypothesis strategy: another copy of ``e``'s record, with its user and ``event_id``,
    within ``spread // 2`` of its ``ts`` (so all copies of a record lie within ``spread`` of
    each other) and other contents drawn afresh over ``PAGES`` and ``SEARCH_PAGES``,
    ``campaigns`` and ``values``; one in four is of the other type."""
    ts = e.ts + draw(st.integers(-(spread // 2), spread // 2))
    if (e.event_type == "impression") != (draw(st.integers(0, 3)) == 0):
        return Event(e.event_id, e.user_id, "impression", ts,
                     impression_id=draw(st.integers(0, 3)),
                     source_url=draw(st.sampled_from(SEARCH_PAGES + PAGES)),
                     target_url=draw(st.sampled_from(PAGES)),
                     campaign=draw(st.sampled_from(campaigns)))
    return Event(e.event_id, e.user_id, "visit", ts, url=draw(st.sampled_from(PAGES)),
                 referer=draw(st.sampled_from(PAGES + SEARCH_PAGES + (None,))),
                 is_goal=draw(st.booleans()), value=draw(st.sampled_from(values)))


def noise_event(draw, event_id: str, user: str, ts: int, campaigns: Sequence[Optional[str]],
                values: Sequence[Optional[float]], impression_ids: int, goal_one_in: int) -> Event:
    """A record off any session (for hypothesis: ``draw`` is its draw function): at random an
    impression (one of ``impression_ids`` ids, shown on a search page or a page, leading to a
    page, with one of ``campaigns``) or a visit to a page from anywhere or nowhere, a goal one
    time in ``goal_one_in``, with one of ``values``."""
    if draw(st.booleans()):
        return Event(event_id, user, "impression", ts,
                     impression_id=draw(st.integers(0, impression_ids - 1)),
                     source_url=draw(st.sampled_from(SEARCH_PAGES + PAGES)),
                     target_url=draw(st.sampled_from(PAGES)),
                     campaign=draw(st.sampled_from(campaigns)))
    return Event(event_id, user, "visit", ts, url=draw(st.sampled_from(PAGES)),
                 referer=draw(st.sampled_from(PAGES + SEARCH_PAGES + (None,))),
                 is_goal=draw(st.integers(0, goal_one_in - 1)) == 0,
                 value=draw(st.sampled_from(values)))


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


def larger_event_set(seed: int) -> list[Event]:
    """A few hundred events of one user: sessions and noise over eight pages, ties included."""
    rng = random.Random(seed)
    pages = [f"/p{k}" for k in range(8)]
    events: list[Event] = []
    for n in range(300):
        ts = rng.randrange(0, 200)
        if rng.random() < 0.2:
            events.append(Event(f"e{n:03d}", "u", "impression", ts,
                                impression_id=rng.randrange(4),
                                source_url=rng.choice(SEARCH_PAGES), target_url=rng.choice(pages)))
        else:
            events.append(Event(f"e{n:03d}", "u", "visit", ts, url=rng.choice(pages),
                                referer=rng.choice(pages + list(SEARCH_PAGES)),
                                is_goal=rng.random() < 0.1))
    rng.shuffle(events)
    return events


# Hand-built scenarios of one user (the unit tests of the core's rules and models).
USER = "u"
SEARCH = "http://search.example/?q=shoes"


def visit(event_id: str, ts: int, url: str, referer: str | None = None, goal: bool = False,
          value: float | None = None) -> Event:
    """A visit of ``USER`` at ``ts`` (epoch ms)."""
    return Event(event_id, USER, "visit", ts, url=url, referer=referer, is_goal=goal, value=value)


def goal(event_id: str, ts: int, url: str, referer: str | None = None,
         value: float | None = None) -> Event:
    """A goal visit of ``USER``."""
    return visit(event_id, ts, url, referer, goal=True, value=value)


def click(event_id: str, ts: int, impression_id: int, target: str, source: str = SEARCH,
          campaign: str | None = None) -> Event:
    """An impression of ``USER`` shown on ``source`` that leads to ``target``."""
    return Event(event_id, USER, "impression", ts, impression_id=impression_id,
                 source_url=source, target_url=target, campaign=campaign)


CAMPAIGNS = (None, "spring", "summer", "brand")


def multi_touch_events(dest: Path, seed: int = 5) -> Path:
    """Generated JSON-lines files, staged in arrival order under ``dest``, where many goals have
    two or more ad clicks upstream (30 users of six sessions each on a 12-page site; redelivered
    copies and bounded disorder, no late events with a 10-minute watermark delay). Each
    impression gets a campaign or none and each goal a value or none, at random: the generator
    writes neither."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    params = GeneratorParams(users=30, seed=seed, files=8, heartbeat=True, pages=12, domains=2,
                             search_pages=4, sessions_per_user=6, paid_session_prob=0.9,
                             session_gap="1 day", dormant_gap_prob=0.0, disorder="bounded",
                             max_delay="2 minutes", redelivery_rate=0.05,
                             watermark_delay="10 minutes")
    generated = generate(params, dest.parent / f"{dest.name}-generated", truth=False, plot=False)
    rng = random.Random(seed)
    extras: dict = {}  # event id -> the fields added, the same for a redelivered copy
    src = dest.parent / f"{dest.name}-src"
    src.mkdir(parents=True)
    for f in generated.event_files:
        records = [json.loads(line) for line in f.read_text().splitlines()]
        for r in records:
            if r["event_type"] == "impression":
                r.update(extras.setdefault(r["event_id"], {"campaign": rng.choice(CAMPAIGNS)}))
            elif r["event_type"] == "visit" and r["is_goal"]:
                value = rng.choice((None, round(rng.uniform(1, 500), 2)))
                r.update(extras.setdefault(r["event_id"], {"value": value}))
        (src / f.name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return stage_in_arrival_order(sorted(src.glob("part-*.json")), dest)


# Conflicting copies: records of one user and event_id with other contents, as (smaller,
# larger) in rule 1's order. Each pair changes the rows if the larger copy is kept.
_COPY_BASE_MS = 1_709_251_200_000  # 2024-03-01 UTC


def _at_minute(event_id: str, user: Optional[str], minute: int, kind: str, **fields) -> Event:
    return Event(event_id, user, kind, _COPY_BASE_MS + minute * 60_000, **fields)


def conflicting_copies() -> tuple[list[Event], list[Event], list[Event]]:
    """``(smaller, larger, common)``: per pair of copies the smaller and the larger one in rule
    1's order, and records with no copy. With the smaller copies, alice's g1 credits click i1 of
    campaign c1 with value 5 (the larger: campaign c2, and a visit to /zzz that cuts the path,
    value 7); g2 credits click x (the larger copy of x is a visit); g3 is organic at minute 5
    (6); g4 is no goal (the larger copy is one); bob's own record i1 is impression 7 (8)."""
    imp, visit = "impression", "visit"
    smaller = [
        _at_minute("i1", "alice", 0, imp, impression_id=1, source_url="s", target_url="/a",
                   campaign="c1"),
        _at_minute("v1", "alice", 1, visit, url="/a", referer="s"),
        _at_minute("g1", "alice", 3, visit, url="/g1", referer="/a", is_goal=True, value=5.0),
        _at_minute("x", "alice", 2, imp, impression_id=2, source_url="s2", target_url="/b"),
        _at_minute("g3", "alice", 5, visit, url="/g3", referer="/a", is_goal=True),
        _at_minute("g4", "alice", 7, visit, url="/g4", referer="/a"),
        _at_minute("i1", "bob", 0, imp, impression_id=7, source_url="s", target_url="/a"),
    ]
    larger = [
        _at_minute("i1", "alice", 0, imp, impression_id=1, source_url="s", target_url="/a",
                   campaign="c2"),
        _at_minute("v1", "alice", 1, visit, url="/zzz", referer="s"),
        _at_minute("g1", "alice", 3, visit, url="/g1", referer="/a", is_goal=True, value=7.0),
        _at_minute("x", "alice", 2, visit, url="/b", referer="s2"),
        _at_minute("g3", "alice", 6, visit, url="/g3", referer="/a", is_goal=True),
        _at_minute("g4", "alice", 7, visit, url="/g4", referer="/a", is_goal=True),
        _at_minute("i1", "bob", 0, imp, impression_id=8, source_url="s", target_url="/a"),
    ]
    common = [
        _at_minute("v2", "alice", 3, visit, url="/b", referer="s2"),
        _at_minute("g2", "alice", 4, visit, url="/g2", referer="/b", is_goal=True),
        _at_minute("bv", "bob", 1, visit, url="/a", referer="s"),
        _at_minute("bg", "bob", 2, visit, url="/bg", referer="/a", is_goal=True),
    ]
    return smaller, larger, common


# What the smaller copies give under last_touch: (user, goal, goal minute, impression_id,
# campaign, trail, goal_value).
CONFLICTING_COPIES_ROWS = [
    ("alice", "g1", 3, 1, "c1", ("/a",), 5.0),
    ("alice", "g2", 4, 2, None, ("/b",), None),
    ("alice", "g3", 5, None, None, (), None),
    ("bob", "bg", 2, 7, None, ("/a",), None),
]


def conflicting_copies_row(row: Attribution) -> tuple:
    """A row in the form of ``CONFLICTING_COPIES_ROWS``."""
    return (row.user_id, row.goal_event_id, (row.goal_ts - _COPY_BASE_MS) // 60_000,
            row.impression_id, row.impression_campaign, tuple(row.trail), row.goal_value)


def stage_conflicting_copies(dest: Path, smaller_first: bool) -> Path:
    """``conflicting_copies`` as three JSON-lines files staged in arrival order under ``dest``:
    the records without copies and one copy of each pair, then the other copies, then a
    heartbeat at minute 30. With a watermark delay of 10 minutes nothing is late."""
    from attribution.spark.files import write_events

    smaller, larger, common = conflicting_copies()
    first, second = (smaller, larger) if smaller_first else (larger, smaller)
    src = dest.parent / f"{dest.name}-src"
    src.mkdir(parents=True)
    files = [src / f"part-{n:05d}.json" for n in range(3)]
    for path, events in zip(files, (common + first, second,
                                    [_at_minute("hb", None, 30, "heartbeat")])):
        write_events(events, path, "json")
    return stage_in_arrival_order(files, dest)


def stage_in_arrival_order(files, dest: Path, first_mtime: int = FILE_TIME) -> Path:
    """Copy event files into ``dest`` with strictly increasing modification times, from
    ``first_mtime`` (epoch seconds) on.

    Spark's file source orders new files by modification time, not by name; files checked out
    together share one, so a stream would read them in arbitrary order.
    """
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(files):
        target = Path(shutil.copy(f, dest))
        os.utime(target, (first_mtime + n, first_mtime + n))
    return dest


def committed_attributions(spark, path: Path) -> list[Attribution]:
    """The output rows the file sink committed, as ``Attribution``s (epoch-ms timestamps): Spark's
    own reading, without the partition column it adds (``goal_date``, not a field of the rows)."""
    from pyspark.sql import functions as F

    from attribution.schema import PARTITION_COLUMN

    frame = spark.read.parquet(str(path)).drop(PARTITION_COLUMN)
    frame = (frame.withColumn("goal_ts", F.unix_millis("goal_ts"))
                  .withColumn("impression_ts", F.unix_millis("impression_ts")))
    return sorted((Attribution(**{**r.asDict(), "trail": tuple(r.trail)})
                   for r in frame.collect()), key=sort_key)


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


# Types of the columns spec sections 7 and 8 add to the output, as Spark writes them.
ADDED_OUTPUT_TYPES = {"impression_campaign": "string", "goal_value": "float64",
                      "credited_value": "float64", "sign": "int32", "revision": "int32",
                      "emit_timing": "string"}


def attribution_record(goal: str, goal_ts: int, impression: int | None = None, *,
                       model: str = "last_touch", credit: float | None = None,
                       user_id: str = "u", **added) -> dict:
    """One output row as a dict: ``impression`` is an impression_id (None: organic), timestamps
    in epoch ms; ``added`` sets columns of ``ADDED_OUTPUT_TYPES``."""
    from attribution.events import ms_to_datetime

    organic = impression is None
    return {"user_id": user_id, "goal_event_id": goal, "goal_url": f"/goal/{goal}",
            "goal_ts": ms_to_datetime(goal_ts), "impression_id": impression,
            "impression_event_id": None if organic else f"i-{impression}",
            "impression_source_url": None if organic else "/search",
            "impression_target_url": None if organic else "/landing",
            "impression_ts": None if organic else ms_to_datetime(goal_ts - 60_000),
            "trail": [] if organic else ["/landing"], "model": model,
            "credit": (0.0 if organic else 1.0) if credit is None else credit, **added}


def output_table(records: list[dict]):
    """Records of ``attribution_record`` as an Arrow table: the output schema, plus the added
    columns the first record has."""
    import pyarrow as pa

    from attribution.schema import OUTPUT_SCHEMA
    from attribution.spark.types import arrow_schema

    # An added column is written only where the records have it, as output of a version before
    # it would lack it.
    present = set(records[0]) if records else set()
    return pa.Table.from_pylist(records, schema=pa.schema(
        [f for f in arrow_schema(OUTPUT_SCHEMA)
         if f.name not in ADDED_OUTPUT_TYPES or f.name in present]))


def goal_date_dir(record: dict) -> str:
    """The partition directory of an output record: ``goal_date=`` its goal's UTC date."""
    from attribution.schema import PARTITION_COLUMN

    return f"{PARTITION_COLUMN}={record['goal_ts'].astimezone(timezone.utc).date().isoformat()}"


def write_sink_output(out: Path, batches: list[list[dict]], compact_interval: int = 10,
                      partitioned: bool = False) -> list[Path]:
    """Write micro-batches as Spark's streaming file sink does: one part file per batch, then its
    ``_spark_metadata`` log file (``<id>.compact`` repeating all earlier entries every
    ``compact_interval`` batches). ``partitioned``: each part file under the ``goal_date=``
    directory of its batch's first record (one date per batch). Returns the part files, in
    batch order."""
    import pyarrow.parquet as pq

    log = out / "_spark_metadata"
    log.mkdir(parents=True, exist_ok=True)
    parts, entries = [], []
    for batch, records in enumerate(batches):
        directory = out / goal_date_dir(records[0]) if partitioned else out
        directory.mkdir(exist_ok=True)
        part = directory / f"part-00000-{batch:08d}-0000-0000-0000-000000000000-c000.snappy.parquet"
        pq.write_table(output_table(records), part)
        parts.append(part)
        entry = {"path": part.as_uri(), "size": part.stat().st_size, "isDir": False,
                 "modificationTime": 0, "blockReplication": 1, "blockSize": 33554432,
                 "action": "add"}
        entries.append(entry)
        compact = (batch + 1) % compact_interval == 0
        name = f"{batch}.compact" if compact else str(batch)
        listed = entries if compact else [entry]
        (log / name).write_text("\n".join(["v1", *(json.dumps(e) for e in listed)]))
    return parts


def write_batch_output(out: Path, records: list[dict], success: bool = True) -> Path:
    """Write rows as a finished (``success``) or unfinished Spark batch write: one part file and
    the ``_SUCCESS`` marker. Returns the part file."""
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    part = out / "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet"
    pq.write_table(output_table(records), part)
    if success:
        (out / "_SUCCESS").write_text("")
    return part


def write_partitioned_batch_output(out: Path, records: list[dict]) -> list[Path]:
    """Write rows as a finished Spark batch write partitioned by goal date does: one part file
    per ``goal_date=`` directory, then ``_SUCCESS``. Returns the part files in path order."""
    import pyarrow.parquet as pq

    by_dir: dict = defaultdict(list)
    for record in records:
        by_dir[goal_date_dir(record)].append(record)
    parts = []
    for name in sorted(by_dir):
        (out / name).mkdir(parents=True)
        part = out / name / "part-00000-00000000-0000-0000-0000-000000000000.c000.snappy.parquet"
        pq.write_table(output_table(by_dir[name]), part)
        parts.append(part)
    (out / "_SUCCESS").write_text("")
    return parts
# -- commands as a user runs them ------------------------------------------------------------------

# What a Python or a Java stack trace prints; none of it may reach a user's terminal.
TRACEBACK_MARKERS = ("Traceback (most recent call last)", "\tat org.", "\tat java.",
                     "Exception in thread", "py4j.protocol", "Py4JJavaError")


# Spark's own defaults for its code generation. `make test` runs every driver JVM on Spark's
# interpreted expressions instead (TEST_SPARK_PROPS in the Makefile); the spark-submit runs of
# each job give these back, so that the suite also runs both jobs as users do.
SPARK_CODEGEN_DEFAULTS = ["--conf", "spark.sql.codegen.wholeStage=true",
                          "--conf", "spark.sql.codegen.factoryMode=FALLBACK"]


def suite_jvm_options_without_spark_settings() -> str:
    """The suite's JVM options (``SPARK_SUBMIT_OPTS``: the JIT's first tier, the class archive)
    less the Spark settings among them (``-Dspark.*``: the interpreted expressions), for a JVM
    that runs with Spark's defaults, as users run it, or that may not take Spark settings (the
    cluster's daemons and executors)."""
    return " ".join(option for option in os.environ.get("SPARK_SUBMIT_OPTS", "").split()
                    if not option.startswith("-Dspark."))


def spark_submit_jar_options() -> list:
    """The documented spark-submit options that carry the project's jars (``--jars`` with the
    fetched ``spark`` profile, and Delta's session settings), as arguments."""
    from jvm import artifacts

    jars = artifacts.fetched_jars(artifacts.SPARK) or artifacts.fetch(artifacts.SPARK)
    conf = [arg for key, value in artifacts.DELTA_CONF.items()
            for arg in ("--conf", f"{key}={value}")]
    return ["--jars", ",".join(str(jar) for jar in jars), *conf]


def command_environment() -> dict:
    """The environment for a command run as a subprocess: this interpreter for Spark's Python."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def obey_file_permissions() -> None:
    """``preexec_fn`` for a subprocess that must obey file permissions even as root (which tests
    often run as): drops the capabilities that override them (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH) from its bounding set, so the command it executes never has them."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def assert_no_traceback(text: str) -> None:
    """Fail if ``text`` holds any part of a Python or Java stack trace."""
    found = [marker for marker in TRACEBACK_MARKERS if marker in text]
    if found:  # the trace's start names its thread and exception; its end may be frames only
        start = max(0, min(text.index(marker) for marker in found) - 500)
        raise AssertionError(f"a traceback reached the terminal ({found}):\n"
                             f"{text[start:start + 2500]}\n[...]\n{text[-500:]}")


def error_line(stderr: str) -> str:
    """The one ``error:`` line a failed command must end its stderr with, after checking that
    it is the last line, the only one, and that no traceback came before it."""
    assert_no_traceback(stderr)
    lines = stderr.rstrip("\n").splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("error: "), f"stderr does not end with an error line:\n{stderr}"
    assert sum(line.startswith("error: ") for line in lines) == 1, stderr
    return lines[-1]


def signal_after_batch_1(command: Sequence[str], cwd, signum: int, to_group: bool = False,
                         watch: str = "stderr", env: Optional[dict] = None,
                         wait_seconds: int = 900) -> tuple[int, str, str]:
    """Run a streaming job's ``command``, send it ``signum`` once its progress line of batch 1
    is printed on its ``watch`` stream (``stderr``, or ``stdout`` under spark-submit, which
    merges the driver's stderr into it), and return its exit code, the watched stream's text and
    the other stream's.

    :param command: the command line (the job should have files left after batch 1).
    :param cwd: its working directory.
    :param signum: the signal.
    :param to_group: send it to the whole process group, as a terminal's Ctrl-C does; else to
        the process alone, as ``kill PID`` or a container stop does.
    :param watch: the stream the progress lines are on.
    :param env: its environment (default: ``command_environment()``).
    :param wait_seconds: a watchdog kills the group after this long.
    """
    import signal
    import subprocess
    import threading

    job = subprocess.Popen(list(command), cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env or command_environment(),
                           start_new_session=True)
    watchdog = threading.Timer(wait_seconds, os.killpg, (job.pid, signal.SIGKILL))
    watchdog.start()
    try:
        before = []
        for line in getattr(job, watch):
            before.append(line)
            if line.startswith("batch 1:"):
                break
        assert before and before[-1].startswith("batch 1:"), "".join(before)
        (os.killpg if to_group else os.kill)(job.pid, signum)
        stdout, stderr = job.communicate()
    finally:
        watchdog.cancel()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    if watch == "stdout":
        return job.returncode, "".join(before) + stdout, stderr
    return job.returncode, "".join(before) + stderr, stdout


def generate_late_dataset(root: Path, *, users: int, seed: int, files: int, total_span: str,
                          redelivery_rate: float, watermark_delay: str):
    """A generated dataset with late records (``late_fraction`` 0.08: impressions lagging their
    visits by 2 hours give or take 3, per source), over 2 days of users within ``total_span``,
    written under ``root / "data"`` without its truth; the generator's result.

    :param root: the directory to write under.
    :param users: the generator's users.
    :param seed: its seed.
    :param files: its event files.
    :param total_span: the event time the dataset spans.
    :param redelivery_rate: the share of records delivered twice.
    :param watermark_delay: the watermark delay the late records are late for.
    """
    from generators.dataset import generate
    from generators.params import GeneratorParams

    params = GeneratorParams(users=users, seed=seed, files=files, heartbeat=True, span="2 days",
                             total_span=total_span, goal_fraction=0.3, paid_session_prob=0.8,
                             disorder="per-source", impression_lag="2 hours",
                             visit_lag="0 seconds", lag_jitter="3 hours", late_fraction=0.08,
                             redelivery_rate=redelivery_rate, watermark_delay=watermark_delay)
    return generate(params, root / "data", truth=False, plot=False)
