"""Tests of the event model: validation reasons, timestamp parsing, and no bare KeyError ever."""
from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attribution.config import MAX_STRING_LENGTH
from attribution.events import (
    Event,
    InvalidEvent,
    ms_to_datetime,
    ms_to_iso,
    parse_event,
    parse_events,
    ts_to_ms,
    validate,
)
from attribution.schema import EVENT_FIELDS

TS = "2023-11-15T09:30:00.123Z"
TS_MS = 1_700_040_600_123

VISIT = {"event_id": "v1", "user_id": "u1", "event_type": "visit", "ts": TS,
         "url": "http://shop.example/", "referer": "http://search.example/?q=x", "is_goal": False}
IMPRESSION = {"event_id": "i1", "user_id": "u1", "event_type": "impression", "ts": TS,
              "impression_id": 42, "source_url": "http://search.example/?q=x",
              "target_url": "http://shop.example/"}
HEARTBEAT = {"event_id": "hb1", "event_type": "heartbeat", "ts": TS}


def _with(record: dict, **changes) -> dict:
    out = dict(record)
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


_DROP = object()


# -- valid records --------------------------------------------------------------------------------

def test_a_valid_visit_parses_with_ts_in_epoch_milliseconds():
    assert validate(VISIT) is None
    assert parse_event(VISIT) == Event("v1", "u1", "visit", TS_MS, url="http://shop.example/",
                                       referer="http://search.example/?q=x", is_goal=False)


def test_a_valid_impression_parses():
    e = parse_event(IMPRESSION)
    assert (e.event_type, e.impression_id, e.source_url, e.target_url, e.ts) == \
        ("impression", 42, "http://search.example/?q=x", "http://shop.example/", TS_MS)
    assert e.is_impression and not e.is_visit


def test_a_heartbeat_keeps_only_its_time():
    e = parse_event(_with(HEARTBEAT, user_id="ignored", url="ignored"))
    assert e == Event("hb1", None, "heartbeat", TS_MS)
    assert e.is_heartbeat


def test_optional_fields_may_be_absent_or_null():
    assert parse_event(_with(VISIT, referer=_DROP, is_goal=_DROP)).referer is None
    assert parse_event(_with(VISIT, referer=None, is_goal=None)).is_goal is False
    assert parse_event(_with(VISIT, is_goal=True)).is_goal is True


def test_campaign_and_value_are_optional_and_belong_to_their_event_type():
    assert parse_event(_with(IMPRESSION, campaign="spring")).campaign == "spring"
    assert parse_event(_with(IMPRESSION, campaign=None)).campaign is None
    assert parse_event(_with(VISIT, is_goal=True, value=12.5)).value == 12.5
    assert parse_event(_with(VISIT, value=3)).value == 3.0  # an integer is a number too
    assert isinstance(parse_event(_with(VISIT, value=3)).value, float)
    assert parse_event(_with(VISIT, value=-2.0)).value == -2.0  # a refund
    # Like every type-specific field, they are ignored on the other event types.
    assert parse_event(_with(VISIT, campaign="spring")).campaign is None
    assert parse_event(_with(IMPRESSION, value=float("nan"))).value is None


def test_to_record_follows_the_schema_and_parses_back_to_the_same_event():
    for raw in (VISIT, IMPRESSION, HEARTBEAT, _with(VISIT, is_goal=True, value=9.5),
                _with(IMPRESSION, campaign="spring")):
        e = parse_event(raw)
        record = e.to_record()
        assert tuple(record) == EVENT_FIELDS
        assert parse_event(record) == e


# -- invalid records: the reason -----------------------------------------------------------------

