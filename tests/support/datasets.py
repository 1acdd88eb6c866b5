"""The suite's inputs: fixed, built by hand, generated and drawn.

* ``CH7_DIR``, ``CH7_ROWS``: the chapter 7 dataset and its two rows;
* ``FILE_TIME``, ``stage_in_arrival_order``: copy files so a file stream reads them in a given
  order, with a modification time after every event;
* ``visit``, ``goal``, ``click``, ``USER``, ``SEARCH``, ``PAGES``, ``SEARCH_PAGES``: the parts
  of hand-built sessions;
* ``larger_event_set``: a few hundred random events of one user;
* ``multi_touch_events``, ``CAMPAIGNS``: generated event files with several ads upstream of many
  goals, and campaigns and values;
* ``conflicting_copies``, ``stage_conflicting_copies``, ``CONFLICTING_COPIES_ROWS``,
  ``conflicting_copies_row``: records with copies that differ, as files in either arrival
  order, and the rows rule 1 gives them;
* ``generate_late_dataset``: the generator's files with records behind the watermark;
* ``conflicting_copy``, ``noise_event``: hypothesis strategies for a copy of a record with other
  contents and for a record off any session.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Optional, Sequence

from hypothesis import strategies as st

from attribution import Event
from attribution.core import Attribution
from support import ROOT

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


PAGES = ("a", "b", "c")


SEARCH_PAGES = ("s1", "s2")


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
