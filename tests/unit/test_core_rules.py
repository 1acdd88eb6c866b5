"""One focused test per rule of the spec (sections 2 and 3), each on a hand-built scenario.

Every scenario is small enough to work out by hand from the spec text; the expected rows in the
assertions are that hand computation. Times are small integers (epoch milliseconds) unless a rule
is about calendar days.
"""
from __future__ import annotations

import itertools
import random

import pytest

from attribution import AttributionConfig, Event, attribute_batch
from attribution.config import MS_PER_DAY, parse_duration_ms
from attribution.core import STATE_VERSION, WATERMARK_INFINITY, UserAttribution
from attribution.events import ts_to_ms
from attribution.schema import OUTPUT_FIELDS
from support.datasets import SEARCH, USER, click, goal, visit

OTHER_SEARCH = "http://other.example/?q=shoes"


def attribute(events, config: AttributionConfig = AttributionConfig()):
    """All events in one batch, then the watermark at infinity; rows by goal event id."""
    state = UserAttribution(USER, config)
    state.add(events)
    return {row.goal_event_id: row for row in state.fire(WATERMARK_INFINITY)}


def credited(events, config: AttributionConfig = AttributionConfig()):
    """Goal event id -> (credited impression event id or None, trail)."""
    return {g: (row.impression_event_id, row.trail) for g, row in attribute(events, config).items()}


# -- rule 1: record dedup ------------------------------------------------------------------------

def test_redelivered_records_count_once():
    events = [click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH), goal("g1", 2, "/g", "/a")]
    state = UserAttribution(USER)
    first = state.add(events)
    again = state.add(events + [events[2]])
    assert (first.accepted, first.duplicates) == (3, 0)
    assert (again.accepted, again.duplicates) == (0, 4)
    rows = state.fire(WATERMARK_INFINITY)
    assert [(r.goal_event_id, r.impression_event_id, r.trail)
            for r in rows] == [("g1", "i1", ("/a",))]


def both_orders(events: list) -> list:
    """``events`` in the order given and reversed: copies of one record arrive either way round."""
    return [events, events[::-1]]


@pytest.mark.parametrize("first", [0, 1], ids=["smaller-first", "smaller-last"])
def test_the_smallest_copy_of_a_visit_wins_whichever_arrives_first(first):
    # Equal ts, so the url decides: "/a" is smaller than "/zzz", and only "/a" follows the click.
    copies = both_orders([visit("v1", 1, "/a", SEARCH), visit("v1", 1, "/zzz", SEARCH)])[first]
    events = [click("i1", 0, 1, "/a"), *copies, goal("g1", 2, "/g", "/a")]
    assert credited(events) == {"g1": ("i1", ("/a",))}


@pytest.mark.parametrize("first", [0, 1], ids=["smaller-first", "smaller-last"])
def test_the_smallest_copy_of_an_impression_wins_whichever_arrives_first(first):
    copies = both_orders([click("i1", 0, 111, "/a"), click("i1", 0, 999, "/a")])[first]
    events = [*copies, visit("v1", 1, "/a", SEARCH), goal("g1", 2, "/g", "/a")]
    assert attribute(events)["g1"].impression_id == 111


@pytest.mark.parametrize("first", [0, 1], ids=["smaller-first", "smaller-last"])
def test_the_earlier_copy_wins_before_any_other_field(first):
    # The copy at ts 1 has the larger url, yet the earlier ts decides.
    copies = both_orders([visit("v1", 1, "/zzz", SEARCH), visit("v1", 2, "/a", SEARCH)])[first]
    events = [click("i1", 0, 1, "/a"), *copies, goal("g1", 3, "/g", "/a")]
    assert credited(events) == {"g1": (None, ())}
    state = UserAttribution(USER)
    result = [state.add([e]) for e in copies]
    assert [(r.accepted, r.duplicates, r.replaced) for r in result] == (
        [(1, 0, 0), (0, 1, 0)] if first == 0 else [(1, 0, 0), (1, 0, 1)])
    assert state.visits["v1"].url == "/zzz"


@pytest.mark.parametrize("first", [0, 1], ids=["click-first", "visit-first"])
def test_a_record_id_shared_by_a_click_and_a_visit_is_one_record(first):
    # The click is earlier, so the visit "x" is its copy and there is no visit to "/a".
    copies = both_orders([click("x", 0, 1, "/a"), visit("x", 1, "/a", SEARCH)])[first]
    assert credited([*copies, goal("g1", 2, "/g", "/a")]) == {"g1": (None, ())}
    # At equal ts the type decides: "impression" comes before "visit".
    copies = both_orders([click("x", 1, 1, "/a"), visit("x", 1, "/a", SEARCH)])[first]
    state = UserAttribution(USER)
    state.add(copies)
    assert (list(state.visits), [i.event_id for i in state.impressions.values()]) == ([], ["x"])


@pytest.mark.parametrize("first", [0, 1], ids=["goal-first", "visit-first"])
def test_a_goal_copy_loses_to_a_smaller_copy_that_is_no_goal(first):
    # is_goal false comes before true: the record is a plain visit and no goal fires for it.
    copies = both_orders([visit("g1", 2, "/g", "/a"), goal("g1", 2, "/g", "/a")])[first]
    events = [click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH), *copies]
    assert attribute(events) == {}


