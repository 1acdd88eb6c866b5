"""Folding the attribution changelog into the current attribution table (spec section 8)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .output import ABSENT_COLUMN_DEFAULTS

if TYPE_CHECKING:
    import pandas as pd

# A goal is identified by its user and its event_id (event ids are unique within a user only,
# spec rule 1); a row of the table by its goal, its model and the impression it credits (null
# for an organic row). A retraction repeats the row it cancels, revision included.
GOAL_KEY = ("user_id", "goal_event_id", "model")
ROW_KEY = (*GOAL_KEY, "impression_event_id")


class InconsistentChangelog(ValueError):
    """Retractions and rows that do not pair up; the message names the goal and model."""


def fold_changelog(rows: "pd.DataFrame") -> "pd.DataFrame":
    """Fold a changelog of attribution rows into the current table.

    A retraction (``sign = -1``) cancels the ``+1`` row it repeats: the same ``ROW_KEY`` and
    ``revision``. What is left, only ``+1`` rows, is, per ``(goal_event_id, model)``, the rows of
    its latest revision. Output written without ``sign``/``revision`` counts as ``+1``/``0``
    everywhere, so folding it changes nothing.

    Read the changelog with ``attribution.spark.output.read_attributions`` (or
    ``spark.read.parquet(dir)``), never with a plain directory listing such as
    ``pandas.read_parquet(dir)``: after a crash the directory holds part files of micro-batches
    that never committed, whose rows are written again on restart, so a listing double-counts
    rows (or fails on a 0-byte file). Only the sink's ``_spark_metadata`` log says which files
    are part of the output.

    Downstream, instead of folding everything again: MERGE each micro-batch's rows (or several
    batches' rows) into a table keyed by ``ROW_KEY`` (``--current-table`` does it),
    taking per key the row of the highest ``revision``, its retraction rather than the row if
    both are there: delete the key if it is a retraction, upsert it otherwise. Additive
    measures need no fold at all: ``SUM(sign * credit)`` or ``SUM(sign * credited_value)`` over
    the raw changelog, grouped by anything, equals the same sum over the folded table
    (docs/reading-output.md has both in SQL).

    :param rows: a DataFrame with at least ``ROW_KEY``'s columns (``sign``, ``revision``
        optional; without ``user_id`` the rows are taken as one user's).
    :returns: the folded rows, in input order, with a fresh index.
    :raises InconsistentChangelog: retractions and rows do not pair up: a retraction of a row
        never emitted, a row emitted twice without a retraction, or rows of two revisions of
        one goal and model left standing.
    """
    frame = rows.copy()
    for column in ("sign", "revision"):
        if column not in frame.columns:
            frame[column] = ABSENT_COLUMN_DEFAULTS[column]
    # A frame without users (rows of one user, cut down by hand) keys by the rest.
    anonymous = "user_id" not in frame.columns
    if anonymous:
        frame["user_id"] = ""
    if frame.empty:
        return rows.assign(**{c: frame[c] for c in ("sign", "revision")}).reset_index(drop=True)
    key = [*ROW_KEY, "revision"]
    # dropna=False: organic rows, with no impression_event_id, are rows like any other.
    net = frame.groupby(key, dropna=False, sort=False)["sign"].transform("sum")
    wrong = ~net.isin((0, 1))
    if wrong.any():
        bad, count = frame[wrong].iloc[0], net[wrong].iloc[0]
        what = ("retracted more often than emitted" if count < 0
                else f"emitted {count} times without a retraction")
        raise InconsistentChangelog(
            f"inconsistent changelog: goal {bad['goal_event_id']}, model {bad['model']}, "
            f"impression {bad['impression_event_id']}, revision {bad['revision']} is {what}")
    standing = frame[(net == 1) & (frame["sign"] > 0)]
    folded = standing.drop_duplicates(key, keep="last").reset_index(drop=True)
    revisions = folded.groupby(list(GOAL_KEY), sort=False)["revision"].nunique()
    stale = revisions[revisions > 1]
    if not stale.empty:
        _, goal, model = stale.index[0]
        raise InconsistentChangelog(f"inconsistent changelog: goal {goal}, model {model} has "
                                    "rows of several revisions that no retraction cancels")
    return folded.drop(columns=["user_id"]) if anonymous else folded
