"""The transformWithState processor unit-tested without a cluster, with PySpark's TwsTester.

The chapter's dataset is fed in the book's arrival order with the book's watermark steps: the
watermark is set (firing due timers), then the step's events arrive. Besides attributions, the
processor emits a marker row whenever its user enters or leaves the state (``users_change_row``).
"""
from __future__ import annotations

import datetime as dt

from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from attribution.config import AttributionConfig
from attribution.events import ms_to_datetime, ts_to_ms
from attribution.spark.files import data_files, read_events
from attribution.spark.frames import INPUT_COLUMNS, users_change_row
from attribution.spark.transform_with_state import AttributionProcessor

BOOK_WATERMARKS = ["12:00:00", "12:00:30", "12:01:00", "12:01:30", "12:03:45", "12:04:00"]


def _ms(clock: str) -> int:
    return ts_to_ms(f"1970-01-01T{clock}Z")


def _row(e) -> Row:
    values = {"event_id": e.event_id, "user_id": e.user_id, "event_type": e.event_type,
              "ts": ms_to_datetime(e.ts), "ts_ms": e.ts, "url": e.url, "referer": e.referer,
              "is_goal": e.is_goal if e.is_visit else None, "impression_id": e.impression_id,
              "source_url": e.source_url, "target_url": e.target_url, "campaign": e.campaign,
              "value": e.value}
    return Row(**{c: values[c] for c in INPUT_COLUMNS})


def _split(rows: list) -> tuple[list, list]:
    """The attribution rows, and the changes in users held that the marker rows report."""
    return ([r for r in rows if r.goal_event_id is not None],
            [r.state_users_change for r in rows if r.goal_event_id is None])


def _tester(config: AttributionConfig = AttributionConfig()) -> TwsTester:
    return TwsTester(AttributionProcessor(config), timeMode="EventTime",
                     eventTimeExtractor=lambda row: row.ts_ms)


def test_book_steps_attribute_each_goal_exactly_when_the_watermark_reaches_it(ch7_dir):
    steps = [read_events(f) for f in data_files(ch7_dir)][:6]  # the seventh is the heartbeat
    tester = _tester()
    emitted, user_changes = [], []
    for clock, events in zip(BOOK_WATERMARKS, steps):
        fired, fired_changes = _split(tester.setWatermark(_ms(clock)))
        from_input, input_changes = _split(tester.test("UserX", [_row(e) for e in events]))
        emitted.append((clock, [r.goal_event_id for r in fired + from_input], fired))
        user_changes.append(fired_changes + input_changes)
    assert [(clock, goals) for clock, goals, _ in emitted] == [
        ("12:00:00", []), ("12:00:30", []), ("12:01:00", []),
        ("12:01:30", ["g-signup"]), ("12:03:45", ["g-receipt"]), ("12:04:00", []),
    ]
    assert user_changes == [[1], [], [], [], [], []]  # the user arrives, and stays
    signup = emitted[3][2][0]
    receipt = emitted[4][2][0]
    assert (signup.impression_id, signup.trail, signup.credit) == (123, ["http://xyz.com/"], 1.0)
    assert signup.goal_ts == dt.datetime(1970, 1, 1, 12, 1, 30, tzinfo=dt.timezone.utc)
    assert (receipt.impression_id, receipt.impression_event_id) == (456, "i-456")
    assert receipt.trail == ["http://xyz.com/thing", "http://xyz.com/thing/add-to-cart",
                             "http://xyz.com/thing/purchase"]
    # Watermark at "infinity": nothing more, and garbage collection then empties the state.
    assert tester.setWatermark(2 ** 53) == [users_change_row(-1)]
    assert tester.peekListState("visits", "UserX") == []
    assert tester.peekValueState("wakeup", "UserX") is None


def test_state_is_declared_and_written_once_per_batch(ch7_dir):
    """A batch's events land as list entries; spent facts and the timer follow attribution."""
    events = [e for f in data_files(ch7_dir) for e in read_events(f) if e.user_id]
    tester = _tester()
    tester.setWatermark(_ms("12:00:00"))
    assert tester.test("UserX", [_row(e) for e in events]) == [users_change_row(1)]
    visits = tester.peekListState("visits", "UserX")
    impressions = tester.peekListState("impressions", "UserX")
    assert len(visits) == 7
    # i-789 is a click-spam member of i-456's logical impression, kept whole beside it (rule 1
    # judges a later copy of it by its contents).
    assert {i[0] for i in impressions} == {"i-123", "i-456", "i-789", "i-000"}
    assert tester.peekValueState("wakeup", "UserX") == (_ms("12:01:30"), _ms("12:01:30"))

    rows = tester.setWatermark(_ms("12:05:00"))
    assert [r.goal_event_id for r in rows] == ["g-signup", "g-receipt"]
    spent = {s[0] for s in tester.peekListState("spent", "UserX")}
    assert spent == {"g-signup", "g-receipt", "i-123", "i-456"}
    min_goal, timer = tester.peekValueState("wakeup", "UserX")
    assert min_goal is None and timer > _ms("12:05:00")


def test_timer_garbage_collects_an_idle_user(ch7_dir):
    config = AttributionConfig.from_strings(lookback="10 minutes", dedup_window="1 minute")
    tester = _tester(config)
    tester.setWatermark(_ms("12:00:00"))
    visit = [e for e in read_events(ch7_dir) if e.event_id == "v-cart"]
    tester.test("UserX", [_row(e) for e in visit])
    assert len(tester.peekListState("visits", "UserX")) == 1
    # ts == W - lookback: still kept (dropped once ts < W - lookback).
    tester.setWatermark(_ms("12:13:00"))
    assert len(tester.peekListState("visits", "UserX")) == 1
    tester.setWatermark(_ms("12:13:00") + 1)
    assert tester.peekListState("visits", "UserX") == []
    assert tester.peekValueState("wakeup", "UserX") is None


