"""What state cleanup Spark will do for a declared join: the operator's promise, computed in Python.

This mirrors, from the declarations alone, the rules Spark's stream-stream join applies when it
plans ``StreamingSymmetricHashJoinExec`` (Spark 4.x, checked empirically on 4.3):

- If a watermarked column (or a window derived from one) is an equality key, **both** sides get a
  *key* predicate ``key <= W`` (for a window, ``window.end <= W``). One watermarked side suffices.
  This wins over any range condition (the "mixed" case).
- Otherwise, a side gets a *value* predicate only if it has a watermark itself, the other side has
  one too, and the range bounds it from below: for ``left.t + lower <= right.t <= left.t + upper``

  * left rows are evicted when ``left.t <= W - upper`` (``- 1 ms`` when the bound is inclusive),
  * right rows are evicted when ``right.t <= W + lower`` (``- 1 ms`` when inclusive).

- ``W`` is the global watermark: per input ``max(event time) - delay``, combined by the session's
  ``spark.sql.streaming.multipleWatermarkPolicy`` (``min`` unless changed).

Unmatched rows of an outer join are emitted, padded with nulls, in the micro-batch that evicts
them: never before their side's predicate covers them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .spec import StateKeyCondition, StateValueCondition, strategy_of

_ONE_MS = 1


@dataclass(frozen=True)
class SideCleanup:
    """The expected cleanup of one side's state.

    ``strategy`` is ``state-key``, ``state-value`` or ``none``. When not ``none``, rows whose
    ``column`` (its ``field`` for a window: ``end``) is ``<= W + offset_ms`` are evicted, W being
    the global watermark. ``source_column`` is the same column's name in the side's input (Spark
    may name that one, e.g. after pushing a semi join below the prefixing projection).
    ``missing`` lists what would be needed to clean a side that cannot be.
    """

    side: str
    name: str
    strategy: str
    time_column: str
    column: Optional[str] = None
    source_column: Optional[str] = None
    field: Optional[str] = None
    offset_ms: Optional[int] = None
    has_watermark: bool = False
    watermark_delay_ms: Optional[int] = None
    missing: tuple[str, ...] = ()

    @property
    def cleanable(self) -> bool:
        """Whether Spark ever evicts this side's state."""
        return self.strategy != "none"

    def threshold_ms(self, watermark_ms: Optional[int]) -> Optional[int]:
        """The eviction threshold at a given global watermark.

        :param watermark_ms: the global watermark W in epoch ms, or ``None`` before it exists.
        :returns: ``W + offset_ms``, or ``None`` if the side is never evicted or W is undefined.
        """
        if not self.cleanable or watermark_ms is None:
            return None
        return watermark_ms + self.offset_ms

    def target(self) -> str:
        """The compared value: the column, or ``column.field`` for a window."""
        return f"{self.column}.{self.field}" if self.field else str(self.column)

    def describe(self) -> str:
        """One line: the side's strategy and eviction predicate, or what it is missing."""
        if not self.cleanable:
            return f"{self.side} ({self.name}): never evicted; missing: {'; '.join(self.missing)}"
        offset = "" if self.offset_ms == 0 else (
            f" + {self.offset_ms} ms" if self.offset_ms > 0 else f" - {-self.offset_ms} ms")
        return (f"{self.side} ({self.name}): {self.strategy}, "
                f"evict rows with {self.target()} <= W{offset}")