@pytest.mark.parametrize("record, reason", [
    (_with(VISIT, user_id=_DROP), "missing user_id"),
    (_with(VISIT, user_id=None), "missing user_id"),
    (_with(VISIT, user_id=""), "empty user_id"),
    (_with(IMPRESSION, user_id=_DROP), "missing user_id"),
    (_with(VISIT, event_type="click"), "unknown event_type 'click'"),
    (_with(VISIT, event_type=_DROP), "missing event_type"),
    (_with(VISIT, event_id=_DROP), "missing event_id"),
    (_with(HEARTBEAT, event_id=_DROP), "missing event_id"),
    (_with(VISIT, url=_DROP), "visit without url"),
    (_with(VISIT, url=None), "visit without url"),
    (_with(VISIT, url=""), "visit with empty url"),
    (_with(IMPRESSION, source_url=_DROP), "impression without source_url"),
    (_with(IMPRESSION, target_url=None), "impression without target_url"),
    (_with(IMPRESSION, impression_id=_DROP), "impression without impression_id"),
    (_with(VISIT, ts=_DROP), "missing ts"),
    (_with(HEARTBEAT, ts=None), "missing ts"),
])
def test_missing_fields_are_named(record, reason):
    assert validate(record) == reason
    with pytest.raises(InvalidEvent, match=f"^{reason}$".replace("?", r"\?")):
        parse_event(record)


@pytest.mark.parametrize("record, reason", [
    (_with(VISIT, user_id=7), "user_id must be a string, got int"),
    (_with(VISIT, event_id=1.5), "event_id must be a string, got float"),
    (_with(VISIT, url=["http://a/"]), "url must be a string, got list"),
    (_with(VISIT, referer=3), "referer must be a string, got int"),
    (_with(VISIT, is_goal="yes"), "is_goal must be a boolean, got str"),
    (_with(VISIT, is_goal=1), "is_goal must be a boolean, got int"),
    (_with(IMPRESSION, impression_id="42"), "impression_id must be an integer, got str"),
    (_with(IMPRESSION, impression_id=4.5), "impression_id must be an integer, got float"),
    (_with(IMPRESSION, impression_id=True), "impression_id must be an integer, got bool"),
    (_with(VISIT, ts=1.5), "ts must be a timestamp, got float"),
    (_with(VISIT, ts=True), "ts must be a timestamp, got bool"),
    (_with(VISIT, ts=[TS]), "ts must be a timestamp, got list"),
    (_with(VISIT, event_type=5), "unknown event_type '5'"),
    (_with(IMPRESSION, campaign=7), "campaign must be a string, got int"),
    (_with(VISIT, value="12"), "value must be a number, got str"),
    (_with(VISIT, value=True), "value must be a number, got bool"),
    (_with(VISIT, is_goal=True, value=float("nan")), "value must be a finite number, got nan"),
    (_with(VISIT, is_goal=True, value=float("inf")), "value must be a finite number, got inf"),
    (_with(VISIT, value=float("-inf")), "value must be a finite number, got -inf"),
    (_with(VISIT, value=-10 ** 400), "value must be a finite number, got -inf"),
])
def test_wrong_types_are_named(record, reason):
    assert validate(record) == reason


def test_an_integral_float_impression_id_from_pandas_is_accepted():
    assert parse_event(_with(IMPRESSION, impression_id=42.0)).impression_id == 42


@pytest.mark.parametrize("ts, reason", [
    ("yesterday", "unparseable ts 'yesterday'"),
    ("2023-13-45T00:00:00Z", "unparseable ts '2023-13-45T00:00:00Z'"),
    ("2023-11-15T09:30:00.123", "ts '2023-11-15T09:30:00.123' has no UTC offset"),
    ("2023-11-15", "ts '2023-11-15' has no UTC offset"),
])
def test_unparseable_or_naive_ts_strings_are_rejected(ts, reason):
    assert validate(_with(VISIT, ts=ts)) == reason


def test_an_unparseable_ts_reason_is_truncated():
    reason = validate(_with(VISIT, ts="x" * 10_000))
    assert reason.startswith("unparseable ts 'xxx") and len(reason) < 100