def test_other_models_campaigns_and_values_are_declared_and_survive_calls():
    """Consumption by models other than last_touch lands in ``consumed`` (last_touch's stays in
    ``spent``), campaigns and goal values in lists of their own; a later goal sees them."""
    from attribution.config import MODELS
    from attribution.events import Event
    from attribution.oracle import attribute_batch

    search = "http://search.example/"
    first = [Event("i1", "u", "impression", 1_000, impression_id=1, source_url=search,
                   target_url="/a", campaign="spring"),
             Event("va", "u", "visit", 2_000, url="/a", referer=search),
             Event("i2", "u", "impression", 3_000, impression_id=2, source_url=search + "2",
                   target_url="/b"),
             Event("vb", "u", "visit", 4_000, url="/b", referer=search + "2"),
             Event("c1", "u", "visit", 5_000, url="/cart", referer="/a"),
             Event("c2", "u", "visit", 6_000, url="/cart", referer="/b"),
             Event("g1", "u", "visit", 7_000, url="/buy", referer="/cart", is_goal=True,
                   value=40.0)]
    second = [Event("g2", "u", "visit", 9_000, url="/thanks", referer="/cart", is_goal=True)]
    config = AttributionConfig(models=MODELS)
    tester = _tester(config)
    assert _split(tester.test("u", [_row(e) for e in first])) == ([], [1])  # the user enters
    assert tester.peekListState("campaigns", "u") == [("i1", "spring")]
    assert tester.peekListState("goal_values", "u") == [("g1", 40.0)]
    fired, _ = _split(tester.setWatermark(8_000))
    assert {s[0] for s in tester.peekListState("spent", "u")} == {"g1", "i2"}  # last_touch's
    consumed = {}
    for event_id, bits in tester.peekListState("consumed", "u"):
        consumed[event_id] = consumed.get(event_id, 0) | bits
    assert consumed == {"i1": 0b11110, "i2": 0b11101}
    assert _split(tester.test("u", [_row(e) for e in second])) == ([], [])
    fired += _split(tester.setWatermark(10_000))[0]
    rows = sorted((r.goal_event_id, r.model, r.impression_event_id, r.impression_campaign,
                   r.goal_value, r.credited_value) for r in fired)
    expected = attribute_batch(first + second, config)
    assert rows == sorted((r.goal_event_id, r.model, r.impression_event_id, r.impression_campaign,
                           r.goal_value, r.credited_value) for r in expected)
    assert ("g1", "linear", "i1", "spring", 40.0, 20.0) in rows


def test_a_superseded_click_is_remembered_across_calls():
    """Rule 1 across micro-batches: the click-spam member "b" is kept whole in the
    ``impressions`` list beside its canonical "a", so a later, larger copy of "b" (a visit) is
    dropped, and a smaller one replaces it, with the lists rewritten."""
    from attribution.events import Event

    search = "http://search.example/"
    clicks = [Event(eid, "u", "impression", ts, impression_id=n, source_url=search,
                    target_url="/t") for eid, ts, n in (("a", 5_000, 1), ("b", 6_000, 2))]
    reuse = [Event("b", "u", "visit", 7_000, url="/t", referer=search),
             Event("g", "u", "visit", 8_000, url="/x", referer="/t", is_goal=True)]
    tester = _tester()
    assert tester.test("u", [_row(e) for e in clicks]) == [users_change_row(1)]
    assert tester.peekListState("impressions", "u") == [
        ("a", 1, 5_000, search, "/t"), ("b", 2, 6_000, search, "/t")]
    assert tester.peekListState("superseded", "u") == []
    assert tester.test("u", [_row(e) for e in reuse]) == []
    assert [v[0] for v in tester.peekListState("visits", "u")] == ["g"]
    # A copy of "b" earlier than "a": it replaces "b" and becomes the canonical click.
    smaller = Event("b", "u", "impression", 4_000, impression_id=2, source_url=search,
                    target_url="/t", campaign="c")
    assert tester.test("u", [_row(smaller)]) == []
    assert sorted(tester.peekListState("impressions", "u")) == [
        ("a", 1, 5_000, search, "/t"), ("b", 2, 4_000, search, "/t")]
    assert tester.peekListState("campaigns", "u") == [("b", "c")]
    rows = tester.setWatermark(9_000)
    assert [(r.goal_event_id, r.impression_event_id, r.impression_campaign) for r in rows] == [
        ("g", None, None)]


def test_superseded_ids_of_an_earlier_layout_keep_their_copy_and_leave_with_their_bucket():
    """A declared state of an earlier layout listed a superseded click by id and dedup bucket
    only: that id keeps the copy it has, and the entry goes when garbage collection drops the
    bucket."""
    from attribution.events import Event

    config = AttributionConfig.from_strings(lookback="1 minute", dedup_window="1 minute")
    tester = _tester(config)
    search = "http://search.example/"
    a = Event("a", "u", "impression", 5_000, impression_id=1, source_url=search, target_url="/t")
    tester.test("u", [_row(a)])
    tester.updateListState("superseded", "u", [("b", 0)])
    copy = Event("b", "u", "impression", 1_000, impression_id=2, source_url=search,
                 target_url="/t")
    tester.test("u", [_row(copy)])
    assert [i[0] for i in tester.peekListState("impressions", "u")] == ["a"]
    assert tester.peekListState("superseded", "u") == [("b", 0)]
    tester.setWatermark(2 ** 53)
    assert tester.peekListState("superseded", "u") == []