@pytest.mark.parametrize("values, kept", [((5.0, 3.0), 3.0), ((None, 1.0), None),
                                          ((0.0, -0.0), -0.0)])
def test_goal_copies_that_differ_in_value_keep_the_smallest_value(values, kept):
    for copies in both_orders([goal("g1", 2, "/g", "/a", value=v) for v in values]):
        row = attribute([click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH), *copies])["g1"]
        assert row.goal_value == kept and str(row.goal_value) == str(kept)


def test_the_copy_order_is_ts_then_type_then_the_fields_in_schema_order():
    from attribution.core import copy_order
    from attribution.paths import Impression, Visit

    ordered = [
        Impression("x", 9, 1, "s", "t"),                      # the smallest ts first
        Impression("x", 1, 2, "z", "z"),                      # impression_id before the urls
        Impression("x", 2, 2, "a", "z"),                      # then source_url
        Impression("x", 2, 2, "b", "a"),
        Impression("x", 2, 2, "b", "b", campaign=None),       # a missing campaign first
        Impression("x", 2, 2, "b", "b", campaign="c"),
        Visit("x", 2, "/a", "/z"),                            # impression before visit
        Visit("x", 2, "/b", None),                            # url before referer
        Visit("x", 2, "/b", "/a"),                            # a missing referer first
        Visit("x", 2, "/b", "/a", True, True, None),          # false before true
        Visit("x", 2, "/b", "/a", True, True, -1.0),          # a missing value first
        Visit("x", 2, "/b", "/a", True, True, -0.0),
        Visit("x", 2, "/b", "/a", True, True, 0.0),           # -0.0 before 0.0
    ]
    keys = [copy_order(r) for r in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # Pending or consumed marks are state, not part of the record.
    assert copy_order(Visit("x", 2, "/b", "/a", True, False)) == keys[9]
    assert copy_order(Impression("x", 2, 2, "b", "a", consumed=3)) == keys[3]


def test_a_replaced_canonical_click_hands_its_logical_impression_to_the_next_member():
    # "a" and "b" are one logical impression, "a" canonical. A smaller copy of "a" targets
    # another page: "b" becomes canonical for "/t" and is credited.
    clicks = [click("a", 5, 1, "/t"), click("b", 6, 2, "/t"), click("a", 4, 1, "/u")]
    rest = [visit("v", 7, "/t", SEARCH), goal("g", 8, "/x", "/t")]
    for arrivals in itertools.permutations(clicks):
        assert credited([*arrivals, *rest]) == {"g": ("b", ("/t",))}
        state = UserAttribution(USER)
        state.add([*arrivals, *rest])
        assert sorted(i.event_id for i in state.impressions.values()) == ["a", "b"]
        assert state.superseded == {}


def test_a_smaller_copy_of_a_superseded_click_can_become_canonical():
    clicks = [click("a", 5, 1, "/t"), click("b", 6, 2, "/t"), click("b", 3, 2, "/t")]
    rest = [visit("v", 7, "/t", SEARCH), goal("g", 8, "/x", "/t")]
    for arrivals in itertools.permutations(clicks):
        assert credited([*arrivals, *rest]) == {"g": ("b", ("/t",))}


def test_any_arrival_order_of_conflicting_copies_gives_the_same_rows():
    """Every order of a user's records, copies that differ in every way included, gives the rows
    of one order, and those are the rows of the smallest copy of each record."""
    smallest = [click("i1", 0, 1, "/a", campaign="c1"), click("i2", 1, 2, "/a"),
                visit("v1", 2, "/a", SEARCH), goal("g1", 4, "/g", "/a", value=1.0)]
    larger = [click("i1", 0, 1, "/a", campaign="c2"), visit("i2", 1, "/a", SEARCH),
              visit("v1", 3, "/a", SEARCH), goal("g1", 4, "/h", "/a", value=0.5)]
    config = AttributionConfig(models="all")
    expected = attribute_batch(smallest, config)
    assert (expected[0].impression_event_id, expected[0].impression_campaign,
            expected[0].goal_url, expected[0].goal_value) == ("i1", "c1", "/g", 1.0)
    rng = random.Random(7)
    for _ in range(300):
        arrivals = smallest + larger
        rng.shuffle(arrivals)
        assert attribute_batch(arrivals, config) == expected, arrivals


@pytest.mark.parametrize("clicks", [
    [click("a", 5, 1, "/t"), click("b", 6, 2, "/t")],   # "b" arrives as a click-spam copy
    [click("b", 6, 2, "/t"), click("a", 5, 1, "/t")],   # "b" is canonical, then superseded
], ids=["superseded-on-arrival", "superseded-later"])
@pytest.mark.parametrize("visit_first", [False, True])
def test_a_superseded_click_still_wins_over_a_larger_copy(clicks, visit_first):
    # The click "b" (ts 6) is smaller than the visit "b" (ts 7): the visit is dropped, however
    # they arrive, so no visit to "/t" precedes the goal and the goal is organic.
    reuse = [visit("b", 7, "/t", SEARCH)]
    events = (reuse + clicks if visit_first else clicks + reuse) + [goal("g", 8, "/x", "/t")]
    assert credited(events) == {"g": (None, ())}


@pytest.mark.parametrize("round_trip", ["to_bytes", "restore"])
def test_superseded_clicks_survive_the_state_and_leave_with_their_bucket(round_trip):
    config = AttributionConfig(lookback_ms=100, dedup_window_ms=10)
    state = UserAttribution(USER, config)
    state.add([click("a", 5, 1, "/t"), click("b", 6, 2, "/t")])
    assert {k: (m.ts, m.impression_id) for k, m in state.superseded.items()} == {"b": (6, 2)}
    if round_trip == "to_bytes":
        state = UserAttribution.from_bytes(state.to_bytes(), config)
    else:
        state = UserAttribution.restore(USER, state.visits.values(),
                                        [*state.impressions.values(), *state.superseded.values()],
                                        config=config)
    assert {k: (m.ts, m.impression_id) for k, m in state.superseded.items()} == {"b": (6, 2)}
    assert state.add([visit("b", 7, "/t", SEARCH)]).duplicates == 1
    state.gc(109)   # the bucket [0, 10) ends at 10 <= 109 - 100: not yet
    assert set(state.superseded) == {"b"}
    state.gc(110)
    assert state.superseded == {} and state.is_empty


def test_a_superseded_id_of_a_version_4_state_keeps_its_copy():
    """A version-4 blob kept a superseded click's id and dedup bucket only: that id keeps the
    copy it has (every later copy is dropped, as version 4's rule did), the rest of the state
    follows rule 1, and the id leaves with its bucket."""
    import pickle

    config = AttributionConfig(lookback_ms=100, dedup_window_ms=10)
    blob = bytes([4]) + pickle.dumps((
        USER, None, [],
        [("a", 1, 5, SEARCH, "/t", 0, None)],
        [("b", 0)],
        []), protocol=5)
    state = UserAttribution.from_bytes(blob, config)
    assert state.superseded == {"b": 0}
    result = state.add([click("b", 1, 2, "/t"), click("a", 4, 1, "/t")])
    assert (result.duplicates, result.replaced) == (1, 1)   # "b" kept its copy; "a" replaced
    again = UserAttribution.from_bytes(state.to_bytes(), config)
    assert again.to_bytes()[0] == STATE_VERSION and again.superseded == {"b": 0}
    assert [i.ts for i in again.impressions.values()] == [4]
    again.gc(110)
    assert again.superseded == {} and again.is_empty


def test_a_version_1_state_blob_still_reads():
    import io
    import pickle

    import fastavro

    from attribution import state_codec

    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH)])
    record = {"user_id": USER, "watermark": None,
              "visits": [{"event_id": "v1", "ts": 1, "url": "/a", "referer": SEARCH, "goal": 0}],
              "impressions": [{"event_id": "i1", "impression_id": 1, "ts": 0, "source_url": SEARCH,
                               "target_url": "/a", "consumed": False}]}
    buf = io.BytesIO()
    buf.write(bytes([1]))
    fastavro.schemaless_writer(buf, state_codec.AVRO_WRITER_SCHEMAS[1], record)
    old = UserAttribution.from_bytes(buf.getvalue())
    # Equal contents; the bytes may differ, as pickle shares strings that share identity.
    assert pickle.loads(old.to_bytes()[1:]) == pickle.loads(state.to_bytes()[1:])
    assert old.superseded == {}


