"""The acceptance case: the chapter-7 dataset (spec section 5) through the engine-free core.

The events come from ``tests/data/ch7``, one file per arrival step, and are fed in the book's
order with the book's watermark steps: the watermark is set (``advance``) before each group
arrives. Exactly two rows may appear, each at the first step whose watermark reaches its goal.
"""
from __future__ import annotations

import pytest

from attribution import AttributionConfig, attribute_batch
from attribution.core import WATERMARK_INFINITY, Attribution, UserAttribution
from attribution.events import ts_to_ms
from attribution.spark.files import data_files, read_events


def _at(clock: str) -> int:
    """A time of day on 1970-01-01 UTC, the chapter's day, in epoch milliseconds."""
    return ts_to_ms(f"1970-01-01T{clock}Z")


# The book's watermark before each arrival step (spec section 5); the heartbeat file stands for
# the final move to infinity.
BOOK_WATERMARKS = [_at("12:00:00"), _at("12:00:30"), _at("12:01:00"), _at("12:01:30"),
                   _at("12:03:45"), _at("12:04:00"), WATERMARK_INFINITY]

SIGNUP_ROW = Attribution(
    user_id="UserX", goal_event_id="g-signup", goal_url="http://xyz.com/join-mailing-list",
    goal_ts=_at("12:01:30"), impression_id=123, impression_event_id="i-123",
    impression_source_url="http://search.com?q=xyz", impression_target_url="http://xyz.com/",
    impression_ts=_at("12:01:00"), trail=("http://xyz.com/",), model="last_touch", credit=1.0)

RECEIPT_ROW = Attribution(
    user_id="UserX", goal_event_id="g-receipt", goal_url="http://xyz.com/thing/receipt",
    goal_ts=_at("12:03:45"), impression_id=456, impression_event_id="i-456",
    impression_source_url="http://search.com?q=thing",
    impression_target_url="http://xyz.com/thing", impression_ts=_at("12:02:00"),
    trail=("http://xyz.com/thing", "http://xyz.com/thing/add-to-cart",
           "http://xyz.com/thing/purchase"),
    model="last_touch", credit=1.0)


@pytest.fixture(scope="module")
def arrival_groups(ch7_dir):
    files = data_files(ch7_dir)
    assert len(files) == len(BOOK_WATERMARKS), f"expected one file per book step in {ch7_dir}"
    return [read_events(f) for f in files]


def test_dataset_is_the_spec_table(arrival_groups):
    """The files hold the spec's eleven events (plus the final heartbeat) in book order."""
    got = [[(e.event_type, e.ts, e.url or e.impression_id) for e in group]
           for group in arrival_groups]
    assert got == [
        [("visit", _at("12:03:00"), "http://xyz.com/thing/add-to-cart"),
         ("visit", _at("12:03:45"), "http://xyz.com/thing/receipt"),
         ("visit", _at("12:03:20"), "http://xyz.com/thing/purchase"),
         ("visit", _at("12:01:30"), "http://xyz.com/join-mailing-list")],
        [("impression", _at("12:01:00"), 123)],
        [("impression", _at("12:02:00"), 456), ("visit", _at("12:01:10"), "http://xyz.com/")],
        [("impression", _at("12:02:10"), 789), ("visit", _at("12:02:30"), "http://xyz.com/thing")],
        [("impression", _at("12:04:00"), 0)],
        [("visit", _at("12:04:20"), "http://xyz.com/other-thing")],
        [("heartbeat", _at("12:30:00"), None)],
    ]
    goals = [e.event_id for g in arrival_groups for e in g if e.event_type == "visit" and e.is_goal]
    assert goals == ["g-receipt", "g-signup"]


@pytest.mark.parametrize("mode", ["advance", "fire-only", "bytes-round-trip"])
def test_book_arrival_order_and_watermarks_yield_the_two_rows_on_time(arrival_groups, mode):
    state = UserAttribution("UserX", AttributionConfig())
    emitted_per_step = []
    results = []
    for watermark, group in zip(BOOK_WATERMARKS, arrival_groups):
        if mode == "bytes-round-trip":
            state = UserAttribution.from_bytes(state.to_bytes())
        rows = state.fire(watermark) if mode == "fire-only" else state.advance(watermark)
        emitted_per_step.append(rows)
        results.append(state.add(group))

    assert emitted_per_step == [
        [],              # W 12:00:00
        [],              # W 12:00:30
        [],              # W 12:01:00: the signup goal (12:01:30) is not yet complete
        [SIGNUP_ROW],    # W 12:01:30: the signup goal, and only it
        [RECEIPT_ROW],   # W 12:03:45: the receipt goal
        [],              # W 12:04:00: impression 0 leads to no goal
        [],              # W infinity: nothing is left pending
    ]
    assert sum(r.late for r in results) == 0
    # Impression 789 is a click-spam copy of 456: dropped as a duplicate, never credited.
    assert [r.duplicates for r in results] == [0, 0, 0, 1, 0, 0, 0]
    assert state.next_timer() is None


def test_no_row_one_millisecond_before_each_goal(arrival_groups):
    """A watermark just short of a goal's time must not release it."""
    state = UserAttribution("UserX")
    for group in arrival_groups[:3]:
        state.add(group)
    assert state.next_timer() == _at("12:01:30")
    assert state.advance(_at("12:01:30") - 1) == []
    state.add(arrival_groups[3])
    assert state.advance(_at("12:01:30")) == [SIGNUP_ROW]
    assert state.next_timer() == _at("12:03:45")
    assert state.advance(_at("12:03:45") - 1) == []
    assert state.advance(_at("12:03:45")) == [RECEIPT_ROW]


def test_batch_oracle_gives_the_same_two_rows(arrival_groups):
    every_event = [e for group in arrival_groups for e in group]
    assert attribute_batch(every_event) == [SIGNUP_ROW, RECEIPT_ROW]


def test_impression_123_after_the_receipt_watermark_is_late(arrival_groups):
    """The reason Spark needs a delay above 2m45s: seen after 12:03:45, impression 123 is late."""
    state = UserAttribution("UserX")
    state.add(arrival_groups[0])
    state.advance(_at("12:03:45"))
    assert state.add(arrival_groups[1]).late == 1
