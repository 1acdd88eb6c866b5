"""The attribution report on hand-written output: its numbers against an independent pandas
computation, its files, and its refusals (one ``error:`` line, non-zero exit, no traceback)."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from jobs import report
from support import ROOT, attribution_record, write_batch_output, write_sink_output

HOUR = 3_600_000
DAY0_LATE, DAY1_EARLY = 23 * HOUR + 30 * 60_000, 24 * HOUR + 30 * 60_000  # either side of 0:00 UTC


def row(goal, ts, impression, model, credit, campaign, value, sign=1, revision=0,
        timing="ON_TIME"):
    return attribution_record(
        goal, ts, impression, model=model, credit=credit, impression_campaign=campaign,
        goal_value=value, credited_value=None if value is None else credit * value, sign=sign,
        revision=revision, emit_timing=timing)


# Three micro-batches of a changelog with two models, campaigns, organic goals, values, late
# revisions and an early row.
BATCHES = [
    [row("g1", DAY0_LATE, None, "last_touch", 0.0, None, 10.0),
     row("g1", DAY0_LATE, 1, "linear", 1.0, "spring", 10.0),
     row("g5", DAY0_LATE - HOUR, 5, "last_touch", 1.0, "spring", 7.0, timing="EARLY"),
     row("g5", DAY0_LATE - HOUR, 5, "linear", 1.0, "spring", 7.0, timing="EARLY")],
    [row("g1", DAY0_LATE, None, "last_touch", 0.0, None, 10.0, sign=-1, timing="LATE"),
     row("g1", DAY0_LATE, 1, "last_touch", 1.0, "spring", 10.0, revision=1, timing="LATE"),
     row("g1", DAY0_LATE, 1, "linear", 1.0, "spring", 10.0, sign=-1, timing="LATE"),
     row("g1", DAY0_LATE, 1, "linear", 0.5, "spring", 10.0, revision=1, timing="LATE"),
     row("g1", DAY0_LATE, 2, "linear", 0.5, "summer", 10.0, revision=1, timing="LATE"),
     row("g5", DAY0_LATE - HOUR, 5, "last_touch", 1.0, "spring", 7.0, sign=-1, timing="EARLY"),
     row("g5", DAY0_LATE - HOUR, 5, "last_touch", 1.0, "spring", 7.0, revision=1),
     row("g5", DAY0_LATE - HOUR, 5, "linear", 1.0, "spring", 7.0, sign=-1, timing="EARLY"),
     row("g5", DAY0_LATE - HOUR, 5, "linear", 1.0, "spring", 7.0, revision=1)],
    [row("g2", DAY1_EARLY, 3, model, 1.0, "summer", 30.0) for model in ("last_touch", "linear")]
    + [row("g3", DAY1_EARLY, None, model, 0.0, None, 5.0) for model in ("last_touch", "linear")]
    + [row("g4", DAY1_EARLY, 4, model, 1.0, None, None) for model in ("last_touch", "linear")],
]


def expected_daily(changelog: pd.DataFrame) -> pd.DataFrame:
    """The report's table computed another way: sums of ``sign * measure`` over the raw
    changelog, goal counts over the rows of each goal's latest revision."""
    frame = changelog.copy()
    frame["campaign"] = [("(organic)" if pd.isna(i) else "(no campaign)" if c is None else c)
                         for i, c in zip(frame["impression_id"], frame["impression_campaign"])]
    frame["day"] = [ts.date() for ts in frame["goal_ts"]]
    frame["signed_credit"] = frame["sign"] * frame["credit"]
    frame["signed_value"] = frame["sign"] * frame["credited_value"]
    latest = frame.groupby(["goal_event_id", "model"])["revision"].transform("max")
    current = frame[(frame["revision"] == latest) & (frame["sign"] == 1)]
    keys = ["model", "campaign", "day"]
    sums = frame.groupby(keys)[["signed_credit", "signed_value"]].sum(min_count=1)
    out = []
    for (model, campaign, day), group in current.groupby(keys):
        goals = group["goal_event_id"].nunique()
        organic = campaign == "(organic)"
        out.append({"model": model, "campaign": campaign, "day": day,
                    "conversions": sums.loc[(model, campaign, day), "signed_credit"],
                    "credited_value": sums.loc[(model, campaign, day), "signed_value"],
                    "attributed_goals": 0 if organic else goals,
                    "organic_goals": goals if organic else 0})
    retracted_only = sums.drop(index=[tuple(r[k] for k in keys) for r in out])
    assert (retracted_only["signed_credit"] == 0).all()  # what the fold removed cancels out
    return pd.DataFrame(out)


@pytest.fixture
def changelog_output(tmp_path):
    write_sink_output(tmp_path / "attributions", BATCHES, compact_interval=2)
    return tmp_path / "attributions"


