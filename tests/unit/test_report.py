"""The attribution report on hand-written output: its numbers against an independent pandas
computation, its files, and its refusals (one ``error:`` line, non-zero exit, no traceback)."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, timezone

import pandas as pd
import pyarrow.parquet as pq
import pytest

from jobs import report
from support import ROOT
from support.outputs import attribution_record, output_table, write_batch_output, write_sink_output

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


def expected_totals(changelog: pd.DataFrame) -> dict:
    """Per model, computed another way: conversions and credited value as sums of ``sign *``
    the measure over the raw changelog; goals over the rows of each goal's latest revision."""
    frame = changelog.assign(signed_credit=changelog["sign"] * changelog["credit"],
                             signed_value=changelog["sign"] * changelog["credited_value"])
    latest = frame.groupby(["goal_event_id", "model"])["revision"].transform("max")
    current = frame[(frame["revision"] == latest) & (frame["sign"] == 1)]
    totals = {}
    for model, rows in frame.groupby("model"):
        now = current[current["model"] == model]
        organic = now[now["impression_id"].isna()]["goal_event_id"].nunique()
        totals[model] = {"model": model, "goals": now["goal_event_id"].nunique(),
                         "attributed_goals": now["goal_event_id"].nunique() - organic,
                         "organic_goals": organic,
                         "conversions": rows["signed_credit"].sum(),
                         "credited_value": rows["signed_value"].sum(min_count=1)}
    return totals


def report_tables(out) -> tuple[pd.DataFrame, dict]:
    """The daily table and the totals per model (by model) a report wrote into ``out``."""
    daily = pq.read_table(out / "daily.parquet").to_pandas()
    totals = pq.read_table(out / "totals.parquet").to_pandas()
    return daily, {r["model"]: r for r in totals.to_dict("records")}


def flat(totals: dict) -> dict:
    """Totals by model as one flat mapping, as ``pytest.approx`` compares them."""
    return {(model, name): value for model, row in totals.items() for name, value in row.items()
            if name != "model"}


@pytest.fixture
def changelog_output(tmp_path):
    write_sink_output(tmp_path / "attributions", BATCHES, compact_interval=2)
    return tmp_path / "attributions"


def test_the_report_equals_an_independent_computation(changelog_output, tmp_path, capsys):
    assert report.main(["--attributions", str(changelog_output), "--out",
                        str(tmp_path / "report")]) == 0
    daily = pq.read_table(tmp_path / "report" / "daily.parquet").to_pandas()
    assert set(daily.pop("day_status")) == {"unknown"}  # Parquet output publishes no frontier
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
    printed = capsys.readouterr().out
    assert "rows: 19 committed, 11 after folding the changelog, 11 selected\n" in printed
    assert "as of: not known: Parquet output publishes no watermark" in printed


def test_the_totals_equal_an_independent_computation(changelog_output, tmp_path, capsys):
    assert report.main(["--attributions", str(changelog_output), "--out",
                        str(tmp_path / "report")]) == 0
    _, totals = report_tables(tmp_path / "report")
    expected = expected_totals(pd.DataFrame([r for batch in BATCHES for r in batch]))
    assert flat(totals) == pytest.approx(flat(expected), nan_ok=True)
    # g1 credits spring and summer under linear: one goal, not one per campaign.
    assert totals["linear"]["goals"] == 5 and totals["linear"]["organic_goals"] == 1
    assert totals["last_touch"]["credited_value"] == 47.0
    assert ("totals linear: 5 goals (4 attributed, 1 organic), 4.00 credited conversions, "
            "credited value 47.00") in capsys.readouterr().out
    assert "<h2>Totals per model</h2>" in (tmp_path / "report" / "report.html").read_text()


