"""The event model: the typed ``Event`` and the validation that turns raw records into events.

Event time is an integer count of milliseconds since the Unix epoch, UTC, everywhere in the core.
Validation never raises a bare ``KeyError``/``TypeError``: every problem becomes an
``InvalidEvent`` whose message is the reason, e.g. ``missing user_id`` or
``unknown event_type 'click'``.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Optional

from joins.durations import EPOCH, ms_to_datetime, ms_to_iso  # noqa: F401 (re-exported)

from .config import MAX_STRING_LENGTH
from .schema import EVENT_TYPES

# Characters of an offending value quoted in a reason.
_PREVIEW = 64


class InvalidEvent(ValueError):
    """A record that does not satisfy the event schema; ``str(err)`` is the reason."""


class Event(NamedTuple):
    """One validated input record (spec sections 1 and 7). ``ts`` is epoch milliseconds, UTC.

    ``campaign`` is an impression's, ``value`` a visit's (the core uses it on goals only).

    Immutable. A named tuple rather than a frozen dataclass: a batch or a truth file builds one
    per record, and a tuple is built about three times faster.
    """

    event_id: str
    user_id: Optional[str]
    event_type: str
    ts: int
    url: Optional[str] = None
    referer: Optional[str] = None
    is_goal: bool = False
    impression_id: Optional[int] = None
    source_url: Optional[str] = None
    target_url: Optional[str] = None
    campaign: Optional[str] = None
    value: Optional[float] = None

    @property
    def is_visit(self) -> bool:
        return self.event_type == "visit"

    @property
    def is_impression(self) -> bool:
        return self.event_type == "impression"

    @property
    def is_heartbeat(self) -> bool:
        return self.event_type == "heartbeat"

    def to_record(self) -> dict:
        """The event as a plain dict in the Avro event schema (``ts`` still in epoch ms)."""
        return {"event_id": self.event_id, "user_id": self.user_id, "event_type": self.event_type,
                "ts": self.ts, "url": self.url, "referer": self.referer,
                "is_goal": self.is_goal if self.is_visit else None,
                "impression_id": self.impression_id, "source_url": self.source_url,
                "target_url": self.target_url, "campaign": self.campaign, "value": self.value}


def ts_to_ms(value: Any) -> int:
    """Convert an event-time value to epoch milliseconds.

    Accepts ISO-8601 strings with an explicit UTC offset (``...Z`` or ``+00:00``), aware or naive
    (taken as UTC) datetimes and pandas Timestamps, and integers already in milliseconds.
    Raises ``InvalidEvent`` otherwise.

    :param value: the event-time value to convert.
    """
    if value is None:
        raise InvalidEvent("missing ts")
    if isinstance(value, bool):
        raise InvalidEvent(f"ts must be a timestamp, got {type(value).__name__}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = _dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidEvent(f"unparseable ts {value[:_PREVIEW]!r}") from None
        if parsed.tzinfo is None:
            raise InvalidEvent(f"ts {value[:_PREVIEW]!r} has no UTC offset")
        value = parsed
    if isinstance(value, _dt.datetime):  # includes pandas.Timestamp
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        delta = value - EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    raise InvalidEvent(f"ts must be a timestamp, got {type(value).__name__}")


def _is_missing(value: Any) -> bool:
    # NaN/NaT (from pandas) count as missing as well as None.
    return value is None or (isinstance(value, float) and value != value) or str(value) == "NaT"


def _string(record: Mapping[str, Any], name: str, required: bool, what: str = "") -> Optional[str]:
    value = record.get(name)
    if _is_missing(value):
        if required:
            raise InvalidEvent(f"{what} without {name}" if what else f"missing {name}")
        return None
    if not isinstance(value, str):
        raise InvalidEvent(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_STRING_LENGTH:
        raise InvalidEvent(f"{name} too long ({len(value)} chars > {MAX_STRING_LENGTH})")
    if required and not value:
        raise InvalidEvent(f"{what} with empty {name}" if what else f"empty {name}")
    return value


def _value(record: Mapping[str, Any]) -> Optional[float]:
    # Unlike other fields, a NaN here is not "missing": a non-finite value is invalid.
    value = record.get("value")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidEvent(f"value must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a double's range
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise InvalidEvent(f"value must be a finite number, got {number}")
    return number


def parse_event(record: Mapping[str, Any]) -> Event:
    """Validate one raw record (a dict as read from JSON, Parquet or Avro) into an ``Event``.

    Raises ``InvalidEvent`` with the reason when the record breaks the schema.

    :param record: the raw record, field name to value.
    """
    if not isinstance(record, Mapping):
        raise InvalidEvent(f"record must be an object, got {type(record).__name__}")
    event_type = record.get("event_type")
    if _is_missing(event_type):
        raise InvalidEvent("missing event_type")
    if event_type not in EVENT_TYPES:
        raise InvalidEvent(f"unknown event_type {str(event_type)[:_PREVIEW]!r}")
    event_id = _string(record, "event_id", required=True)
    ts = ts_to_ms(None if _is_missing(record.get("ts")) else record.get("ts"))
    if event_type == "heartbeat":
        return Event(event_id=event_id, user_id=None, event_type="heartbeat", ts=ts)
    user_id = _string(record, "user_id", required=True)
    if event_type == "visit":
        is_goal = record.get("is_goal")
        if _is_missing(is_goal):
            is_goal = False
        elif not isinstance(is_goal, bool):
            raise InvalidEvent(f"is_goal must be a boolean, got {type(is_goal).__name__}")
        return Event(event_id=event_id, user_id=user_id, event_type="visit", ts=ts,
                     url=_string(record, "url", required=True, what="visit"),
                     referer=_string(record, "referer", required=False),
                     is_goal=is_goal, value=_value(record))
    impression_id = record.get("impression_id")
    if _is_missing(impression_id):
        raise InvalidEvent("impression without impression_id")
    if isinstance(impression_id, bool) or not isinstance(impression_id, int):
        # Parquet/pandas may hand over floats for nullable longs; accept integral ones only.
        if isinstance(impression_id, float) and impression_id.is_integer():
            impression_id = int(impression_id)
        else:
            raise InvalidEvent(f"impression_id must be an integer, got "
                               f"{type(impression_id).__name__}")
    return Event(event_id=event_id, user_id=user_id, event_type="impression", ts=ts,
                 impression_id=int(impression_id),
                 source_url=_string(record, "source_url", required=True, what="impression"),
                 target_url=_string(record, "target_url", required=True, what="impression"),
                 campaign=_string(record, "campaign", required=False))


def validate(record: Mapping[str, Any]) -> Optional[str]:
    """Return the reason a record is invalid, or ``None`` when it is a valid event.

    :param record: the raw record, field name to value.
    """
    try:
        parse_event(record)
    except InvalidEvent as err:
        return str(err)
    return None


def parse_events(records: Iterable[Mapping[str, Any]]) -> Iterator[Event]:
    """Parse many records, raising ``InvalidEvent`` (with the record's position) on the first
    bad one.

    :param records: the raw records, each field name to value.
    """
    for position, record in enumerate(records):
        try:
            yield parse_event(record)
        except InvalidEvent as err:
            raise InvalidEvent(f"record {position}: {err}") from None