def test_the_report_equals_an_independent_computation(changelog_output, tmp_path, capsys):
    assert report.main(["--attributions", str(changelog_output), "--out",
                        str(tmp_path / "report")]) == 0
    daily = pq.read_table(tmp_path / "report" / "daily.parquet").to_pandas()
    changelog = pd.DataFrame([r for batch in BATCHES for r in batch])
    expected = expected_daily(changelog)
    key = ["model", "campaign", "day"]
    pd.testing.assert_frame_equal(
        daily.sort_values(key).reset_index(drop=True),
        expected[daily.columns].sort_values(key).reset_index(drop=True),
        check_dtype=False)
    # Spot checks of the fixture's story, so that the comparison above is not vacuous.
    by = daily.set_index(key)
    day0, day1 = (pd.Timestamp(ts, unit="ms").date() for ts in (DAY0_LATE, DAY1_EARLY))
    assert by.loc[("linear", "summer", day0), "conversions"] == 0.5
    assert by.loc[("last_touch", "spring", day0), "credited_value"] == 17.0
    assert by.loc[("last_touch", "(organic)", day1), "organic_goals"] == 1
    assert pd.isna(by.loc[("linear", "(no campaign)", day1), "credited_value"])
    assert ("last_touch", "(organic)", day0) not in by.index  # g1's organic row was retracted
    csv = pd.read_csv(tmp_path / "report" / "daily.csv")
    assert csv["conversions"].tolist() == daily["conversions"].tolist()
    totals = pd.read_csv(tmp_path / "report" / "campaigns.csv").set_index(["model", "campaign"])
    assert totals.loc[("linear", "spring"), "conversions"] == 1.5
    assert totals.loc[("linear", "spring"), "attributed_goals"] == 2
    assert "19 committed rows, 11 after folding the changelog; 5 goals" in capsys.readouterr().out


def test_the_report_writes_charts_and_a_self_contained_page(changelog_output, tmp_path):
    out = tmp_path / "report"
    assert report.main(["--attributions", str(changelog_output), "--out", str(out)]) == 0
    for chart in ("conversions_by_campaign.png", "daily_credited_value.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 2
    assert page.count("src=") == 2 and "href=" not in page  # nothing to fetch: works offline
    assert all(c in page for c in ("spring", "summer", "(organic)", "(no campaign)"))


def test_the_report_reads_output_without_campaigns_or_values(tmp_path):
    rows = [attribution_record("g1", DAY0_LATE, 1), attribution_record("g2", DAY0_LATE)]
    write_batch_output(tmp_path / "old", rows)
    assert report.main(["--attributions", str(tmp_path / "old"), "--out",
                        str(tmp_path / "report")]) == 0
    daily = pd.read_csv(tmp_path / "report" / "daily.csv")
    assert daily.to_dict("records") == [
        {"model": "last_touch", "campaign": "(no campaign)", "day": "1970-01-01",
         "conversions": 1.0, "credited_value": pytest.approx(float("nan"), nan_ok=True),
         "attributed_goals": 1, "organic_goals": 0},
        {"model": "last_touch", "campaign": "(organic)", "day": "1970-01-01",
         "conversions": 0.0, "credited_value": pytest.approx(float("nan"), nan_ok=True),
         "attributed_goals": 0, "organic_goals": 1}]
    assert (tmp_path / "report" / "daily_credited_value.png").stat().st_size > 0


def test_help_says_what_it_reads_and_writes(capsys):
    with pytest.raises(SystemExit) as exit_:
        report.main(["--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0
    assert all(s in text for s in ("_spark_metadata", "report.html", "daily.csv", "example:",
                                   "--attributions", "(organic)"))


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("empty", "holds no committed Spark output"),
    ("events", "holds no committed Spark output"),
    ("foreign", "is not attribution output: it lacks the columns"),
    ("no rows yet", "holds attribution output without any committed row yet"),
    ("out is a file", "cannot write the report to --out"),
    ("out is the output", "--out must not be the --attributions directory"),
])
def test_refusals_are_one_error_line(tmp_path, case, message):
    attributions, out = tmp_path / "attributions", tmp_path / "report"
    if case == "empty":
        attributions.mkdir()
    elif case == "events":
        attributions.mkdir()
        (attributions / "part-0.json").write_text('{"event_id": "e1"}\n')
    elif case == "foreign":
        write_batch_output(attributions, [attribution_record("g1", 0)])
        part = next(attributions.glob("part-*"))
        pq.write_table(pq.read_table(part).drop_columns(["goal_event_id"]), part)
    elif case == "no rows yet":
        (attributions / "_spark_metadata").mkdir(parents=True)
    elif case == "out is a file":
        write_batch_output(attributions, [attribution_record("g1", 0)])
        out.write_text("")
    elif case == "out is the output":
        write_batch_output(attributions, [attribution_record("g1", 0)])
        out = attributions
    result = subprocess.run(
        [sys.executable, "-m", "jobs.report", "--attributions", str(attributions), "--out",
         str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
