"""The changelog of an attribution table (semantics section 8): when a goal's rows for a model
change, the rows emitted before are retracted and the new ones emitted as the next revision.

A micro-batch ``k`` has two watermarks: ``W[k-1]``, in force when its records arrived, and
``W[k]``, at which its goals fire. A row's ``emit_timing`` says where its goal stood:

* ``EARLY``: ``g.ts > W[k]`` (only with early results);
* ``ON_TIME``: ``W[k-1] < g.ts <= W[k]`` (before the first micro-batch ``W`` is minus infinity);
* ``LATE``: ``g.ts <= W[k-1]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .rows import Attribution

EARLY, ON_TIME, LATE = "EARLY", "ON_TIME", "LATE"


def emit_timing(goal_ts: int, previous: Optional[int], watermark: int) -> str:
    """The ``emit_timing`` of a goal's rows emitted at ``watermark`` (``W[k]``).

    :param goal_ts: the goal's event time.
    :param previous: ``W[k-1]``, or None before the first watermark.
    :param watermark: ``W[k]``.
    """
    if goal_ts > watermark:
        return EARLY
    if previous is None or goal_ts > previous:
        return ON_TIME
    return LATE


@dataclass(frozen=True, slots=True)
class Emitted:
    """What the changelog last emitted for one goal and model: its revision and rows (with
    their sign, revision and timing as emitted)."""

    revision: int
    rows: tuple[Attribution, ...]

    @property
    def early(self) -> bool:
        return bool(self.rows) and self.rows[0].emit_timing == EARLY


def _content(row: Attribution) -> Attribution:
    """A row without its changelog columns, for comparing one computation with another."""
    return row._replace(sign=1, revision=0, emit_timing=ON_TIME)


def revise(before: Optional[Emitted], rows: Sequence[Attribution],
           timing: str) -> tuple[list[Attribution], Emitted]:
    """The changelog entries for one goal and model whose rows are now ``rows``.

    :param before: what was emitted for it before, or None.
    :param rows: its rows now, as computed over every accepted record (changelog columns unset).
    :param timing: ``emit_timing`` of this micro-batch for the goal.
    :returns: the entries to emit (retractions of ``before``'s rows with ``sign = -1`` and
        their own revision, then the new rows with the next revision), possibly none, and what
        is then emitted for the goal and model.

    Nothing is emitted when the rows are unchanged, except that rows emitted ``EARLY`` are
    always revised once the watermark reaches the goal, so that every goal has rows emitted at
    or after its watermark.
    """
    if before is not None:
        unchanged = [_content(r) for r in before.rows] == [_content(r) for r in rows]
        if unchanged and not (before.early and timing != EARLY):
            return [], before
        revision = before.revision + 1
        retractions = [r._replace(sign=-1) for r in before.rows]
    else:
        revision, retractions = 0, []
    emitted = tuple(r._replace(sign=1, revision=revision, emit_timing=timing) for r in rows)
    return retractions + list(emitted), Emitted(revision, emitted)


def retract(before: Emitted) -> tuple[list[Attribution], Emitted]:
    """The changelog entries for a goal and model whose goal is gone (rule 1: a smaller copy of
    its record that is no goal took its place).

    :param before: what was emitted for it before.
    :returns: the retractions of ``before``'s rows (none if it has none), and what is then
        emitted: no rows, under ``before``'s revision, so that rows emitted for the goal again
        (a still smaller copy that is a goal) carry the next revision.
    """
    return [r._replace(sign=-1) for r in before.rows], Emitted(before.revision, ())