def test_the_state_blob_holds_each_url_once():
    """Equal URLs parsed from separate events are separate strings; the blob still stores each
    once (a back-reference for every repeat), however many visits and impressions name it."""
    def fresh(text: str) -> str:  # an equal string that is another object, as parsing gives
        return "".join(list(text))

    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, fresh("/landing-page"), fresh(SEARCH)),
               visit("v1", 1, fresh("/landing-page"), fresh(SEARCH)),
               visit("v2", 2, fresh("/next-page"), fresh("/landing-page")),
               visit("v3", 3, fresh("/landing-page"), fresh("/next-page"))])
    blob = state.to_bytes()
    for url in (SEARCH, "/landing-page", "/next-page"):
        assert blob.count(url.encode()) == 1
    assert UserAttribution.from_bytes(blob).to_bytes() == blob


def test_dedup_survives_a_state_round_trip():
    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH)])
    state = UserAttribution.from_bytes(state.to_bytes())
    result = state.add([visit("v1", 1, "/a", SEARCH), click("i1", 0, 1, "/a")])
    assert (result.accepted, result.duplicates) == (0, 2)


# -- rule 2: the time-respecting referer graph -----------------------------------------------

@pytest.mark.parametrize("landing_ts, expected", [(10, ("i1", ("/a",))), (30, (None, ()))])
def test_a_referer_visited_only_later_gives_no_edge(landing_ts, expected):
    events = [click("i1", 0, 1, "/a"), visit("land", landing_ts, "/a", SEARCH),
              goal("g1", 20, "/g", "/a")]
    assert credited(events) == {"g1": expected}


@pytest.mark.parametrize("click_ts, expected", [(9, ("i1", ())), (11, (None, ()))])
def test_an_impression_after_the_visit_gives_no_edge(click_ts, expected):
    events = [click("i1", click_ts, 1, "/a"), goal("g1", 10, "/a", SEARCH)]
    assert credited(events) == {"g1": expected}


