"""The declarations of a stream-to-stream join: its two sides, its keys and its time conditions.

Nothing here touches Spark beyond holding a DataFrame reference: these dataclasses only check that
the declaration makes sense (durations parse, a range has a bound, join type is supported), so
that mistakes surface as a clear ``JoinSpecError`` before any query is planned.

Time conditions, and the state-cleanup strategy each one gives Spark:

- ``StateKeyCondition``: equality on the event-time columns, or on a tumbling window of them.
  The watermarked column is a join key, so Spark evicts state by key ("state-key watermark").
- ``StateValueCondition``: ``left.t + lower <= right.t <= left.t + upper`` (bounds optional,
  each inclusive or not). Spark derives a per-side eviction threshold from the other side's
  watermark ("state-value watermark").
- Both at once is the "mixed" strategy: Spark then uses the state-key predicate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

from .durations import Duration, DurationError, parse_duration_ms

# Canonical join types, and the spellings Spark accepts for each.
JOIN_TYPES = {
    "inner": ("inner",),
    "left_outer": ("left_outer", "left", "leftouter"),
    "right_outer": ("right_outer", "right", "rightouter"),
    "full_outer": ("full_outer", "full", "outer", "fullouter"),
    "left_semi": ("left_semi", "semi", "leftsemi"),
}
_JOIN_TYPE_ALIASES = {alias: canonical for canonical, aliases in JOIN_TYPES.items()
                      for alias in aliases}

STRATEGIES = ("state-key", "state-value", "mixed", "none")

KeySpec = Union[str, Tuple[str, str]]


class JoinSpecError(ValueError):
    """A join declaration that cannot be built; the message says what to change."""


def duration_ms(value: Optional[Duration], what: str,
                allow_negative: bool = False) -> Optional[int]:
    """A duration of a join declaration in milliseconds.

    :param value: ``"2 seconds"``/``"-5 minutes"``, integer milliseconds, or ``None``.
    :param what: the declaration's field, named in the error message.
    :param allow_negative: accept a negative duration (a range offset may be negative).
    :returns: the duration in ms, or ``None`` for ``None``.
    :raises JoinSpecError: the value does not parse, or is negative when that is not allowed.
    """
    if value is None:
        return None
    try:
        return parse_duration_ms(value, what, allow_negative)
    except DurationError as err:
        raise JoinSpecError(str(err)) from None


def normalize_join_type(how: str) -> str:
    """Map a Spark join-type spelling to one of ``JOIN_TYPES``.

    :param how: a spelling Spark accepts (``"left"``, ``"leftouter"``, ``"left-outer"``, ...).
    :returns: the canonical name (``"left_outer"``).
    :raises JoinSpecError: the join type is not one a stream-stream join supports.
    """
    canonical = _JOIN_TYPE_ALIASES.get(str(how).strip().lower().replace("-", "_"))
    if canonical is None:
        raise JoinSpecError(
            f"unsupported join type {how!r} for a stream-stream join; "
            f"use one of {', '.join(JOIN_TYPES)}")
    return canonical


@dataclass(frozen=True)
class JoinSide:
    """One input of the join.

    ``time_col`` is the side's event-time column. ``watermark_delay`` declares its watermark
    (``"10 minutes"`` or ms); ``None`` means the side has no watermark, unless the DataFrame
    already carries one on ``time_col`` (``withWatermark`` applied upstream, e.g. before a
    filter), which is then detected and used. Every output column of the side is renamed to
    ``prefix + name``; the prefix defaults to ``name + "_"``, and ``name`` (used in messages)
    defaults to ``left``/``right``.
    """

    df: Any
    time_col: str
    watermark_delay: Optional[Duration] = None
    prefix: Optional[str] = None
    name: Optional[str] = None

    def delay_ms(self) -> Optional[int]:
        """The declared watermark delay in ms (``None`` when none is declared)."""
        return duration_ms(self.watermark_delay, f"watermark_delay of side {self.name!r}")


@dataclass(frozen=True)
class StateKeyCondition:
    """Equality on event time: ``left.t == right.t``, or with ``window`` set,
    ``window(left.t, window) == window(right.t, window)`` (tumbling windows)."""

    window: Optional[Duration] = None

    def window_ms(self) -> Optional[int]:
        """The window size in ms (``None`` without a window); raises ``JoinSpecError`` unless
        positive."""
        ms = duration_ms(self.window, "StateKeyCondition.window")
        if ms is not None and ms <= 0:
            raise JoinSpecError("StateKeyCondition.window must be a positive duration")
        return ms


@dataclass(frozen=True)
class StateValueCondition:
    """A time range: ``left.t + lower <= right.t <= left.t + upper``.

    Either bound may be omitted (then that side's state cannot be evicted by this condition), and
    each may be exclusive. Offsets may be negative. With ``window`` set, the sides are compared by
    their tumbling windows instead of their timestamps (``right.window >= left.window``); Spark
    cannot add an interval to a window, so the offsets must then be zero.
    """

    lower: Optional[Duration] = None
    upper: Optional[Duration] = None
    lower_inclusive: bool = True
    upper_inclusive: bool = True
    window: Optional[Duration] = None

    def lower_ms(self) -> Optional[int]:
        """The lower offset in ms (``None`` when omitted)."""
        return duration_ms(self.lower, "StateValueCondition.lower", allow_negative=True)

    def upper_ms(self) -> Optional[int]:
        """The upper offset in ms (``None`` when omitted)."""
        return duration_ms(self.upper, "StateValueCondition.upper", allow_negative=True)

    def window_ms(self) -> Optional[int]:
        """The window size in ms (``None`` without a window); raises ``JoinSpecError`` unless
        positive."""
        ms = duration_ms(self.window, "StateValueCondition.window")
        if ms is not None and ms <= 0:
            raise JoinSpecError("StateValueCondition.window must be a positive duration")
        return ms

    def validate(self) -> None:
        """Check the range: at least one bound, not empty, and zero offsets on windows.

        :raises JoinSpecError: naming what is wrong with the range.
        """
        lower, upper, window = self.lower_ms(), self.upper_ms(), self.window_ms()
        if lower is None and upper is None:
            raise JoinSpecError("StateValueCondition needs a lower and/or an upper bound, "
                                "e.g. StateValueCondition(lower='0 seconds', upper='10 minutes')")
        if lower is not None and upper is not None:
            closed = self.lower_inclusive and self.upper_inclusive
            empty = lower > upper or (lower == upper and not closed)
            if empty:
                raise JoinSpecError(f"StateValueCondition range is empty: lower {self.lower!r} "
                                    f"is not below upper {self.upper!r}")
        if window is not None and any(b not in (None, 0) for b in (lower, upper)):
            raise JoinSpecError("StateValueCondition on windows compares whole windows "
                                "(right.window >= left.window): lower/upper must be 0 or omitted, "
                                f"got lower={self.lower!r}, upper={self.upper!r}")


def normalize_keys(keys: Sequence[KeySpec]) -> list[tuple[str, str]]:
    """Equality keys as ``(left column, right column)`` pairs.

    :param keys: column names (a plain name means the same column on both sides) and
        ``(left, right)`` pairs; a single name or pair is accepted too.
    :returns: one ``(left, right)`` pair per key.
    :raises JoinSpecError: a key is neither a name nor a pair of names.
    """
    if isinstance(keys, (str, tuple)):
        keys = [keys]
    pairs = []
    for key in keys or ():
        if isinstance(key, str):
            pairs.append((key, key))
        elif (isinstance(key, (tuple, list)) and len(key) == 2
              and all(isinstance(k, str) for k in key)):
            pairs.append((key[0], key[1]))
        else:
            raise JoinSpecError(
                f"join key {key!r}: use a column name or a (left, right) pair of names")
    return pairs


def strategy_of(state_key: Optional[StateKeyCondition],
                state_value: Optional[StateValueCondition]) -> str:
    """The requested strategy: which time conditions the join declares.

    :param state_key: the declared event-time equality, or ``None``.
    :param state_value: the declared time range, or ``None``.
    :returns: one of ``STRATEGIES``.
    """
    if state_key is not None and state_value is not None:
        return "mixed"
    if state_key is not None:
        return "state-key"
    if state_value is not None:
        return "state-value"
    return "none"


def validate_conditions(state_key: Optional[StateKeyCondition],
                        state_value: Optional[StateValueCondition]) -> Optional[int]:
    """Check the time conditions together.

    :param state_key: the declared event-time equality, or ``None``.
    :param state_value: the declared time range, or ``None``.
    :returns: the window size (ms) the sides need, or ``None`` when no window is compared.
    :raises JoinSpecError: a condition has the wrong type, is invalid, or the two disagree on
        the window.
    """
    if state_key is not None and not isinstance(state_key, StateKeyCondition):
        raise JoinSpecError(
            f"state_key must be a StateKeyCondition, got {type(state_key).__name__}")
    if state_value is not None and not isinstance(state_value, StateValueCondition):
        raise JoinSpecError(
            f"state_value must be a StateValueCondition, got {type(state_value).__name__}")
    key_window = state_key.window_ms() if state_key else None
    value_window = None
    if state_value is not None:
        state_value.validate()
        value_window = state_value.window_ms()
    if state_key is not None and value_window is not None and key_window != value_window:
        # Spark allows one event-time column per side: a window range needs the same window as key.
        raise JoinSpecError("a mixed join comparing windows needs StateKeyCondition(window=...) "
                            "with the same window size as StateValueCondition(window=...)")
    return key_window if key_window is not None else value_window
