"""The attribution models and the optional event fields (spec sections 6 and 7), one focused test
each on a hand-built scenario, plus the state of several models across a round trip.

Every expected credit below is worked out by hand from the spec's table. Times are small integers
(epoch milliseconds).
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from attribution import AttributionConfig, Event, attribute_batch
from attribution.config import MODELS, parse_models
from attribution.core import STATE_VERSION, WATERMARK_INFINITY, UserAttribution
from attribution.models import MODEL_TABLE, model_bit
from support.datasets import SEARCH, USER, click, goal, visit

ALL = AttributionConfig(models=MODELS)


def sessions(n: int, gap: int = 10) -> list[Event]:
    """``n`` paid sessions on ``/p<k>`` that all end on ``/cart``, then one goal reached from
    that cart: every click is a candidate of the goal, the earliest first."""
    events = []
    for k in range(n):
        events += [click(f"i{k}", k * gap, k, f"/p{k}"),
                   visit(f"v{k}", k * gap + 1, f"/p{k}", SEARCH),
                   visit(f"c{k}", k * gap + 2, "/cart", f"/p{k}")]
    return events + [goal("g", n * gap, "/buy", "/cart")]


def rows_of(events, config: AttributionConfig = ALL, model: str | None = None):
    rows = attribute_batch(events, config)
    return [r for r in rows if model is None or r.model == model]


def credits_of(events, model: str, config: AttributionConfig = ALL) -> list[tuple[str, float]]:
    return [(r.impression_event_id, r.credit) for r in rows_of(events, config, model)]


# -- the credit of each model ------------------------------------------------------------------

@pytest.mark.parametrize("n, expected", [
    (1, [1.0]),
    (2, [0.5, 0.5]),
    (3, [0.4, 0.2, 0.4]),
    (5, [0.4, 0.2 / 3, 0.2 / 3, 0.2 / 3, 0.4]),
])
def test_position_based_gives_the_ends_0_4_and_the_middle_0_2(n, expected):
    got = credits_of(sessions(n), "position_based")
    assert [i for i, _ in got] == [f"i{k}" for k in range(n)]  # impression order
    assert [c for _, c in got] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_linear_splits_the_credit_equally(n):
    got = credits_of(sessions(n), "linear")
    assert [i for i, _ in got] == [f"i{k}" for k in range(n)]
    assert [c for _, c in got] == pytest.approx([1 / n] * n, abs=1e-12)


def test_time_decay_halves_a_weight_per_half_life_before_the_goal():
    # Clicks 30 and 20 ms before the goal with a 10 ms half-life weigh 1/8 and 1/4: 1/3 and 2/3.
    config = replace(ALL, half_life_ms=10)
    got = credits_of(sessions(2), "time_decay", config)
    assert [i for i, _ in got] == ["i0", "i1"]
    assert [c for _, c in got] == pytest.approx([1 / 3, 2 / 3], abs=1e-12)
    # Three clicks 30, 20 and 10 ms before: weights 1/8, 1/4, 1/2, so 1/7, 2/7 and 4/7.
    got = credits_of(sessions(3), "time_decay", config)
    assert [c for _, c in got] == pytest.approx([1 / 7, 2 / 7, 4 / 7], abs=1e-12)


def test_time_decay_with_the_default_half_life_barely_decays_over_milliseconds():
    got = credits_of(sessions(2), "time_decay")
    assert [c for _, c in got] == pytest.approx([0.5, 0.5], abs=1e-6)
    assert got[0][1] < got[1][1]  # still the older click weighs less


def test_time_decay_of_candidates_many_half_lives_old_still_sums_to_one():
    # 2 ** -1000 and less would underflow a naive sum; the credits must still be normalised.
    config = replace(ALL, half_life_ms=1, lookback_ms=10 ** 9)
    events = [click("old", 0, 1, "/a"), visit("va", 1, "/a", SEARCH),
              click("new", 2000, 2, "/b"), visit("vb", 2001, "/b", SEARCH),
              visit("c", 2002, "/c", "/a"), visit("d", 2003, "/c", "/b"),
              goal("g", 3000, "/g", "/c")]
    got = credits_of(events, "time_decay", config)
    assert [i for i, _ in got] == ["old", "new"]
    assert got[1][1] == 1.0 and got[0][1] == 0.0 and sum(c for _, c in got) == 1.0


@pytest.mark.parametrize("model", MODELS)
def test_the_credits_of_an_attributed_goal_sum_to_one(model):
    for n in (1, 2, 3, 4, 9):
        got = credits_of(sessions(n), model, replace(ALL, half_life_ms=7))
        assert math.isclose(sum(c for _, c in got), 1.0, abs_tol=1e-9)
        assert all(c > 0 for _, c in got)


def test_single_touch_models_credit_the_last_and_the_first_with_full_credit():
    events = sessions(3)
    assert credits_of(events, "last_touch") == [("i2", 1.0)]
    assert credits_of(events, "first_touch") == [("i0", 1.0)]


# -- tie-breaks -------------------------------------------------------------------------------

def _tied(clicks: list[tuple[str, int, int]]) -> list[Event]:
    """Clicks ``(event_id, ts, impression_id)`` on distinct pages, all leading to one goal."""
    events = []
    for n, (event_id, ts, impression_id) in enumerate(clicks):
        events += [click(event_id, ts, impression_id, f"/p{n}"),
                   visit(f"v-{event_id}", 10, f"/p{n}", SEARCH),
                   visit(f"c-{event_id}", 11, "/cart", f"/p{n}")]
    return events + [goal("g", 20, "/buy", "/cart")]


@pytest.mark.parametrize("clicks, last, first", [
    # Equal ts: the smallest impression_id is both the last touch and the first in order.
    ([("a", 5, 9), ("b", 5, 3), ("c", 5, 7)], "b", "b"),
    # Equal ts and impression_id: the smallest event_id.
    ([("z", 5, 3), ("m", 5, 3), ("q", 5, 3)], "m", "m"),
    # Last touch: the greatest ts wins before any id; first touch: the smallest ts.
    ([("a", 4, 1), ("b", 6, 9), ("c", 6, 2), ("d", 4, 0)], "c", "d"),
])
def test_last_and_first_touch_break_ties_by_impression_id_then_event_id(clicks, last, first):
    events = _tied(clicks)
    assert [i for i, _ in credits_of(events, "last_touch")] == [last]
    assert [i for i, _ in credits_of(events, "first_touch")] == [first]
    # last_touch alone chooses the same impression.
    assert [i for i, _ in credits_of(events, "last_touch", AttributionConfig())] == [last]
    # Every candidate's row comes in impression order: (ts, impression_id, event_id).
    order = [e for e, _, _ in sorted(clicks, key=lambda c: (c[1], c[2], c[0]))]
    assert [i for i, _ in credits_of(events, "linear")] == order


# -- consumption per model --------------------------------------------------------------------

def _two_goals() -> list[Event]:
    """Two clicks on the way to goal g1, then goal g2 reached from both clicks' pages."""
    return [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH),
            click("i2", 2, 2, "/b"), visit("vb", 3, "/b", SEARCH),
            visit("c1", 4, "/cart", "/a"), visit("c2", 5, "/cart", "/b"),
            goal("g1", 6, "/buy", "/cart"), goal("g2", 7, "/thanks", "/cart")]