@pytest.mark.parametrize("click_id, expected", [("e0", ("e0", ())), ("e2", (None, ()))])
def test_equal_timestamps_are_ordered_by_event_id(click_id, expected):
    events = [click(click_id, 5, 1, "/a"), goal("e1", 5, "/a", SEARCH)]
    assert credited(events) == {"e1": expected}


def test_an_impression_edge_needs_both_source_and_target_to_match():
    events = [click("i1", 0, 1, "/a", source=OTHER_SEARCH), goal("g1", 1, "/a", SEARCH),
              click("i2", 2, 2, "/b"), goal("g2", 3, "/c", SEARCH)]
    assert credited(events) == {"g1": (None, ()), "g2": (None, ())}


# -- rule 3: logical impressions and the dedup bucket ---------------------------------------

MIDNIGHT = ts_to_ms("2023-11-16T00:00:00Z")


@pytest.mark.parametrize("first_click_ts, logical_impressions", [
    (MIDNIGHT - 1, 2),                     # 23:59:59.999 and 00:00:00.000: two UTC days
    (MIDNIGHT - MS_PER_DAY, 2),            # 00:00:00.000 the day before: the bucket's first ms
    (MIDNIGHT - MS_PER_DAY - 1, 2),
    (MIDNIGHT, 1),                         # the same millisecond
])
def test_dedup_bucket_edge_at_utc_midnight(first_click_ts, logical_impressions):
    """Two clicks on one ad, the second at midnight; two goals reachable from both clicks.

    With two logical impressions, the first goal takes the later click and the second goal the
    earlier one; with one, the first goal takes the canonical click and the second is organic.
    """
    events = [click("early", first_click_ts, 1, "/a"), click("late", MIDNIGHT, 2, "/a"),
              visit("land", MIDNIGHT + 1, "/a", SEARCH),
              goal("g1", MIDNIGHT + 2, "/g", "/a"), goal("g2", MIDNIGHT + 3, "/g", "/a")]
    got = credited(events, AttributionConfig(dedup_window_ms=parse_duration_ms("1 day")))
    if logical_impressions == 2:
        assert got == {"g1": ("late", ("/a",)), "g2": ("early", ("/a",))}
    else:
        assert got == {"g1": ("early", ("/a",)), "g2": (None, ())}


def test_clicks_within_one_utc_day_are_one_logical_impression():
    events = [click("c1", MIDNIGHT, 1, "/a"), click("c2", MIDNIGHT + MS_PER_DAY - 1, 2, "/a"),
              visit("land", MIDNIGHT + MS_PER_DAY, "/a", SEARCH),
              goal("g1", MIDNIGHT + MS_PER_DAY + 1, "/g", "/a"),
              goal("g2", MIDNIGHT + MS_PER_DAY + 2, "/g", "/a")]
    assert credited(events) == {"g1": ("c1", ("/a",)), "g2": (None, ())}


def test_clicks_on_different_ads_are_not_deduplicated():
    events = [click("c1", 0, 1, "/a"), click("c2", 1, 2, "/a", source=OTHER_SEARCH),
              visit("v1", 2, "/a", SEARCH), visit("v2", 3, "/a", OTHER_SEARCH),
              goal("g1", 4, "/g", "/a"), goal("g2", 5, "/g", "/a")]
    assert credited(events) == {"g1": ("c2", ("/a",)), "g2": ("c1", ("/a",))}


@pytest.mark.parametrize("arrival", ["forward", "reversed"])
@pytest.mark.parametrize("members, canonical", [
    # (event_id, ts, impression_id) of the clicks on one ad in one bucket
    ([("e1", 3, 1), ("e2", 2, 9)], "e2"),           # earliest ts first, whatever its id
    ([("e1", 2, 9), ("e2", 2, 4)], "e2"),           # equal ts: smallest impression_id
    ([("e2", 2, 4), ("e1", 2, 4)], "e1"),           # then smallest event_id
])
def test_canonical_member_is_the_smallest_ts_impression_id_event_id(members, canonical, arrival):
    clicks = [click(eid, ts, iid, "/a") for eid, ts, iid in members]
    if arrival == "reversed":
        clicks.reverse()
    events = clicks + [visit("land", 10, "/a", SEARCH), goal("g1", 11, "/g", "/a"),
                       goal("g2", 12, "/g", "/a")]
    assert credited(events) == {"g1": (canonical, ("/a",)), "g2": (None, ())}


# -- rule 4: the lookback boundary ---------------------------------------------------------------

@pytest.mark.parametrize("extra_ms, attributed", [(-1, True), (0, True), (1, False)])
def test_lookback_boundary_is_inclusive(extra_ms, attributed):
    lookback = AttributionConfig().lookback_ms
    assert lookback == parse_duration_ms("90 days")
    events = [click("i1", 0, 1, "/a"), visit("land", 1, "/a", SEARCH),
              goal("g1", lookback + extra_ms, "/g", "/a")]
    expected = ("i1", ("/a",)) if attributed else (None, ())
    assert credited(events) == {"g1": expected}


