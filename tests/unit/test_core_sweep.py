"""The candidate sweep of ``attribution.paths``: exact after consumption, linear in work.

``ReferrerIndex`` gives each goal the impressions with a path to it in one lazy sweep that never
depends on consumption, so consuming never makes it redo any part. These tests check the
answers of goals whose best candidate an earlier goal of the same firing consumed against the
brute-force reference, and count the nodes swept (work, not time): each at most once per
firing, where a re-sweep of the whole history per goal would be quadratic on the hot-key shapes.
"""
from __future__ import annotations

import pytest

from attribution import paths
from attribution.config import AttributionConfig
from attribution.core import WATERMARK_INFINITY, UserAttribution
from attribution.events import Event
from attribution.oracle import attribute_batch
from generators.shapes import SHAPES, hot_key_events
from generators.shapes import hot_key_expected_rows as expected_rows
from support.datasets import larger_event_set
from support.reference import reference_attribution


def _visit(eid, ts, url, referer, goal=False):
    return Event(eid, "u", "visit", ts, url=url, referer=referer, is_goal=goal)


def _click(eid, ts, iid, source, target):
    return Event(eid, "u", "impression", ts, impression_id=iid, source_url=source,
                 target_url=target)


@pytest.fixture
def swept_nodes(monkeypatch):
    """Counts the nodes every ``_sweep_candidates`` call covers."""
    counter = {"nodes": 0, "calls": 0}
    original = paths.ReferrerIndex._sweep_candidates

    def counting(self, stop):
        counter["nodes"] += stop - self._reached
        counter["calls"] += 1
        return original(self, stop)

    monkeypatch.setattr(paths.ReferrerIndex, "_sweep_candidates", counting)
    return counter


def test_second_goal_gets_the_next_best_after_the_first_consumed_the_best(swept_nodes):
    # ad1 (old) and ad2 (newer) both reach /shop; goal g1 takes ad2, so g2 must fall back to ad1
    # from the same sweep.
    events = [
        _click("ad1", 10, 1, "s", "/land"), _visit("v1", 11, "/land", "s"),
        _click("ad2", 20, 2, "s", "/land"), _visit("v2", 21, "/land", "s"),
        _visit("v3", 30, "/shop", "/land"),
        _visit("g1", 40, "/buy", "/shop", goal=True),
        _visit("g2", 50, "/buy", "/shop", goal=True),
        _visit("g3", 60, "/buy", "/shop", goal=True),
    ]
    config = AttributionConfig(lookback_ms=1_000, dedup_window_ms=5)  # two separate clicks
    rows = attribute_batch(events, config)
    assert [(r.goal_event_id, r.impression_id) for r in rows] == [
        ("g1", 2), ("g2", 1), ("g3", None)]
    assert rows == reference_attribution(events, config)
    assert swept_nodes["nodes"] <= len(events), "consumption must not make the sweep redo nodes"


@pytest.mark.parametrize("seed", range(12))
def test_consumption_on_dense_random_users_gives_the_reference_answer(seed, swept_nodes):
    events = larger_event_set(seed)
    config = AttributionConfig(lookback_ms=60, dedup_window_ms=25)
    rows = attribute_batch(events, config)
    assert rows == reference_attribution(events, config)
    # Dense, tie-heavy graphs consume a lot, and goals are swept to one by one: still each node
    # at most once.
    assert swept_nodes["calls"] > 1 and swept_nodes["nodes"] <= len(events)


def test_streaming_firings_resume_the_sweep_where_they_left_off():
    events = larger_event_set(3)
    config = AttributionConfig(lookback_ms=60, dedup_window_ms=25)
    state = UserAttribution("u0", config)
    state.add([e for e in events if e.user_id == "u0"])
    rows = []
    for watermark in range(0, 220, 7):  # many firings, each with a fresh index
        rows.extend(state.fire(watermark))
    rows.extend(state.fire(WATERMARK_INFINITY))
    expected = [r for r in reference_attribution(events, config) if r.user_id == "u0"]
    assert rows == expected


@pytest.mark.parametrize("shape", SHAPES)
def test_hot_key_shapes_sweep_a_linear_number_of_nodes(shape, swept_nodes):
    """Every paid goal consumes its own click and every organic goal's best was consumed by the
    paid goal before it; the work stays the history, swept once, not its square."""
    sessions = 2_000
    events = hot_key_events(sessions, shape=shape)
    state = UserAttribution("hot-user")
    state.add(events)
    rows = state.fire(WATERMARK_INFINITY)
    assert [(r.goal_event_id, r.impression_id, r.trail) for r in rows] == expected_rows(sessions)
    assert swept_nodes["nodes"] <= len(events), swept_nodes