@pytest.mark.parametrize("first, last, models", [
    ("1970-01-02", None, None),
    (None, "1970-01-01", "linear"),
    ("1970-01-01", "1970-01-01", "last_touch,linear"),
    (None, None, "last_touch"),
])
def test_the_filters_select_what_they_say(changelog_output, tmp_path, first, last, models):
    options = [("--from", first), ("--to", last), ("--models", models)]
    assert report.main(["--attributions", str(changelog_output), "--out",
                        str(tmp_path / "report")]
                       + [a for option, value in options if value for a in (option, value)]) == 0
    daily, totals = report_tables(tmp_path / "report")
    changelog = pd.DataFrame([r for batch in BATCHES for r in batch])
    days = pd.Series([ts.date() for ts in changelog["goal_ts"]])
    keep = pd.Series(True, index=changelog.index)
    if first:
        keep &= days >= pd.Timestamp(first).date()
    if last:
        keep &= days <= pd.Timestamp(last).date()
    if models:
        keep &= changelog["model"].isin(models.split(","))
    selected = changelog[keep].reset_index(drop=True)
    assert 0 < len(selected) < len(changelog)
    key = ["model", "campaign", "day"]
    pd.testing.assert_frame_equal(
        daily.drop(columns="day_status").sort_values(key).reset_index(drop=True),
        expected_daily(selected)[list(daily.columns.drop("day_status"))]
        .sort_values(key).reset_index(drop=True), check_dtype=False)
    assert flat(totals) == pytest.approx(flat(expected_totals(selected)), nan_ok=True)