def test_lookback_excludes_an_old_impression_but_not_a_newer_one_on_the_same_path():
    config = AttributionConfig(lookback_ms=10)
    events = [click("old", 0, 1, "/a"), click("new", 5, 2, "/a", source=OTHER_SEARCH),
              visit("v1", 1, "/a", SEARCH), visit("v2", 6, "/a", OTHER_SEARCH),
              goal("g1", 11, "/g", "/a"), goal("g2", 12, "/g", "/a")]
    assert credited(events, config) == {"g1": ("new", ("/a",)), "g2": (None, ())}


# -- rule 5: last touch and its tie-breaks -------------------------------------------------------

def _two_ads_to_one_goal(a: tuple, b: tuple) -> dict:
    """Two clicks on different ads, each ``(event_id, ts, impression_id)``, both reaching g1."""
    (ea, ta, ia), (eb, tb, ib) = a, b
    events = [click(ea, ta, ia, "/a"), click(eb, tb, ib, "/a", source=OTHER_SEARCH),
              visit("v1", 10, "/a", SEARCH), visit("v2", 11, "/a", OTHER_SEARCH),
              goal("g1", 20, "/g", "/a")]
    return attribute(events)["g1"]


def test_last_touch_takes_the_greatest_ts():
    assert _two_ads_to_one_goal(("x", 2, 1), ("y", 3, 9)).impression_event_id == "y"
    assert _two_ads_to_one_goal(("x", 3, 9), ("y", 2, 1)).impression_event_id == "x"


def test_last_touch_tie_on_ts_goes_to_the_smallest_impression_id():
    assert _two_ads_to_one_goal(("x", 3, 7), ("y", 3, 3)).impression_id == 3
    assert _two_ads_to_one_goal(("y", 3, 3), ("x", 3, 7)).impression_id == 3


def test_last_touch_tie_on_ts_and_impression_id_goes_to_the_smallest_event_id():
    assert _two_ads_to_one_goal(("b", 3, 5), ("a", 3, 5)).impression_event_id == "a"
    assert _two_ads_to_one_goal(("a", 3, 5), ("b", 3, 5)).impression_event_id == "a"


def test_credited_row_carries_the_impression_fields_and_full_credit():
    row = _two_ads_to_one_goal(("x", 2, 41), ("y", 3, 42))
    assert row.impression_id == 42
    assert row.impression_event_id == "y"
    assert row.impression_source_url == OTHER_SEARCH
    assert row.impression_target_url == "/a"
    assert row.impression_ts == 3
    assert (row.goal_url, row.goal_ts, row.model, row.credit) == ("/g", 20, "last_touch", 1.0)


# -- rule 6: the trail ---------------------------------------------------------------------------

def _trail_scenario(cart_a: tuple, cart_c: tuple) -> tuple[str, ...]:
    """Two reachable visits to /cart precede the goal: one referred by /a, one by /c.

    Each argument is ``(event_id, ts)`` of that /cart visit. The trail must go through the one
    with the greatest ``(ts, event_id)``.
    """
    events = [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH), visit("vc", 2, "/c", "/a"),
              visit(cart_a[0], cart_a[1], "/cart", "/a"),
              visit(cart_c[0], cart_c[1], "/cart", "/c"),
              goal("g1", 9, "/done", "/cart")]
    row = attribute(events)["g1"]
    assert row.impression_event_id == "i1"
    return row.trail


def test_trail_steps_to_the_predecessor_with_the_greatest_ts():
    assert _trail_scenario(("k1", 5), ("k2", 4)) == ("/a", "/cart")
    assert _trail_scenario(("k1", 4), ("k2", 5)) == ("/a", "/c", "/cart")


def test_trail_tie_on_ts_goes_to_the_greatest_event_id():
    assert _trail_scenario(("k2", 5), ("k1", 5)) == ("/a", "/cart")
    assert _trail_scenario(("k1", 5), ("k2", 5)) == ("/a", "/c", "/cart")


def test_trail_skips_a_later_predecessor_the_impression_cannot_reach():
    events = [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH),
              visit("reached", 2, "/b", "/a"),
              visit("unreached", 3, "/b", "/elsewhere"),  # later, but not downstream of i1
              goal("g1", 4, "/g", "/b")]
    assert credited(events) == {"g1": ("i1", ("/a", "/b"))}


def test_trail_stops_at_a_direct_edge_even_when_a_longer_path_exists():
    events = [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH), visit("vb", 2, "/b", "/a"),
              visit("va2", 3, "/a", "/b"), goal("g1", 4, "/a", SEARCH)]
    assert credited(events) == {"g1": ("i1", ())}


# -- rule 7: goals in order, consumption, goals as hops, organic rows ---------------------

def test_consumption_gives_the_second_goal_the_next_best_then_organic():
    events = [click("old", 0, 1, "/a"), click("new", 1, 2, "/a", source=OTHER_SEARCH),
              visit("v1", 2, "/a", SEARCH), visit("v2", 3, "/a", OTHER_SEARCH),
              goal("g1", 4, "/g", "/a"), goal("g2", 5, "/g", "/a"), goal("g3", 6, "/g", "/a")]
    assert credited(events) == {"g1": ("new", ("/a",)), "g2": ("old", ("/a",)), "g3": (None, ())}


def test_consumption_holds_across_separate_firings():
    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH), goal("g1", 2, "/g", "/a"),
               goal("g2", 5, "/g", "/a")])
    assert [r.impression_event_id for r in state.advance(2)] == ["i1"]
    assert [r.organic for r in state.advance(5)] == [True]


