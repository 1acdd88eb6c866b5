"""The project's one duration parser and formatter, and event times as epoch milliseconds.

Every command line and API of the project takes durations the same way: ``"<number> <unit>"``
(``"10 minutes"``, ``"2s"``, ``"1.5 h"``), or an ``int`` of milliseconds from code. A bare number
in text is refused, because ``"5"`` could mean seconds as well as milliseconds (``"0"`` is
accepted: it is zero in any unit). It lives in
``joins`` because ``joins`` must stand alone (it imports nothing else of the project), while every
other package may import it.
"""
from __future__ import annotations

import datetime as _dt
import re
from typing import Union

MS_PER_SECOND = 1_000
MS_PER_MINUTE = 60 * MS_PER_SECOND
MS_PER_HOUR = 60 * MS_PER_MINUTE
MS_PER_DAY = 24 * MS_PER_HOUR
MS_PER_WEEK = 7 * MS_PER_DAY

Duration = Union[str, int, _dt.timedelta]
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": MS_PER_SECOND, "sec": MS_PER_SECOND, "secs": MS_PER_SECOND,
    "second": MS_PER_SECOND, "seconds": MS_PER_SECOND,
    "m": MS_PER_MINUTE, "min": MS_PER_MINUTE, "mins": MS_PER_MINUTE,
    "minute": MS_PER_MINUTE, "minutes": MS_PER_MINUTE,
    "h": MS_PER_HOUR, "hour": MS_PER_HOUR, "hours": MS_PER_HOUR,
    "d": MS_PER_DAY, "day": MS_PER_DAY, "days": MS_PER_DAY,
    "w": MS_PER_WEEK, "week": MS_PER_WEEK, "weeks": MS_PER_WEEK,
}
_DURATION = re.compile(r"^\s*([-+]?)\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_HINT = ("use '<number> <unit>' with unit one of ms, s, min, h, days, weeks "
         "(e.g. '10 minutes')")


class DurationError(ValueError):
    """Text or a value that is not a duration; the message names it and the accepted form."""


def parse_duration_ms(value: Duration, what: str = "duration", allow_negative: bool = False) -> int:
    """Milliseconds of a duration.

    :param value: ``"<number> <unit>"`` text (a leading ``-`` only with ``allow_negative``), an
        ``int`` of milliseconds, or a ``datetime.timedelta``.
    :param what: the name of the option or field, used in the error message.
    :param allow_negative: accept durations below zero (e.g. a join's lower time bound).
    :raises DurationError: when ``value`` is not a duration, or is negative without
        ``allow_negative``.
    """
    if isinstance(value, bool) or value is None:
        raise DurationError(f"{what}: not a duration: {value!r}; {_HINT}")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, _dt.timedelta):
        ms = round(value.total_seconds() * 1000)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise DurationError(f"{what}: not a duration: {value!r}; {_HINT}")
        sign, number, unit = match.groups()
        if not unit and float(number) != 0:  # zero is zero in any unit
            raise DurationError(f"{what}: {value!r} has no unit; {_HINT}")
        if unit and unit.lower() not in _UNITS_MS:
            raise DurationError(f"{what}: unknown unit {unit!r} in {value!r}; {_HINT}")
        ms = round(float(number) * _UNITS_MS.get(unit.lower(), 0)) * (-1 if sign == "-" else 1)
    if ms < 0 and not allow_negative:
        raise DurationError(f"{what} must not be negative, got {value!r}")
    return ms


_FORMAT_UNITS = ((MS_PER_DAY, "days"), (MS_PER_HOUR, "h"), (MS_PER_MINUTE, "min"),
                 (MS_PER_SECOND, "s"))


def format_duration_ms(ms: float) -> str:
    """A duration in the largest unit that keeps it at least 1, to 3 significant digits, and
    whole past 999 of the largest unit (no exponent notation).

    ``1500`` -> ``"1.5 s"``, ``120000`` -> ``"2 min"``, ``27372984247`` -> ``"317 days"``,
    ``1.1e15`` -> ``"12731481 days"``.

    :param ms: the duration in milliseconds (negative values keep their sign).
    """
    magnitude = abs(ms)
    for size, unit in _FORMAT_UNITS:
        if magnitude >= size:
            text = f"{ms / size:.3g}"
            return f"{ms / size:.0f} {unit}" if "e" in text else f"{text} {unit}"
    return f"{ms:.3g} ms"


def spark_interval(ms: int) -> str:
    """Milliseconds as an interval string Spark accepts (``withWatermark``, time bounds).

    :param ms: the duration in milliseconds.
    """
    if ms % MS_PER_SECOND:
        return f"{ms} milliseconds"
    return f"{ms // MS_PER_SECOND} seconds"


def ms_to_datetime(ms: int) -> _dt.datetime:
    """Epoch milliseconds to an aware UTC datetime.

    :param ms: milliseconds since 1970-01-01T00:00:00Z.
    """
    return EPOCH + _dt.timedelta(milliseconds=ms)


def ms_to_iso(ms: int) -> str:
    """Epoch milliseconds to the JSON-lines form of an event time, e.g.
    ``1970-01-01T12:01:00.000Z``.

    :param ms: milliseconds since 1970-01-01T00:00:00Z.
    """
    return ms_to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