def test_each_model_consumes_only_for_itself():
    by_goal_model = {}
    for r in rows_of(_two_goals()):
        by_goal_model.setdefault((r.goal_event_id, r.model), []).append(r.impression_event_id)
    assert by_goal_model == {
        ("g1", "last_touch"): ["i2"], ("g2", "last_touch"): ["i1"],
        ("g1", "first_touch"): ["i1"], ("g2", "first_touch"): ["i2"],
        # The all-candidate models consume every candidate: g2 has none left.
        ("g1", "linear"): ["i1", "i2"], ("g2", "linear"): [None],
        ("g1", "position_based"): ["i1", "i2"], ("g2", "position_based"): [None],
        ("g1", "time_decay"): ["i1", "i2"], ("g2", "time_decay"): [None],
    }


@pytest.mark.parametrize("events", [_two_goals(), sessions(4), sessions(1)],
                         ids=["two goals", "four sessions", "one session"])
def test_a_models_rows_alone_equal_its_rows_beside_the_others(events):
    together = rows_of(events)
    for model in MODELS:
        alone = attribute_batch(events, AttributionConfig(models=(model,)))
        assert alone == [r for r in together if r.model == model], model
    pair = attribute_batch(events, AttributionConfig(models=("linear", "first_touch")))
    assert pair == [r for r in together if r.model in ("first_touch", "linear")]