def test_goals_at_equal_ts_are_attributed_in_event_id_order():
    events = [click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH),
              goal("g-b", 2, "/g", "/a"), goal("g-a", 2, "/g", "/a")]
    assert credited(events) == {"g-a": ("i1", ("/a",)), "g-b": (None, ())}


def test_a_goal_is_a_hop_for_a_later_goal():
    # i2 is the last touch for the sign-up goal; the purchase goal then walks through the
    # sign-up page (a goal) back to i1, whose landing visit i2 cannot reach.
    events = [click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH),
              click("i2", 2, 2, "/a", source=OTHER_SEARCH), visit("v2", 3, "/a", OTHER_SEARCH),
              goal("signup", 4, "/signup", "/a"), goal("purchase", 5, "/purchase", "/signup")]
    assert credited(events) == {"signup": ("i2", ("/a",)),
                                "purchase": ("i1", ("/a", "/signup"))}


def test_an_unreachable_goal_gives_an_organic_row():
    rows = attribute([click("i1", 0, 1, "/a"), goal("g1", 5, "/g", "/nowhere"),
                      goal("g2", 6, "/h")])
    assert set(rows) == {"g1", "g2"}
    record = rows["g1"].to_record()
    assert tuple(record) == OUTPUT_FIELDS
    assert record == {"user_id": USER, "goal_event_id": "g1", "goal_url": "/g", "goal_ts": 5,
                      "impression_id": None, "impression_event_id": None,
                      "impression_source_url": None, "impression_target_url": None,
                      "impression_ts": None, "trail": [], "model": "last_touch", "credit": 0.0,
                      "impression_campaign": None, "goal_value": None, "credited_value": None,
                      "sign": 1, "revision": 0, "emit_timing": "ON_TIME"}
    assert rows["g2"].organic and rows["g2"].trail == ()


# -- cycles, self references, equal timestamps: termination with the spec answer --------------

def test_referer_cycle_in_url_space_terminates_with_the_alternating_trail():
    # /a and /b refer to each other over and over; time still moves forward along the path.
    hops = [visit("v00", 1, "/a", SEARCH)]
    for n in range(1, 40):
        url, referer = ("/b", "/a") if n % 2 else ("/a", "/b")
        hops.append(visit(f"v{n:02d}", n + 1, url, referer))
    events = [click("i1", 0, 1, "/a")] + hops + [goal("g1", 100, "/g", "/b")]
    assert credited(events) == {"g1": ("i1", tuple(v.url for v in hops))}


def test_self_referencing_visits_chain_but_never_loop():
    events = [click("i1", 0, 1, "/a"), visit("v1", 1, "/a", SEARCH), visit("v2", 2, "/a", "/a"),
              visit("v3", 3, "/a", "/a"), goal("g1", 4, "/g", "/a")]
    assert credited(events) == {"g1": ("i1", ("/a", "/a", "/a"))}


def test_a_self_referencing_goal_terminates():
    # Only an impression whose source is the goal's own URL leads to it; without one it is organic.
    assert credited([goal("g1", 1, "/g", "/g"), click("i1", 0, 1, "/g", source="/g")]) == \
        {"g1": ("i1", ())}
    assert credited([goal("g1", 1, "/g", "/g")]) == {"g1": (None, ())}


def test_a_cycle_at_one_timestamp_follows_event_id_order():
    # Everything at ts 7: the order is the event ids, so e1 -> e2 -> e3 -> e4 is the only path.
    events = [click("e1", 7, 1, "/a"), visit("e2", 7, "/a", SEARCH), visit("e3", 7, "/b", "/a"),
              visit("e4", 7, "/a", "/b"), goal("e5", 7, "/g", "/a"),
              goal("e0", 7, "/g", "/a")]  # before every other event: nothing precedes it
    assert credited(events) == {"e0": (None, ()), "e5": ("e1", ("/a", "/b", "/a"))}


# -- section 3: late events -----------------------------------------------------------------

def test_late_events_are_counted_and_dropped():
    state = UserAttribution(USER)
    result = state.add([click("at-w", 10, 1, "/a"), click("behind", 9, 2, "/a", OTHER_SEARCH),
                        visit("v1", 11, "/a", SEARCH), goal("g1", 12, "/g", "/a")], watermark=10)
    assert (result.accepted, result.duplicates, result.late) == (2, 0, 2)
    assert [r.organic for r in state.fire(WATERMARK_INFINITY)] == [True]


def test_a_fired_watermark_makes_later_arrivals_late_without_being_passed_again():
    state = UserAttribution(USER)
    state.add([goal("g1", 5, "/g", "/a")])
    state.advance(20)
    result = state.add([click("i1", 3, 1, "/a"), visit("v1", 20, "/a", SEARCH),
                        visit("v2", 21, "/a", SEARCH)])
    assert (result.accepted, result.late) == (1, 2)
    # A lower watermark passed to add() does not undo the one already reached.
    assert state.add([visit("v3", 15, "/a", SEARCH)], watermark=0).late == 1


def test_heartbeats_are_neither_stored_nor_counted():
    state = UserAttribution(USER)
    result = state.add([Event("hb", None, "heartbeat", 50)])
    assert result == type(result)(0, 0, 0)
    assert state.is_empty