def test_campaigns_are_ranked_by_conversions(changelog_output, tmp_path):
    from jobs.report_tables import campaign_rank

    assert report.main(["--attributions", str(changelog_output), "--out",
                        str(tmp_path / "report")]) == 0
    totals = pd.read_csv(tmp_path / "report" / "campaigns.csv", keep_default_na=False)
    # Per model, most conversions first; linear's tie (1.5) goes to the higher value (summer).
    assert totals[totals["model"] == "linear"]["campaign"].tolist() == [
        "summer", "spring", "(no campaign)", "(organic)"]
    assert totals[totals["model"] == "last_touch"]["campaign"].tolist() == [
        "spring", "summer", "(no campaign)", "(organic)"]
    # The chart's bars: over both models, spring 3.5, summer 2.5, (no campaign) 2.
    credited = totals[totals["campaign"] != "(organic)"]
    assert campaign_rank(credited) == ["spring", "summer", "(no campaign)"]


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
    assert set(daily.pop("day_status")) == {"unknown"}
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
    assert all(s in text for s in ("_spark_metadata", "Delta", "report.html", "daily.csv",
                                   "totals.csv", "examples:", "make report", "--attributions",
                                   "--from", "--to", "--models", "final_through", "provisional",
                                   "(organic)"))


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("empty", "holds no committed Spark output"),
    ("events", "holds no committed Spark output"),
    ("foreign", "is not attribution output: it lacks the columns"),
    ("no rows yet", "holds attribution output without any committed row yet"),
    ("out is a file", "cannot write the report to --out"),
    ("out is the output", "--out must not be the --attributions directory"),
    ("--from 2024-02-30", "argument --from: '2024-02-30' is not a date; expected YYYY-MM-DD"),
    ("--to yesterday", "argument --to: 'yesterday' is not a date"),
    ("--from 1970-01-02 --to 1970-01-01", "--from 1970-01-02 is after --to 1970-01-01"),
    ("--models lastclick", "unknown attribution model 'lastclick'; choose from last_touch, "),
    ("--models first_touch", "has no rows of model first_touch; it has last_touch"),
    ("--from 2024-03-01", "no goals dated 2024-03-01 to any day in"),
    ("--table-version 3", "is not a Delta table: it has no versions to choose from"),
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
    options = case.split() if case.startswith("--") else []
    if options:
        write_batch_output(attributions, [attribution_record("g1", 0)])
    result = subprocess.run(
        [sys.executable, "-m", "jobs.report", "--attributions", str(attributions), "--out",
         str(out), *options], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    # Options argparse refuses are prefixed with the program's name, as in every command.
    assert len(lines) == 1 and lines[0].removeprefix("attribution-report: ").startswith(
        "error: ") and message in lines[0], result.stderr


# -- Delta output: the changelog, the current table, and the frontier of the version read ------

LATENESS = 30 * 60_000
DAY1 = 24 * HOUR


def write_delta(path, records: list[dict], batch_id: int | None, watermark: int | None) -> None:
    """Commit ``records`` to the Delta table at ``path`` as the job's writer commits a
    micro-batch: partitioned by goal date, its frontier in the commit's ``userMetadata``
    (none when ``batch_id`` is None)."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from attribution.finality import frontier_metadata

    table = output_table(records)
    days = [r["goal_ts"].astimezone(timezone.utc).date() for r in records]
    table = table.append_column("goal_date", pa.array(days, pa.date32()))
    metadata = (None if batch_id is None else CommitProperties(custom_metadata={
        "userMetadata": frontier_metadata(batch_id, watermark, LATENESS)}))
    write_deltalake(str(path), table, mode="append", partition_by=["goal_date"],
                    commit_properties=metadata)


@pytest.fixture
def delta_changelog(tmp_path):
    """``BATCHES`` as a Delta changelog of two versions: 0 holds the goals of 1970-01-01 with a
    frontier past that day's end, 1 those of 1970-01-02 with a frontier inside that day."""
    path = tmp_path / "changelog"
    write_delta(path, BATCHES[0] + BATCHES[1], 0, DAY1 + HOUR)
    write_delta(path, BATCHES[2], 1, DAY1 + HOUR + LATENESS)
    return path


def run_report(path, out, *options) -> pd.DataFrame:
    """Run the report on ``path`` into ``out``; its daily table."""
    assert report.main(["--attributions", str(path), "--out", str(out), *options]) == 0
    return pq.read_table(out / "daily.parquet").to_pandas()


def test_the_report_marks_days_final_or_provisional_from_the_frontier(delta_changelog, tmp_path,
                                                                       capsys):
    daily = run_report(delta_changelog, tmp_path / "latest")
    day0, day1 = date(1970, 1, 1), date(1970, 1, 2)
    assert dict(zip(daily["day"], daily["day_status"])) == {day0: "final", day1: "provisional"}
    printed = capsys.readouterr().out
    assert f"source: {delta_changelog} (Delta table, version 1)" in printed
    assert ("as of: watermark 1970-01-02 01:30:00 UTC (micro-batch 1, version 1); final "
            "through 1970-01-02 01:00:00 UTC") in printed
    assert "days: final 1 (1970-01-01); provisional 1 (1970-01-02)" in printed
    # The same numbers as from the Parquet changelog of the same rows.
    changelog = pd.DataFrame([r for batch in BATCHES for r in batch])
    key = ["model", "campaign", "day"]
    pd.testing.assert_frame_equal(
        daily.drop(columns="day_status").sort_values(key).reset_index(drop=True),
        expected_daily(changelog)[list(daily.columns.drop("day_status"))]
        .sort_values(key).reset_index(drop=True), check_dtype=False)
    # As of version 0, day 0 was final already, with the numbers it still has.
    earlier = run_report(delta_changelog, tmp_path / "v0", "--table-version", "0")
    assert set(earlier["day"]) == {day0} and set(earlier["day_status"]) == {"final"}
    pd.testing.assert_frame_equal(earlier, daily[daily["day"] == day0].reset_index(drop=True))
    assert "(Delta table, version 0)" in capsys.readouterr().out


def test_the_report_reads_a_current_table(delta_changelog, tmp_path, capsys):
    from attribution.spark.changelog import fold_changelog
    from attribution.spark.output import read_attributions

    current = tmp_path / "current"
    folded = fold_changelog(read_attributions(delta_changelog))
    records = folded.drop(columns="goal_date").to_dict("records")
    for record in records:  # back to the shape attribution_record builds
        record["impression_id"] = None if pd.isna(record["impression_id"]) else int(
            record["impression_id"])
        record["goal_ts"] = record["goal_ts"].to_pydatetime()
        record["impression_ts"] = (None if pd.isna(record["impression_ts"])
                                   else record["impression_ts"].to_pydatetime())
        record["trail"] = list(record["trail"])
    write_delta(current, records, 1, DAY1 + HOUR + LATENESS)
    from_current = run_report(current, tmp_path / "current-report")
    from_changelog = run_report(delta_changelog, tmp_path / "changelog-report")
    pd.testing.assert_frame_equal(from_current, from_changelog)
    assert "rows: 11 committed, 11 after folding the changelog" in capsys.readouterr().out


def test_a_delta_table_without_a_frontier_says_so(tmp_path, capsys):
    write_delta(tmp_path / "t", BATCHES[2], None, None)
    daily = run_report(tmp_path / "t", tmp_path / "report")
    assert set(daily["day_status"]) == {"unknown"}
    assert "no commit of the table published a completeness frontier" in capsys.readouterr().out


@pytest.mark.parametrize("final_through, published, status", [
    (DAY1 - 1, True, "final"),            # the day's last millisecond
    (DAY1 - 2, True, "provisional"),
    (None, True, "provisional"),          # no watermark yet: nothing final
    (DAY1 + 5 * DAY1, False, "unknown"),  # no frontier published
])
def test_day_status(final_through, published, status):
    from jobs.report_tables import day_status

    assert day_status(date(1970, 1, 1), final_through, published) == status
