"""Helpers shared by test modules of every tier (tests import these, never each other).

* ``ROOT``, ``CH7_DIR``: the repository and the chapter 7 dataset in it;
* ``stage_in_arrival_order``: copy files so a file stream reads them in a given order;
* ``committed_attributions``: the rows a Spark file sink committed;
* ``reference_attribution``: an independent brute-force reading of the rules, on networkx;
* ``larger_event_set``: a few hundred random events of one user;
* ``command_environment``, ``obey_file_permissions``, ``assert_no_traceback``,
  ``error_line``: running a command as a user would, and reading its stderr.
"""
from __future__ import annotations

import ctypes
import os
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

import networkx as nx

from attribution import AttributionConfig, Event
from attribution.core import Attribution
from attribution.oracle import sort_key

ROOT = Path(__file__).resolve().parent.parent
CH7_DIR = ROOT / "tests" / "data" / "ch7"
PAGES = ("a", "b", "c")
SEARCH_PAGES = ("s1", "s2")

# How often the property saw each interesting situation; a test below asserts that every one
# of them was exercised, so the property cannot pass by only ever seeing trivial inputs.
COVERAGE: Counter = Counter()



def _order(e: Event) -> tuple[int, str]:
    return (e.ts, e.event_id)


def reference_attribution(arrivals: Iterable[Event], config: AttributionConfig) -> list[Attribution]:
    """Spec rules 1-7 applied literally: every edge enumerated, candidates by graph ancestry."""
    first_copies: dict[str, dict[str, Event]] = defaultdict(dict)
    for e in arrivals:
        if e.event_type != "heartbeat":
            first_copies[e.user_id].setdefault(e.event_id, e)  # rule 1: the first copy counts

    rows = []
    for user_id, by_id in first_copies.items():
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

        consumed: set[str] = set()
        goals = sorted((e for e in events if e.event_type == "visit" and e.is_goal), key=_order)
        for goal in goals:  # rule 7
            ancestors = nx.ancestors(graph, goal.event_id)
            candidates = [i for i in canonical  # rule 4
                          if i.event_id not in consumed and i.event_id in ancestors
                          and goal.ts - i.ts <= config.lookback_ms]
            COVERAGE["goals with a consumed impression upstream"] += any(
                i.event_id in consumed and i.event_id in ancestors for i in canonical)
            COVERAGE["goals with an impression upstream beyond the lookback"] += any(
                i.event_id in ancestors and goal.ts - i.ts > config.lookback_ms for i in canonical)
            COVERAGE["goals with a superseded click upstream"] += any(
                e.event_type == "impression" and e.event_id in ancestors and e not in canonical
                for e in events)
            if not candidates:
                rows.append(Attribution(user_id, goal.event_id, goal.url, goal.ts, None, None,
                                        None, None, None, (), "last_touch", 0.0))
                continue
            winner = min(candidates, key=lambda i: (-i.ts, i.impression_id, i.event_id))  # rule 5
            consumed.add(winner.event_id)
            reachable = nx.descendants(graph, winner.event_id)
            trail: list[str] = []
            current = goal
            while not graph.has_edge(winner.event_id, current.event_id):  # rule 6
                predecessors = [by_id[p] for p in graph.predecessors(current.event_id)
                                if by_id[p].event_type == "visit" and p in reachable]
                current = max(predecessors, key=_order)
                trail.insert(0, current.url)
            rows.append(Attribution(user_id, goal.event_id, goal.url, goal.ts,
                                    winner.impression_id, winner.event_id, winner.source_url,
                                    winner.target_url, winner.ts, tuple(trail), "last_touch", 1.0))
    return sorted(rows, key=sort_key)


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


def stage_in_arrival_order(files, dest: Path) -> Path:
    """Copy event files into ``dest`` with strictly increasing modification times.

    Spark's file source orders new files by modification time, not by name; files checked out
    together share one, so a stream would read them in arbitrary order.
    """
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(files):
        target = Path(shutil.copy(f, dest))
        os.utime(target, (1_600_000_000 + n, 1_600_000_000 + n))
    return dest


def committed_attributions(spark, path: Path) -> list[Attribution]:
    """The output rows the file sink committed, as ``Attribution``s (epoch-ms timestamps)."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(path))
    frame = (frame.withColumn("goal_ts", F.unix_millis("goal_ts"))
                  .withColumn("impression_ts", F.unix_millis("impression_ts")))
    return sorted((Attribution(**{**r.asDict(), "trail": tuple(r.trail)})
                   for r in frame.collect()), key=sort_key)


# -- commands as a user runs them ------------------------------------------------------------------

# What a Python or a Java stack trace prints; none of it may reach a user's terminal.
TRACEBACK_MARKERS = ("Traceback (most recent call last)", "\tat org.", "\tat java.",
                     "Exception in thread", "py4j.protocol", "Py4JJavaError")


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
    assert not found, f"a traceback reached the terminal ({found}):\n{text[-3000:]}"


def error_line(stderr: str) -> str:
    """The one ``error:`` line a failed command must end its stderr with, after checking that
    it is the last line, the only one, and that no traceback came before it."""
    assert_no_traceback(stderr)
    lines = stderr.rstrip("\n").splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("error: "), f"stderr does not end with an error line:\n{stderr}"
    assert sum(line.startswith("error: ") for line in lines) == 1, stderr
    return lines[-1]