# -- section 3: the timer and firing ------------------------------------------------------------

def test_next_timer_is_the_minimum_pending_goal_and_fire_releases_goals_at_or_below_w():
    state = UserAttribution(USER)
    assert state.next_timer() is None
    state.add([goal("g2", 30, "/g"), goal("g1", 10, "/g"), goal("g0", 10, "/h")])
    assert state.next_timer() == 10
    assert state.fire(9) == []
    assert [r.goal_event_id for r in state.fire(10)] == ["g0", "g1"]
    assert state.next_timer() == 30
    assert [r.goal_event_id for r in state.fire(30)] == ["g2"]
    assert state.next_timer() is None


# -- section 3: garbage collection ---------------------------------------------------------------

def test_gc_drops_a_visit_only_once_ts_is_below_w_minus_lookback():
    config = AttributionConfig(lookback_ms=100)
    state = UserAttribution(USER, config)
    state.add([visit("v1", 50, "/a")])
    assert state.gc(150) == 0 and "v1" in state.visits      # ts == W - lookback: kept
    assert state.gc(151) == 1 and "v1" not in state.visits  # ts < W - lookback: dropped
    assert state.is_empty


def test_gc_drops_an_impression_once_its_bucket_ends_at_or_before_w_minus_lookback():
    config = AttributionConfig(lookback_ms=100, dedup_window_ms=10)
    state = UserAttribution(USER, config)
    state.add([click("i1", 3, 1, "/a")])   # bucket [0, 10)
    assert state.gc(109) == 0 and len(state.impressions) == 1   # bucket end 10 > 9
    assert state.gc(110) == 1 and not state.impressions         # bucket end 10 <= 10


def test_gc_keeps_an_old_impression_for_its_bucket_so_dedup_is_unchanged():
    # The canonical click is older than the lookback horizon, but its bucket is still open:
    # dropping it would let the later click in the same bucket become canonical.
    config = AttributionConfig(lookback_ms=2, dedup_window_ms=16)
    events_before = [click("first", 1, 1, "/a")]
    events_after = [click("second", 8, 2, "/a"), visit("v1", 9, "/a", SEARCH),
                    goal("g1", 10, "/g", "/a")]
    state = UserAttribution(USER, config)
    state.add(events_before)
    state.advance(7)                       # horizon 5 > ts 1, bucket end 16 > 5
    assert len(state.impressions) == 1
    state.add(events_after, watermark=7)
    streamed = state.advance(WATERMARK_INFINITY)
    assert streamed == attribute_batch(events_before + events_after, config)
    assert [r.organic for r in streamed] == [True]  # "first" is canonical and beyond the lookback


def test_gc_keeps_the_consumed_mark_until_the_impression_is_dropped():
    config = AttributionConfig(lookback_ms=100, dedup_window_ms=10)
    state = UserAttribution(USER, config)
    state.add([visit("v0", -90, "/z"), click("i1", 3, 1, "/a"), visit("v1", 4, "/a", SEARCH),
               goal("g1", 5, "/g", "/a"), goal("g2", 50, "/g", "/a")])
    assert [r.impression_event_id for r in state.advance(5)] == ["i1"]
    assert state.gc(12) == 1 and "v0" not in state.visits   # -90 < 12 - 100
    assert [i.consumed for i in state.impressions.values()] == [True]
    state = UserAttribution.from_bytes(state.to_bytes(), config)
    assert [r.organic for r in state.advance(50)] == [True]  # i1 stays consumed for g2
    assert state.gc(109) == 2 and len(state.impressions) == 1  # v1, g1 go; bucket end 10 > 9
    assert state.gc(110) == 1 and not state.impressions       # bucket end 10 <= 10
    assert list(state.visits) == ["g2"]


def test_gc_never_drops_a_pending_goal():
    config = AttributionConfig(lookback_ms=10)
    state = UserAttribution(USER, config)
    state.add([goal("g1", 5, "/g")])
    state.gc(1_000)
    assert state.next_timer() == 5
    assert [(r.goal_event_id, r.organic) for r in state.fire(1_000)] == [("g1", True)]
    state.gc(1_000)
    assert state.is_empty


def test_expires_at_is_the_first_watermark_at_which_gc_empties_the_state():
    config = AttributionConfig(lookback_ms=100, dedup_window_ms=10)
    state = UserAttribution(USER, config)
    assert state.expires_at() is None
    state.add([click("i1", 3, 1, "/a"), visit("v1", 4, "/a", SEARCH), goal("g1", 5, "/g", "/a")])
    assert state.next_wakeup() == 5                  # a pending goal comes first
    state.fire(5)
    expiry = state.expires_at()
    assert expiry == 110 == state.next_wakeup()      # i1's bucket [0, 10) plus the lookback
    state.gc(expiry - 1)
    assert not state.is_empty
    state.gc(expiry)
    assert state.is_empty


def test_restore_keeps_the_canonical_member_and_its_consumed_mark():
    from attribution.paths import Impression, Visit

    members = [Impression("late", 9, 4, SEARCH, "/a", consumed=True),
               Impression("early", 7, 2, SEARCH, "/a"),
               Impression("other-day", 8, 30, SEARCH, "/a")]
    state = UserAttribution.restore(USER, [Visit("v1", 31, "/a", SEARCH),
                                           Visit("g1", 32, "/g", "/a", True, True)],
                                    members, watermark=1,
                                    config=AttributionConfig(dedup_window_ms=25))
    assert sorted((i.event_id, i.consumed) for i in state.impressions.values()) == \
        [("early", True), ("other-day", False)]
    assert [r.impression_event_id for r in state.fire(WATERMARK_INFINITY)] == ["other-day"]


