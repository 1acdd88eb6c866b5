"""Every default of the attribution rules and jobs, in one place.

Durations are kept both as the human string the CLIs accept and as milliseconds, which is the
unit of event time throughout the core.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MS_PER_SECOND = 1_000
MS_PER_MINUTE = 60 * MS_PER_SECOND
MS_PER_HOUR = 60 * MS_PER_MINUTE
MS_PER_DAY = 24 * MS_PER_HOUR

DEFAULT_LOOKBACK = "90 days"
DEFAULT_DEDUP_WINDOW = "1 day"
DEFAULT_WATERMARK_DELAY = "10 minutes"
DEFAULT_MODEL = "last_touch"

# Strings longer than this are rejected by validation: a 1 MB url is an attack or a bug, not a page.
MAX_STRING_LENGTH = 8_192

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": MS_PER_SECOND, "sec": MS_PER_SECOND, "second": MS_PER_SECOND, "seconds": MS_PER_SECOND,
    "m": MS_PER_MINUTE, "min": MS_PER_MINUTE, "minute": MS_PER_MINUTE, "minutes": MS_PER_MINUTE,
    "h": MS_PER_HOUR, "hour": MS_PER_HOUR, "hours": MS_PER_HOUR,
    "d": MS_PER_DAY, "day": MS_PER_DAY, "days": MS_PER_DAY,
    "w": 7 * MS_PER_DAY, "week": 7 * MS_PER_DAY, "weeks": 7 * MS_PER_DAY,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


def parse_duration_ms(text: str) -> int:
    """Parse a duration such as ``"90 days"``, ``"10 minutes"``, ``"2s"`` into milliseconds.

    Raises ``ValueError`` with the accepted units when the text is not a duration.
    """
    match = _DURATION.match(str(text))
    if not match or match.group(2).lower() not in _UNITS_MS:
        raise ValueError(
            f"not a duration: {text!r}; use '<number> <unit>' with unit one of "
            "ms, seconds, minutes, hours, days, weeks (e.g. '10 minutes')"
        )
    value = float(match.group(1)) * _UNITS_MS[match.group(2).lower()]
    if value < 0:
        raise ValueError(f"duration must be non-negative: {text!r}")
    return int(round(value))


def spark_interval(ms: int) -> str:
    """Render milliseconds as a Spark interval string (``withWatermark`` accepts it)."""
    if ms % MS_PER_SECOND:
        return f"{ms} milliseconds"
    return f"{ms // MS_PER_SECOND} seconds"


@dataclass(frozen=True)
class AttributionConfig:
    """The parameters of the attribution rules (spec sections 2 and 3)."""

    lookback_ms: int = parse_duration_ms(DEFAULT_LOOKBACK)
    dedup_window_ms: int = parse_duration_ms(DEFAULT_DEDUP_WINDOW)
    model: str = DEFAULT_MODEL

    def __post_init__(self) -> None:
        if self.lookback_ms < 0:
            raise ValueError("lookback must be non-negative")
        if self.dedup_window_ms <= 0:
            raise ValueError("dedup window must be positive")
        if self.model != DEFAULT_MODEL:
            raise ValueError(f"unknown attribution model {self.model!r}; supported: {DEFAULT_MODEL!r}")

    @classmethod
    def from_strings(cls, lookback: str = DEFAULT_LOOKBACK,
                     dedup_window: str = DEFAULT_DEDUP_WINDOW) -> "AttributionConfig":
        return cls(lookback_ms=parse_duration_ms(lookback),
                   dedup_window_ms=parse_duration_ms(dedup_window))
