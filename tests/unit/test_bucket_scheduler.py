"""The bucket scheduler of the applyInPandasWithState backend, without Spark: who is due, what
waits in an inbox unparsed, and rows equal to one key per user."""
from __future__ import annotations

import json
import random

from attribution import AttributionConfig, Event, attribute_batch
from attribution.oracle import sort_key
from attribution.spark.bucket_scheduler import BucketScheduler
from attribution.spark.frames import PACKED_KEYS, events_from_json_list

CONFIG = AttributionConfig(lookback_ms=60_000, dedup_window_ms=10_000)


def _packed(events: list[Event]) -> str:
    """Events as the pipeline packs them: comma-joined JSON objects with one-letter keys."""
    def one(e: Event) -> str:
        fields = {"event_id": e.event_id, "event_type": e.event_type, "ts_ms": e.ts,
                  "url": e.url, "referer": e.referer,
                  "is_goal": e.is_goal if e.event_type == "visit" else None,
                  "impression_id": e.impression_id, "source_url": e.source_url,
                  "target_url": e.target_url}
        return json.dumps({PACKED_KEYS[k]: v for k, v in fields.items() if v is not None})
    return ",".join(one(e) for e in events)


def _receive(bucket: BucketScheduler, events: list[Event]) -> None:
    by_user: dict[str, list[Event]] = {}
    for e in events:
        by_user.setdefault(e.user_id, []).append(e)
    for user_id, evs in by_user.items():
        goals = [e.ts for e in evs if e.event_type == "visit" and e.is_goal]
        bucket.receive(user_id, _packed(evs), max(e.ts for e in evs), min(goals, default=None))


class CountingParser:
    """``events_from_json_list`` that counts its calls: parsing is what the inbox saves."""

    def __init__(self):
        self.calls = 0

    def __call__(self, user_id: str, inbox: str) -> list[Event]:
        self.calls += 1
        return events_from_json_list(user_id, inbox)


IMPRESSION = Event("i1", "u", "impression", 1_000, impression_id=1, source_url="s",
                   target_url="/a")
VISIT = Event("v1", "u", "visit", 2_000, url="/a", referer="s")
GOAL = Event("g1", "u", "visit", 5_000, url="/buy", referer="/a", is_goal=True)


def test_events_wait_unparsed_until_their_user_is_due():
    parse = CountingParser()
    bucket = BucketScheduler(CONFIG, parse)
    _receive(bucket, [IMPRESSION, VISIT])
    wakeup, blob, inbox = bucket.users["u"]
    assert blob == b"" and inbox.count("{") == 2
    assert wakeup == 2_000 + CONFIG.lookback_ms + 1  # no goal: the earliest expiry
    _receive(bucket, [GOAL])
    assert bucket.next_wakeup() == 5_000 and bucket.due(4_999) == []
    assert bucket.advance(4_999) == [] and parse.calls == 0
    rows = bucket.advance(5_000)
    assert parse.calls == 1
    assert [(r.goal_event_id, r.impression_id, r.trail) for r in rows] == [("g1", 1, ("/a",))]
    wakeup, blob, inbox = bucket.users["u"]
    assert blob and inbox == "" and wakeup > 5_000


def test_an_idle_user_leaves_the_bucket_when_its_state_expires():
    bucket = BucketScheduler(CONFIG, CountingParser())
    _receive(bucket, [IMPRESSION, VISIT, GOAL])
    bucket.advance(5_000)
    expiry = bucket.next_wakeup()
    assert bucket.advance(expiry - 1) == [] and len(bucket) == 1
    bucket.advance(expiry)
    assert len(bucket) == 0 and bucket.next_wakeup() is None


def test_the_timer_is_the_earliest_wake_up_of_all_users():
    bucket = BucketScheduler(CONFIG, CountingParser())
    other = Event("g2", "w", "visit", 3_000, url="/x", referer=None, is_goal=True)
    _receive(bucket, [IMPRESSION, VISIT, GOAL, other])
    assert bucket.next_wakeup() == 3_000
    assert bucket.due(3_000) == ["w"]
    rows = bucket.advance(3_000)
    assert [(r.user_id, r.organic) for r in rows] == [("w", True)]
    assert bucket.next_wakeup() == 5_000


def test_random_streams_give_the_rows_of_one_key_per_user():
    rng = random.Random(7)
    events = []
    for n in range(400):
        user = f"u{rng.randrange(6)}"
        ts = rng.randrange(0, 200_000)
        if rng.random() < 0.25:
            events.append(Event(f"e{n}", user, "impression", ts, impression_id=n,
                                source_url=rng.choice(["s1", "s2"]), target_url=rng.choice("abc")))
        else:
            events.append(Event(f"e{n}", user, "visit", ts, url=rng.choice("abc"),
                                referer=rng.choice(["a", "b", "c", "s1", "s2"]),
                                is_goal=rng.random() < 0.15))
    events.sort(key=lambda e: e.ts)
    bucket = BucketScheduler(CONFIG, CountingParser())
    rows = []
    # Arrive in time order, in steps; the watermark trails the last step, so nothing is late.
    for step in range(0, len(events), 40):
        chunk = events[step:step + 40]
        watermark = chunk[0].ts - 1
        rows += bucket.advance(watermark)
        _receive(bucket, chunk)
    rows += bucket.advance(10 ** 12)
    assert sorted(rows, key=sort_key) == attribute_batch(events, CONFIG)
    assert len(bucket) == 0
