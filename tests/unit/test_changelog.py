"""Folding a hand-written attribution changelog (spec section 8) into the current table."""
from __future__ import annotations

import pandas as pd
import pytest

from attribution.spark.changelog import InconsistentChangelog, fold_changelog

COLUMNS = ["goal_event_id", "model", "impression_event_id", "credit", "sign", "revision",
           "emit_timing"]


def changelog(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=COLUMNS)


# Micro-batch by micro-batch:
# g1 (last_touch) fires organic; a late impression i1 makes it attributed (revision 1), a later
# late impression i2 moves its credit (revision 2). g1 under first_touch keeps i1 throughout.
# g2 (linear) is emitted early with i3 and i4; when the watermark passes it, it is revised with
# the same rows, ON_TIME. g3 (linear) shrinks from two impressions to one.
CHANGELOG = changelog(
    ("g1", "last_touch", None, 0.0, 1, 0, "ON_TIME"),
    ("g1", "first_touch", None, 0.0, 1, 0, "ON_TIME"),
    ("g2", "linear", "i3", 0.5, 1, 0, "EARLY"),
    ("g2", "linear", "i4", 0.5, 1, 0, "EARLY"),
    ("g3", "linear", "i5", 0.5, 1, 0, "ON_TIME"),
    ("g3", "linear", "i6", 0.5, 1, 0, "ON_TIME"),
    # late impression i1
    ("g1", "last_touch", None, 0.0, -1, 0, "LATE"),
    ("g1", "last_touch", "i1", 1.0, 1, 1, "LATE"),
    ("g1", "first_touch", None, 0.0, -1, 0, "LATE"),
    ("g1", "first_touch", "i1", 1.0, 1, 1, "LATE"),
    # the watermark passes g2 (revised, unchanged); a late goal before g3 consumes i6
    ("g2", "linear", "i3", 0.5, -1, 0, "ON_TIME"),
    ("g2", "linear", "i4", 0.5, -1, 0, "ON_TIME"),
    ("g2", "linear", "i3", 0.5, 1, 1, "ON_TIME"),
    ("g2", "linear", "i4", 0.5, 1, 1, "ON_TIME"),
    ("g3", "linear", "i5", 0.5, -1, 0, "LATE"),
    ("g3", "linear", "i6", 0.5, -1, 0, "LATE"),
    ("g3", "linear", "i5", 1.0, 1, 1, "LATE"),
    # late impression i2, later than i1
    ("g1", "last_touch", "i1", 1.0, -1, 1, "LATE"),
    ("g1", "last_touch", "i2", 1.0, 1, 2, "LATE"),
)

TABLE = {
    ("g1", "last_touch", "i2", 1.0, 1, 2, "LATE"),
    ("g1", "first_touch", "i1", 1.0, 1, 1, "LATE"),
    ("g2", "linear", "i3", 0.5, 1, 1, "ON_TIME"),
    ("g2", "linear", "i4", 0.5, 1, 1, "ON_TIME"),
    ("g3", "linear", "i5", 1.0, 1, 1, "LATE"),
}


def as_set(frame: pd.DataFrame) -> set[tuple]:
    return set(frame[COLUMNS].itertuples(index=False, name=None))


def test_the_fold_leaves_the_latest_revision_of_every_goal_and_model():
    folded = fold_changelog(CHANGELOG)
    assert as_set(folded) == TABLE and len(folded) == len(TABLE)
    latest = CHANGELOG.groupby(["goal_event_id", "model"])["revision"].transform("max")
    assert as_set(CHANGELOG[(CHANGELOG["revision"] == latest) & (CHANGELOG["sign"] == 1)]) == TABLE
    assert folded.index.tolist() == list(range(len(folded)))


def test_the_fold_does_not_depend_on_row_order_and_is_idempotent():
    shuffled = CHANGELOG.sample(frac=1.0, random_state=3)
    assert as_set(fold_changelog(shuffled)) == TABLE
    assert as_set(fold_changelog(fold_changelog(CHANGELOG))) == TABLE


def test_a_sum_by_sign_over_the_changelog_equals_the_sum_over_the_folded_table():
    signed = (CHANGELOG["sign"] * CHANGELOG["credit"]).groupby(CHANGELOG["model"]).sum()
    folded = fold_changelog(CHANGELOG).groupby("model")["credit"].sum()
    assert signed.to_dict() == pytest.approx(folded.to_dict())
    assert folded.to_dict() == {"first_touch": 1.0, "last_touch": 1.0, "linear": 2.0}


def test_the_merge_rule_of_the_docs_gives_the_folded_table():
    """Per row key: the highest revision, its retraction over the row; a retraction deletes."""
    keyed = CHANGELOG.fillna({"impression_event_id": "(organic)"})
    last = (keyed.sort_values(["revision", "sign"], ascending=[True, False])
            .groupby(["goal_event_id", "model", "impression_event_id"]).tail(1))
    merged = last[last["sign"] == 1].replace({"impression_event_id": {"(organic)": None}})
    assert as_set(merged) == TABLE


def test_output_without_sign_or_revision_folds_to_itself():
    plain = CHANGELOG[CHANGELOG["revision"] == 0].drop(columns=["sign", "revision"])
    plain = plain[~plain.duplicated(["goal_event_id", "model", "impression_event_id"])]
    folded = fold_changelog(plain)
    assert folded.drop(columns=["sign", "revision"]).equals(plain.reset_index(drop=True))
    assert set(folded["sign"]) == {1} and set(folded["revision"]) == {0}
    organic = plain[plain["impression_event_id"].isna()]  # a key column of nulls only
    assert fold_changelog(organic)["goal_event_id"].tolist() == ["g1", "g1"]
    assert fold_changelog(plain.iloc[:0]).empty


@pytest.mark.parametrize("rows, message", [
    ([("g1", "last_touch", "i1", 1.0, -1, 0, "LATE")],
     "goal g1, model last_touch, impression i1, revision 0 is retracted more often than emitted"),
    ([("g1", "last_touch", "i1", 1.0, 1, 0, "ON_TIME"), ("g1", "last_touch", "i1", 1.0, 1, 0,
                                                         "ON_TIME")],
     "goal g1, model last_touch, impression i1, revision 0 is emitted 2 times without a "
     "retraction"),
    ([("g1", "last_touch", None, 0.0, 1, 0, "ON_TIME"), ("g1", "last_touch", "i1", 1.0, 1, 1,
                                                         "LATE")],
     "goal g1, model last_touch has rows of several revisions that no retraction cancels"),
])
def test_an_inconsistent_changelog_is_refused(rows, message):
    with pytest.raises(InconsistentChangelog, match=message):
        fold_changelog(changelog(*rows))