def test_rows_of_a_goal_follow_the_model_order_then_the_impression_order():
    rows = rows_of(_two_goals())
    assert [(r.goal_event_id, r.model, r.impression_event_id) for r in rows] == [
        ("g1", "last_touch", "i2"), ("g1", "first_touch", "i1"),
        ("g1", "linear", "i1"), ("g1", "linear", "i2"),
        ("g1", "position_based", "i1"), ("g1", "position_based", "i2"),
        ("g1", "time_decay", "i1"), ("g1", "time_decay", "i2"),
        ("g2", "last_touch", "i1"), ("g2", "first_touch", "i2"),
        ("g2", "linear", None), ("g2", "position_based", None), ("g2", "time_decay", None),
    ]
    organic = rows[-1]
    assert (organic.credit, organic.trail, organic.impression_ts) == (0.0, (), None)


def test_consumption_per_model_holds_across_firings_and_a_state_round_trip():
    events = _two_goals()
    state = UserAttribution(USER, ALL)
    state.add(events)
    first = state.advance(6)  # g1 only
    assert {i.event_id: i.consumed for i in state.impressions.values()} == {
        "i1": 0b11110, "i2": 0b11101}  # last_touch (bit 0) took i2, first_touch (bit 1) i1
    restored = UserAttribution.from_bytes(state.to_bytes(), ALL)
    later = restored.fire(WATERMARK_INFINITY)
    assert first + later == rows_of(events)
    assert {i.event_id: i.consumed for i in restored.impressions.values()} == {
        "i1": 0b11111, "i2": 0b11111}


# -- trails ------------------------------------------------------------------------------------

def test_every_credited_impression_has_its_own_trail():
    events = [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH),
              visit("vx", 2, "/x", "/a"), visit("vy", 3, "/y", "/x"),
              click("i2", 4, 2, "/b"), visit("vb", 5, "/b", SEARCH),
              visit("c1", 6, "/cart", "/y"), visit("c2", 7, "/cart", "/b"),
              goal("g", 8, "/buy", "/cart")]
    trails = {(r.model, r.impression_event_id): r.trail for r in rows_of(events)}
    long_way = ("/a", "/x", "/y", "/cart")
    short_way = ("/b", "/cart")
    assert trails == {("last_touch", "i2"): short_way, ("first_touch", "i1"): long_way,
                      **{(m, i): t for m in ("linear", "position_based", "time_decay")
                         for i, t in (("i1", long_way), ("i2", short_way))}}


def test_a_candidate_beyond_the_lookback_is_credited_by_no_model():
    config = replace(ALL, lookback_ms=25)
    rows = rows_of(sessions(3), config)  # clicks at 0, 10, 20; goal at 30
    assert {r.impression_event_id for r in rows} == {"i1", "i2"}


# -- campaign and value (section 7) --------------------------------------------------------------

