"""Large single-user inputs: correct answers, no recursion limits, and no timing assertions.

Speed is measured by ``benchmarks/core.py``; these tests only check that long sessions and
long URL cycles come out right, which a recursive walk or a quadratic blow-up would break.
"""
from __future__ import annotations

import sys

from attribution import AttributionConfig, Event
from attribution.core import WATERMARK_INFINITY, UserAttribution
from generators.shapes import chain_events

HOPS = 10_000


def test_a_10000_hop_session_gets_the_full_trail():
    assert sys.getrecursionlimit() < HOPS  # a recursive walk would fail here
    events = chain_events(HOPS, goal_every=HOPS)
    state = UserAttribution("bench-user")
    assert state.add(events).accepted == HOPS + 1
    [row] = state.fire(WATERMARK_INFINITY)
    assert row.goal_event_id == f"v{HOPS - 1:07d}"
    assert row.impression_id == 0
    assert row.trail == tuple(f"/p{n}" for n in range(HOPS - 1))


def test_a_10000_hop_session_survives_state_bytes_and_streaming_watermarks():
    events = chain_events(HOPS, goal_every=HOPS)
    state = UserAttribution("bench-user")
    rows = []
    for start in range(0, len(events), 1_000):
        state = UserAttribution.from_bytes(state.to_bytes())
        batch = events[start:start + 1_000]
        assert state.add(batch).late == 0
        rows.extend(state.advance(batch[-1].ts))  # the next batch starts later
    rows.extend(state.advance(WATERMARK_INFINITY))
    assert [len(r.trail) for r in rows] == [HOPS - 1]


def test_a_10000_visit_url_cycle_walks_back_through_every_lap():
    # Three pages referring to each other in a ring, 10,000 visits long: the URL graph is one
    # cycle, the time-respecting graph one path.
    ring = ["/a", "/b", "/c"]
    events = [Event("click", "u", "impression", 0, impression_id=1, source_url="s",
                    target_url="/a"),
              Event("v00000", "u", "visit", 1, url="/a", referer="s")]
    for n in range(1, HOPS):
        events.append(Event(f"v{n:05d}", "u", "visit", n + 1, url=ring[n % 3],
                            referer=ring[(n - 1) % 3]))
    events.append(Event("goal", "u", "visit", HOPS + 1, url="/done", referer=ring[(HOPS - 1) % 3],
                        is_goal=True))
    state = UserAttribution("u", AttributionConfig())
    state.add(events)
    [row] = state.fire(WATERMARK_INFINITY)
    assert row.impression_event_id == "click"
    assert row.trail == tuple(ring[n % 3] for n in range(HOPS))


def test_many_goals_on_one_long_chain_consume_the_single_click_once():
    events = chain_events(HOPS, goal_every=100)
    state = UserAttribution("bench-user")
    state.add(events)
    rows = state.fire(WATERMARK_INFINITY)
    assert len(rows) == HOPS // 100
    assert [r.organic for r in rows] == [False] + [True] * (HOPS // 100 - 1)
    assert rows[0].trail == tuple(f"/p{n}" for n in range(99))
