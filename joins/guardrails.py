"""Refuse joins whose state Spark could never clean, before any query starts.

Spark itself accepts many such joins: an inner join without any watermark, a range that bounds
only one side, a left outer join whose left side has no watermark (accepted, but its null-padded
rows are then never emitted), a full outer join whose right side can never be evicted. Their state
grows until the job dies. The checks here work on the ``ExpectedCleanup`` predicted from the
declaration and raise an error that names the side and what it is missing:

- ``UnsupportedOuterJoinError``: the preserved side of an outer (or semi) join can never be
  evicted, so Spark rejects the join or never emits its unmatched rows. No opt-in.
- ``UnboundedStateError``: some side's state is never evicted. ``allow_unbounded_state=True``
  accepts it, for inputs known to be small or short-lived.
"""
from __future__ import annotations

from .cleanup import ExpectedCleanup, SideCleanup
from .spec import JoinSpecError


class UnboundedStateError(JoinSpecError):
    """The join's state would grow without bound; the message says what is missing."""


class UnsupportedOuterJoinError(JoinSpecError):
    """An outer or semi join whose preserved side can never be evicted; the message says the fix."""


# The sides whose unmatched rows a join type must emit (or, for semi, must be able to forget).
PRESERVED_SIDES = {"left_outer": ("left",), "left_semi": ("left",), "right_outer": ("right",),
                   "full_outer": ("left", "right")}


def _fix_for(side: SideCleanup) -> str:
    bound = "an upper" if side.side == "left" else "a lower"
    return (f"either add StateKeyCondition (event time or a window as an equality key) with a "
            f"watermark on at least one side, or use StateValueCondition with {bound} bound "
            f"(it limits how far {side.side} rows can wait for a match) "
            f"and watermarks on both sides")


def check_equality(has_equality: bool) -> None:
    """Spark's stream-stream join is a hash join: it needs at least one equality condition.

    :param has_equality: whether the join has an equality key or a ``StateKeyCondition``.
    :raises JoinSpecError: it has neither.
    """
    if not has_equality:
        raise JoinSpecError("a stream-stream join needs at least one equality: give keys=[...] "
                            "or a StateKeyCondition")


def check_outer(expected: ExpectedCleanup) -> None:
    """Refuse an outer or semi join whose preserved side can never be evicted.

    :param expected: the predicted cleanup of the join.
    :raises UnsupportedOuterJoinError: naming each such side, what it misses and the fix.
    """
    sides = {"left": expected.left, "right": expected.right}
    broken = [sides[name] for name in PRESERVED_SIDES.get(expected.how, ())
              if not sides[name].cleanable]
    if not broken:
        return
    problems = []
    for side in broken:
        problems.append(f"the {side.side} side ({side.name}) is never evicted, so its unmatched "
                        f"rows could never be emitted (missing: {'; '.join(side.missing)}). "
                        f"To fix it, {_fix_for(side)}")
    raise UnsupportedOuterJoinError(f"{expected.how} join is not supported as declared: "
                                    + " Also, ".join(problems))


def check_bounded(expected: ExpectedCleanup, allow_unbounded_state: bool) -> None:
    """Refuse a join with a side whose state is never evicted, unless the caller opted in.

    :param expected: the predicted cleanup of the join.
    :param allow_unbounded_state: accept unbounded state (small or short-lived inputs).
    :raises UnboundedStateError: naming each side never evicted and what it misses.
    """
    never = [s for s in expected.sides() if not s.cleanable]
    if not never or allow_unbounded_state:
        return
    details = "; ".join(f"{s.side} side ({s.name}) misses {' and '.join(s.missing)}" for s in never)
    raise UnboundedStateError(
        f"the {expected.how} join's state would grow without bound: {details}. "
        f"Add what is missing, or pass allow_unbounded_state=True if unbounded state is intended "
        f"(small or short-lived inputs)")


def check_join(expected: ExpectedCleanup, *, has_equality: bool,
               allow_unbounded_state: bool) -> None:
    """All guardrails, most specific first.

    :param expected: the predicted cleanup of the join.
    :param has_equality: whether the join has an equality key or a ``StateKeyCondition``.
    :param allow_unbounded_state: accept a side whose state is never evicted.
    :raises JoinSpecError: from the first check that fails (``check_equality``,
        ``check_outer``, ``check_bounded``).
    """
    check_equality(has_equality)
    check_outer(expected)
    check_bounded(expected, allow_unbounded_state)