def test_campaign_and_value_are_carried_to_every_row():
    events = [click("i1", 0, 1, "/a", campaign="spring"), visit("va", 1, "/a", SEARCH),
              click("i2", 2, 2, "/b"), visit("vb", 3, "/b", SEARCH),
              visit("c1", 4, "/cart", "/a"), visit("c2", 5, "/cart", "/b"),
              goal("g1", 6, "/buy", "/cart", value=80.0),
              goal("g2", 7, "/solo", "/nowhere", value=12.5),
              goal("g3", 8, "/thanks", "/cart")]
    rows = {(r.goal_event_id, r.model, r.impression_event_id): r for r in rows_of(events)}
    linear = rows[("g1", "linear", "i1")]
    assert (linear.impression_campaign, linear.goal_value, linear.credited_value) == (
        "spring", 80.0, 40.0)
    assert rows[("g1", "linear", "i2")].impression_campaign is None
    pb = rows[("g1", "position_based", "i2")]
    assert (pb.credit, pb.credited_value) == (0.5, 40.0)
    assert rows[("g1", "last_touch", "i2")].credited_value == 80.0
    organic = rows[("g2", "last_touch", None)]
    assert (organic.impression_campaign, organic.goal_value, organic.credited_value) == (
        None, 12.5, 0.0)
    no_value = rows[("g3", "last_touch", "i1")]
    assert (no_value.impression_campaign, no_value.goal_value, no_value.credited_value) == (
        "spring", None, None)
    for model in MODELS:  # a goal's credited values add up to its value
        assert math.isclose(sum(r.credited_value for k, r in rows.items()
                                if k[:2] == ("g1", model)), 80.0)


def test_a_value_on_a_visit_that_is_not_a_goal_is_ignored():
    events = [click("i1", 0, 1, "/a"), visit("va", 1, "/a", SEARCH, value=99.0),
              goal("g", 2, "/g", "/a")]
    (row,) = attribute_batch(events)
    assert row.goal_value is None
    state = UserAttribution(USER)
    state.add(events)
    assert state.visits["va"].value is None


def test_campaign_value_and_consumption_survive_a_state_round_trip():
    events = [click("i1", 0, 1, "/a", campaign="spring"), visit("va", 1, "/a", SEARCH),
              goal("g1", 2, "/g", "/a", value=5.0), goal("g2", 9, "/h", "/a", value=7.0)]
    state = UserAttribution(USER, ALL)
    state.add(events)
    state.fire(5)
    blob = state.to_bytes()
    assert blob[0] == STATE_VERSION == 5
    restored = UserAttribution.from_bytes(blob, ALL)
    assert restored.impressions == state.impressions and restored.visits == state.visits
    assert UserAttribution.from_bytes(blob, ALL).to_bytes() == blob
    assert restored.fire(WATERMARK_INFINITY) == [r for r in rows_of(events)
                                                 if r.goal_event_id == "g2"]


# A version-3 blob (no values, no campaigns, a boolean consumed mark: last_touch's), as written
# by that version's ``to_bytes``: user u, watermark 6000, impressions i-old (1000 ms, id 1) and
# i-new (3000 ms, id 2, consumed) with visits v-a1 and v-a2 to /a, goal g-1 (5000 ms, attributed
# to i-new) and pending goal g-2 (9000 ms, reachable from both), and the superseded click i-spam.
VERSION_3_BLOB = bytes.fromhex(
    "03800595b200000000000000288c0175944d70175d9428288c04762d6131944dd0078c022f61948c09687474"
    "703a2f2f732f944b007494288c04762d6132944da00f68038c0a687474703a2f2f732f6e944b007494288c03"
    "672d31944d88138c022f679468034b017494288c03672d32944d2823680a68034b027494655d9428288c0569"
    "2d6f6c64944b014de80368046803897494288c05692d6e6577944b024db80b68076803887494655d948c0669"
    "2d7370616d944b0086946174942e")


def test_a_version_3_blob_reads_as_last_touch_consumption():
    assert VERSION_3_BLOB[0] == 3
    state = UserAttribution.from_bytes(VERSION_3_BLOB, ALL)
    assert (state.user_id, state.watermark, state.superseded) == ("u", 6000, {"i-spam": 0})
    assert {i.event_id: (i.consumed, i.campaign) for i in state.impressions.values()} == {
        "i-old": (0, None), "i-new": (0b1, None)}
    assert set(state.pending_goals) == {"g-2"}
    rows = state.fire(WATERMARK_INFINITY)
    credited = {}
    for r in rows:
        credited.setdefault(r.model, []).append(r.impression_event_id)
    # last_touch consumed i-new for g-1, so it credits i-old; the other models consumed nothing.
    assert credited == {"last_touch": ["i-old"], "first_touch": ["i-old"],
                        "linear": ["i-old", "i-new"], "position_based": ["i-old", "i-new"],
                        "time_decay": ["i-old", "i-new"]}
    assert all(r.goal_value is None and r.trail == ("/a",) for r in rows)
    # Rewritten, it is a blob of the current version with the same contents.
    again = UserAttribution.from_bytes(UserAttribution.from_bytes(VERSION_3_BLOB).to_bytes())
    assert again.impressions == UserAttribution.from_bytes(VERSION_3_BLOB).impressions