@dataclass(frozen=True)
class ExpectedCleanup:
    """The operator's promise for a join: per-side cleanup, watermark rule, outer-row timing."""

    strategy: str
    how: str
    left: SideCleanup
    right: SideCleanup
    watermark_policy: str = "min"

    def sides(self) -> tuple[SideCleanup, SideCleanup]:
        """The left and the right side's cleanup, in that order."""
        return self.left, self.right

    @property
    def bounded(self) -> bool:
        """Whether both sides' state is evicted (the join's state stays bounded)."""
        return self.left.cleanable and self.right.cleanable

    def watermark_rule(self) -> str:
        """How the global watermark W is computed from the sides' watermarks, in words."""
        parts = [f"max({s.time_column}) - {s.watermark_delay_ms} ms"
                 for s in self.sides() if s.has_watermark]
        if not parts:
            return "no watermark: W is undefined and no state is ever evicted"
        if len(parts) == 1:
            return f"W = {parts[0]}"
        return f"W = {self.watermark_policy}({', '.join(parts)})"

    def outer_rows(self) -> list[str]:
        """When the null-padded rows of an outer join are emitted."""
        preserved = {"left_outer": (self.left,), "right_outer": (self.right,),
                     "full_outer": (self.left, self.right)}.get(self.how, ())
        out = []
        for s in preserved:
            if s.cleanable:
                out.append(f"unmatched {s.side} ({s.name}) rows are emitted with nulls in the "
                           f"batch that evicts them, "
                           f"i.e. once W{_signed(s.offset_ms)} >= {s.target()}")
            else:
                out.append(f"unmatched {s.side} ({s.name}) rows are never emitted: "
                           "the side is never evicted")
        return out

    def describe(self) -> str:
        """The whole promise as indented lines: strategy, watermark rule, sides, outer rows."""
        lines = [f"strategy {self.strategy}, join {self.how}; {self.watermark_rule()}",
                 "  " + self.left.describe(), "  " + self.right.describe()]
        lines += ["  " + line for line in self.outer_rows()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The promise as a JSON-ready dict (both sides in full, plus the derived rules)."""
        return {"strategy": self.strategy, "how": self.how,
                "watermark_policy": self.watermark_policy,
                "watermark_rule": self.watermark_rule(), "bounded": self.bounded,
                "left": asdict(self.left), "right": asdict(self.right),
                "outer_rows": self.outer_rows()}


def _signed(offset_ms: Optional[int]) -> str:
    if not offset_ms:
        return ""
    return f" + {offset_ms} ms" if offset_ms > 0 else f" - {-offset_ms} ms"


@dataclass(frozen=True)
class SideFacts:
    """What ``expected_cleanup`` needs to know about one side after it is prepared."""

    side: str
    name: str
    time_column: str
    window_column: Optional[str]
    watermark_delay_ms: Optional[int]
    source_time_column: Optional[str] = None

    @property
    def has_watermark(self) -> bool:
        """Whether the side is watermarked."""
        return self.watermark_delay_ms is not None


def expected_cleanup(left: SideFacts, right: SideFacts, how: str,
                     state_key: Optional[StateKeyCondition],
                     state_value: Optional[StateValueCondition],
                     watermark_policy: str = "min") -> ExpectedCleanup:
    """Predict Spark's per-side state cleanup for the declared join (see the module docstring).

    :param left: the left side as prepared (time and window column names, watermark delay).
    :param right: the right side, likewise.
    :param how: the canonical join type (``normalize_join_type``).
    :param state_key: the declared event-time equality, or ``None``.
    :param state_value: the declared time range, or ``None``.
    :param watermark_policy: the session's ``spark.sql.streaming.multipleWatermarkPolicy``
        (``min`` or ``max``), used to describe W.
    :returns: the per-side cleanup; a side Spark never cleans has strategy ``none`` and lists
        what it is missing.
    """
    strategy = strategy_of(state_key, state_value)
    any_watermark = left.has_watermark or right.has_watermark

    def common(facts: SideFacts) -> dict:
        return {"side": facts.side, "name": facts.name, "time_column": facts.time_column,
                "has_watermark": facts.has_watermark,
                "watermark_delay_ms": facts.watermark_delay_ms}

    def key_side(facts: SideFacts) -> SideCleanup:
        windowed = state_key.window is not None
        return SideCleanup(strategy="state-key", offset_ms=0,
                           column=facts.window_column if windowed else facts.time_column,
                           source_column=None if windowed else facts.source_time_column,
                           field="end" if windowed else None, **common(facts))

    if state_key is not None and any_watermark:
        return ExpectedCleanup(strategy, how, key_side(left), key_side(right), watermark_policy)

    def uncleanable(facts: SideFacts, missing: list[str]) -> SideCleanup:
        return SideCleanup(strategy="none", missing=tuple(missing), **common(facts))

    if state_value is None:
        if state_key is None:
            missing = ["a time condition: StateKeyCondition (equality on event time or on a "
                       "window) or StateValueCondition (a time range)"]
            if not any_watermark:
                missing.append("a watermark on at least one side")
        else:
            missing = ["a watermark on at least one side (the state-key condition needs one)"]
        return ExpectedCleanup(strategy, how, uncleanable(left, missing),
                               uncleanable(right, missing), watermark_policy)

    def value_side(facts: SideFacts, other: SideFacts, bound_ms: Optional[int], inclusive: bool,
                   sign: int, bound_name: str) -> SideCleanup:
        missing = []
        if not facts.has_watermark:
            missing.append(f"a watermark on the {facts.side} side ({facts.name})")
        if not other.has_watermark:
            missing.append(f"a watermark on the {other.side} side ({other.name})")
        if bound_ms is None:
            article = "an" if bound_name == "upper" else "a"
            missing.append(f"{article} {bound_name} bound on the time range "
                           f"(StateValueCondition.{bound_name})")
        if missing:
            return uncleanable(facts, missing)
        windowed = state_value.window is not None
        offset = sign * bound_ms - (_ONE_MS if inclusive else 0)
        return SideCleanup(strategy="state-value", offset_ms=offset,
                           column=facts.window_column if windowed else facts.time_column,
                           source_column=None if windowed else facts.source_time_column,
                           field="end" if windowed else None, **common(facts))

    left_cleanup = value_side(left, right, state_value.upper_ms(), state_value.upper_inclusive,
                              -1, "upper")
    right_cleanup = value_side(right, left, state_value.lower_ms(), state_value.lower_inclusive,
                               +1, "lower")
    return ExpectedCleanup(strategy, how, left_cleanup, right_cleanup, watermark_policy)