# -- state bytes ----------------------------------------------------------------------------------

def _half_done_state() -> UserAttribution:
    state = UserAttribution(USER, AttributionConfig(lookback_ms=1_000, dedup_window_ms=50))
    state.add([click("i1", 0, 1, "/a"), click("i2", 1, 2, "/a", OTHER_SEARCH),
               click("spam", 2, 3, "/a"), visit("v1", 3, "/a", SEARCH),
               visit("v2", 4, "/a", OTHER_SEARCH), goal("g1", 5, "/g", "/a"),
               goal("g2", 8, "/g", "/a"), goal("g3", 9, "/g", "/a")])
    state.advance(6)
    return state


def test_state_round_trip_preserves_behaviour():
    config = AttributionConfig(lookback_ms=1_000, dedup_window_ms=50)
    original = _half_done_state()
    blob = original.to_bytes()
    assert blob[0] == STATE_VERSION
    restored = UserAttribution.from_bytes(blob, config)
    assert restored.to_bytes() == blob
    assert restored.watermark == original.watermark == 6
    assert restored.next_timer() == original.next_timer() == 8

    more = [click("i3", 7, 4, "/a", "/elsewhere"), visit("v3", 7, "/a", "/elsewhere"),
            visit("late", 6, "/a", SEARCH)]
    assert restored.add(more) == original.add(more)
    rows = original.advance(WATERMARK_INFINITY)
    assert restored.advance(WATERMARK_INFINITY) == rows
    assert [(r.goal_event_id, r.impression_event_id) for r in rows] == [("g2", "i3"), ("g3", "i1")]


def test_state_from_a_newer_version_is_rejected_with_a_clear_error():
    blob = _half_done_state().to_bytes()
    newer = bytes([STATE_VERSION + 1]) + blob[1:]
    with pytest.raises(ValueError, match=rf"version {STATE_VERSION + 1} is newer"):
        UserAttribution.from_bytes(newer)
    with pytest.raises(ValueError, match="empty"):
        UserAttribution.from_bytes(b"")


def test_a_state_blob_referencing_a_class_is_refused_not_executed():
    import pickle

    from attribution import core

    hostile = bytes([STATE_VERSION]) + pickle.dumps(core.UserAttribution(USER))
    with pytest.raises(pickle.UnpicklingError, match="may not reference"):
        UserAttribution.from_bytes(hostile)


def test_check_invariants_names_what_a_broken_state_breaks():
    """The invariants of ``UserAttribution``'s docstring, as the property tests check them after
    every move: a state that breaks one is reported, not passed."""
    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, "/a"), click("i2", 1, 2, "/a"), goal("g1", 5, "/a", SEARCH)])
    state.check_invariants()
    del state.pending_goals["g1"]
    with pytest.raises(AssertionError, match="pending_goals is not the pending visits"):
        state.check_invariants()
    state = UserAttribution(USER)
    state.add([click("i1", 0, 1, "/a"), click("i2", 1, 2, "/a")])
    state.superseded["i1"] = state._canonical["i1"]
    with pytest.raises(AssertionError, match="no canonical member ranking before it"):
        state.check_invariants()


def test_a_snapshot_rebuilds_the_state_it_was_taken_from():
    """``snapshot``/``from_snapshot`` is what ``to_bytes``/``from_bytes`` go through: the rebuilt
    state holds the same records and fires the same rows; a snapshot whose impressions are not
    deduplicated has rule 3 applied to them on the way in."""
    from dataclasses import replace

    from attribution.state_codec import Snapshot

    def spam_state() -> UserAttribution:
        state = UserAttribution(USER, AttributionConfig(lookback_ms=100, dedup_window_ms=10))
        state.add([click("a", 1, 1, "/t"), click("b", 2, 2, "/t"), goal("g", 5, "/t", SEARCH)])
        return state

    state = spam_state()
    snapshot = state.snapshot()
    assert isinstance(snapshot, Snapshot)
    assert ([i.event_id for i in snapshot.impressions], list(snapshot.superseded)) == (["a"], ["b"])
    rebuilt = UserAttribution.from_snapshot(snapshot, state.config)
    rebuilt.check_invariants()
    assert (rebuilt.visits, rebuilt.impressions, rebuilt.superseded) == (
        state.visits, state.impressions, state.superseded)
    assert rebuilt.advance(WATERMARK_INFINITY) == spam_state().advance(WATERMARK_INFINITY)
    # The members in the other order and not deduplicated: "a" is canonical again.
    mixed = replace(spam_state().snapshot(), deduplicated=False)
    mixed = replace(mixed, impressions=[*mixed.superseded_members, *mixed.impressions],
                    superseded={})
    again = UserAttribution.from_snapshot(mixed, state.config)
    again.check_invariants()
    assert ([i.event_id for i in again.impressions.values()], list(again.superseded)) == (
        ["a"], ["b"])
