"""Every default of the attribution rules and jobs, in one place.

Durations are kept both as the human string the CLIs accept and as milliseconds, which is the
unit of event time throughout the core; ``joins.durations`` parses them.
"""
from __future__ import annotations

from dataclasses import dataclass

# The project's one duration parser (re-exported here for the attribution options).
from joins.durations import (  # noqa: F401
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    MS_PER_SECOND,
    parse_duration_ms,
    spark_interval,
)

DEFAULT_LOOKBACK = "90 days"
DEFAULT_DEDUP_WINDOW = "1 day"
DEFAULT_WATERMARK_DELAY = "10 minutes"
DEFAULT_MODEL = "last_touch"

# Strings longer than this are rejected by validation: a 1 MB url is an attack or a bug, not a page.
MAX_STRING_LENGTH = 8_192


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
        return cls(lookback_ms=parse_duration_ms(lookback, "lookback"),
                   dedup_window_ms=parse_duration_ms(dedup_window, "dedup window"))