# -- the configuration --------------------------------------------------------------------------

def test_models_are_kept_in_the_fixed_order_without_repeats():
    assert AttributionConfig(models=("time_decay", "last_touch", "time_decay")).models == (
        "last_touch", "time_decay")
    assert AttributionConfig(models="linear, first_touch").models == ("first_touch", "linear")
    assert parse_models("all") == MODELS
    assert AttributionConfig().models == ("last_touch",)
    assert AttributionConfig().half_life_ms == 7 * 24 * 3600 * 1000


@pytest.mark.parametrize("kwargs, message", [
    ({"models": ("last_touch", "u_shaped")},
     "unknown attribution model 'u_shaped'; choose from last_touch, first_touch, linear, "
     "position_based, time_decay (or 'all')"),
    ({"models": ()}, "no attribution model given; choose from last_touch, first_touch, linear, "
                     "position_based, time_decay (or 'all')"),
    ({"models": ""}, "no attribution model given; choose from"),
    ({"half_life_ms": 0}, "half-life must be a positive number of milliseconds, got 0"),
    ({"half_life_ms": -5}, "half-life must be a positive number of milliseconds, got -5"),
])
def test_a_bad_configuration_is_refused_in_one_line_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        AttributionConfig(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_from_strings_parses_models_and_the_half_life():
    config = AttributionConfig.from_strings(models="all", half_life="12 hours")
    assert config.models == MODELS and config.half_life_ms == 12 * 3600 * 1000
    with pytest.raises(ValueError, match="half-life"):
        AttributionConfig.from_strings(half_life="soon")


# -- the model table ------------------------------------------------------------------------------

def test_the_table_fixes_the_models_order_and_their_consumption_bits():
    """Stored consumption marks name models by position: the table may only grow at its end."""
    assert MODELS == tuple(MODEL_TABLE)
    assert MODELS[:5] == ("last_touch", "first_touch", "linear", "position_based", "time_decay")
    assert [model_bit(m) for m in MODELS[:5]] == [1, 2, 4, 8, 16]
    assert all(MODEL_TABLE[m].name == m for m in MODELS)


def test_model_options_are_the_options_of_the_configured_models_only():
    assert AttributionConfig().model_options() == {}
    assert AttributionConfig(models="linear,position_based").model_options() == {}
    assert AttributionConfig(models="all", half_life_ms=5).model_options() == {"half_life_ms": 5}


def test_a_checkpoint_pins_the_options_of_its_models_and_refuses_others(tmp_path):
    import json

    from attribution.spark.checkpoint import LAYOUT_FILE, CheckpointMismatch, pin_state_layout

    pin = dict(backend="transformWithState", state_buckets=64, tws_state="compact")
    linear = str(tmp_path / "linear")
    pin_state_layout(linear, **pin, config=AttributionConfig(models="linear"))
    assert "half_life_ms" not in json.loads((tmp_path / "linear" / LAYOUT_FILE).read_text())
    decay = str(tmp_path / "decay")
    pin_state_layout(decay, **pin, config=AttributionConfig(models="time_decay", half_life_ms=5))
    assert json.loads((tmp_path / "decay" / LAYOUT_FILE).read_text())["half_life_ms"] == 5
    with pytest.raises(CheckpointMismatch, match="--half-life"):
        pin_state_layout(decay, **pin, config=AttributionConfig(models="time_decay",
                                                               half_life_ms=6))