@pytest.mark.parametrize("field, record", [
    ("url", VISIT), ("referer", VISIT), ("event_id", VISIT), ("user_id", VISIT),
    ("source_url", IMPRESSION), ("target_url", IMPRESSION), ("campaign", IMPRESSION),
])
def test_over_long_strings_are_rejected(field, record):
    assert validate(_with(record, **{field: "x" * MAX_STRING_LENGTH})) is None
    assert validate(_with(record, **{field: "x" * (MAX_STRING_LENGTH + 1)})) == \
        f"{field} too long ({MAX_STRING_LENGTH + 1} chars > {MAX_STRING_LENGTH})"


def test_an_unknown_event_type_reason_is_truncated():
    reason = validate(_with(VISIT, event_type="c" * 10_000))
    assert reason.startswith("unknown event_type 'ccc") and len(reason) < 100


@pytest.mark.parametrize("record", [None, "visit", 42, ["visit"]])
def test_a_record_that_is_not_an_object_is_rejected(record):
    assert validate(record) == f"record must be an object, got {type(record).__name__}"


def test_parse_events_names_the_position_of_the_bad_record():
    with pytest.raises(InvalidEvent, match=r"^record 2: unknown event_type 'click'$"):
        list(parse_events([VISIT, IMPRESSION, _with(VISIT, event_type="click")]))


def test_invalid_event_is_a_value_error_not_a_key_error():
    with pytest.raises(ValueError) as info:
        parse_event({"event_type": "visit"})
    assert not isinstance(info.value, (KeyError, TypeError))


# Any mapping with any mix of the schema's keys and junk values must produce an Event or an
# InvalidEvent with a reason: never KeyError, TypeError, AttributeError or OverflowError.
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                  st.text(max_size=30), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                  st.datetimes(), st.sampled_from(["visit", "impression", "heartbeat", TS, ""]))


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.dictionaries(st.sampled_from(EVENT_FIELDS + ("extra",)), _JUNK, max_size=12))
def test_arbitrary_records_never_raise_anything_but_invalid_event(record):
    try:
        event = parse_event(record)
    except InvalidEvent as err:
        assert str(err), "every rejection carries a reason"
        assert validate(record) == str(err)
    else:
        assert isinstance(event, Event) and isinstance(event.ts, int)
        assert validate(record) is None


# -- timestamps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("1970-01-01T00:00:00Z", 0),
    ("1970-01-01T00:00:00.001Z", 1),
    ("1970-01-01T12:01:30.000z", 43_290_000),
    ("2023-11-15T09:30:00.123+00:00", TS_MS),
    ("2023-11-15T10:30:00.123+01:00", TS_MS),        # an explicit non-UTC offset is converted
    ("1969-12-31T23:59:59.999Z", -1),
    (dt.datetime(2023, 11, 15, 9, 30, 0, 123_999, tzinfo=dt.timezone.utc), TS_MS),  # truncated
    (dt.datetime(2023, 11, 15, 9, 30, 0, 123_000), TS_MS),   # a naive datetime object is UTC
    (TS_MS, TS_MS),
])
def test_ts_to_ms(value, expected):
    assert ts_to_ms(value) == expected


def test_pandas_timestamps_convert():
    import pandas as pd

    assert ts_to_ms(pd.Timestamp(TS)) == TS_MS
    assert ts_to_ms(pd.Timestamp("1969-12-31T23:59:59.9995Z")) == -1


@pytest.mark.parametrize("ms", [0, 1, -1, TS_MS, 43_290_000, 253_402_300_799_999])
def test_ms_to_iso_and_back(ms):
    text = ms_to_iso(ms)
    assert text.endswith("Z") and len(text) == len("1970-01-01T00:00:00.000Z")
    assert ts_to_ms(text) == ms
    assert ts_to_ms(ms_to_datetime(ms)) == ms


def test_ms_to_iso_is_the_json_lines_form():
    assert ms_to_iso(TS_MS) == TS
