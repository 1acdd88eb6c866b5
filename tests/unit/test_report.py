"""The attribution report on hand-written output: its numbers against an independent pandas
computation, its files, and its refusals (one ``error:`` line, non-zero exit, no traceback)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import date, timezone
from html.parser import HTMLParser

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
    frame["signed_organic"] = [s * (v if pd.isna(i) else 0.0) if pd.notna(v) else None
                               for s, v, i in zip(frame["sign"], frame["goal_value"],
                                                  frame["impression_id"])]
    latest = frame.groupby(["goal_event_id", "model"])["revision"].transform("max")
    current = frame[(frame["revision"] == latest) & (frame["sign"] == 1)]
    keys = ["model", "campaign", "day"]
    sums = frame.groupby(keys)[["signed_credit", "signed_value", "signed_organic"]].sum(
        min_count=1)
    out = []
    for (model, campaign, day), group in current.groupby(keys):
        goals = group["goal_event_id"].nunique()
        organic = campaign == "(organic)"
        out.append({"model": model, "campaign": campaign, "day": day,
                    "conversions": sums.loc[(model, campaign, day), "signed_credit"],
                    "credited_value": sums.loc[(model, campaign, day), "signed_value"],
                    "organic_value": sums.loc[(model, campaign, day), "signed_organic"],
                    "attributed_goals": 0 if organic else goals,
                    "organic_goals": goals if organic else 0})
    retracted_only = sums.drop(index=[tuple(r[k] for k in keys) for r in out])
    assert (retracted_only["signed_credit"] == 0).all()  # what the fold removed cancels out
    return pd.DataFrame(out)


def expected_totals(changelog: pd.DataFrame) -> dict:
    """Per model, computed another way: conversions and credited value as sums of ``sign *``
    the measure over the raw changelog; goals over the rows of each goal's latest revision."""
    frame = changelog.assign(
        signed_credit=changelog["sign"] * changelog["credit"],
        signed_value=changelog["sign"] * changelog["credited_value"],
        signed_organic=[s * v if pd.isna(i) else 0.0 if pd.notna(v) else None for s, v, i in
                        zip(changelog["sign"], changelog["goal_value"],
                            changelog["impression_id"])])
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
                         "credited_value": rows["signed_value"].sum(min_count=1),
                         "organic_value": rows["signed_organic"].astype(float).sum(min_count=1)}
        worth = totals[model]["credited_value"] + totals[model]["organic_value"]
        totals[model]["credited_share"] = totals[model]["credited_value"] / worth
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
         "attributed_goals": 1, "organic_goals": 0,
         "organic_value": pytest.approx(float("nan"), nan_ok=True)},
        {"model": "last_touch", "campaign": "(organic)", "day": "1970-01-01",
         "conversions": 0.0, "credited_value": pytest.approx(float("nan"), nan_ok=True),
         "attributed_goals": 0, "organic_goals": 1,
         "organic_value": pytest.approx(float("nan"), nan_ok=True)}]
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


def write_delta(path, records: list[dict], batch_id: int | None, watermark: int | None,
                lateness: int = LATENESS) -> None:
    """Commit ``records`` to the Delta table at ``path`` as the job's writer commits a
    micro-batch: partitioned by goal date, its frontier in the commit's ``userMetadata``
    (none when ``batch_id`` is None), under an allowed lateness of ``lateness`` ms."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from attribution.finality import frontier_metadata

    table = output_table(records)
    days = [r["goal_ts"].astimezone(timezone.utc).date() for r in records]
    table = table.append_column("goal_date", pa.array(days, pa.date32()))
    metadata = (None if batch_id is None else CommitProperties(custom_metadata={
        "userMetadata": frontier_metadata(batch_id, watermark, lateness)}))
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


# -- The page and its charts: five models over twenty days, a gap, a spike, a provisional tail ---

MODELS = ("first_touch", "last_touch", "linear", "position_based", "time_decay")
GAP = (6, 7, 8)   # days without any goal
SPIKE = 3         # the day whose goal is worth 100 times the others'
DAYS = 20


def long_records() -> list[dict]:
    """Per day but ``GAP``, under every model of ``MODELS``: an attributed goal worth 10 + day
    (1000 on day ``SPIKE``) and an organic goal worth 4."""
    records = []
    for day in (d for d in range(DAYS) if d not in GAP):
        ts, value = day * DAY1 + 10 * HOUR, 1000.0 if day == SPIKE else 10.0 + day
        for model in MODELS:
            records += [row(f"a{day}", ts, day + 1, model, 1.0, "spring", value),
                        row(f"o{day}", ts + HOUR, None, model, 0.0, None, 4.0)]
    return records


@pytest.fixture
def long_output(tmp_path):
    """``long_records`` as a Delta table whose frontier, a watermark at 12:00 on day 18 less
    an allowed lateness of one day, is inside day 17: days 0 to 16 (1970-01-01 to 01-17) are
    final, days 17 to 19 (1970-01-18 to 01-20) provisional."""
    path = tmp_path / "long"
    write_delta(path, long_records(), 0, 18 * DAY1 + 12 * HOUR, lateness=DAY1)
    return path


class _PageTables(HTMLParser):
    """The tables of an HTML page: per table, its rows as (the row's class, its cells' text)."""

    def __init__(self, page: str):
        super().__init__()
        self.tables: list[list[tuple[str, list[str]]]] = []
        self.names: list[str] = []
        self._cell = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
            self.names.append(dict(attrs).get("id"))
        elif tag == "tr":
            self.tables[-1].append((dict(attrs).get("class") or "", []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def table(self, name: str) -> list[tuple[str, list[str]]]:
        """The table whose ``id`` is ``name``."""
        return self.tables[self.names.index(name)]


def report_page(path, out, *options) -> str:
    assert report.main(["--attributions", str(path), "--out", str(out), *options]) == 0
    return (out / "report.html").read_text()


def day_rows(page: str) -> dict:
    """The page's table per day: day -> (the row's class, its cells)."""
    table = _PageTables(page).table("days")
    return {cells[0]: (css, cells) for css, cells in table[2:]}


def test_the_page_states_the_finality_rule_and_names_final_and_provisional_days(
        long_output, tmp_path):
    page = report_page(long_output, tmp_path / "report")
    assert ("A day is final when every goal it can hold is at or before the completeness "
            "frontier final_through, the watermark minus the allowed lateness: its numbers can "
            "no longer change.") in page
    assert ("Here final_through is 1970-01-18 12:00:00 UTC: the watermark 1970-01-19 12:00:00 "
            "UTC (micro-batch 0, version 0) minus an allowed lateness of 1 day.") in page
    assert "Final days: every day through 1970-01-17; 14 with goals, 1970-01-01 to 1970-01-17." \
        in page
    assert ("Provisional days: every day from 1970-01-18 on; 3 with goals: 1970-01-18, "
            "1970-01-19, 1970-01-20.") in page
    rows = day_rows(page)
    provisional = {"1970-01-18", "1970-01-19", "1970-01-20"}
    assert len(rows) == DAYS - len(GAP)
    for day, (css, cells) in rows.items():
        status = "provisional" if day in provisional else "final"
        assert (cells[1], css) == (status, "provisional" if day in provisional else ""), day
    # Parquet output: the rule is stated, and why no day is known to be final.
    write_batch_output(tmp_path / "parquet", long_records())
    page = report_page(tmp_path / "parquet", tmp_path / "parquet-report")
    assert "A day is final when every goal it can hold is at or before" in page
    assert "This is Parquet output, which publishes no frontier" in page
    assert {cells[1] for _, cells in day_rows(page).values()} == {"unknown"}


def test_the_page_shows_organic_value_beside_credited_value(long_output, tmp_path):
    page = report_page(long_output, tmp_path / "report")
    totals = _PageTables(page).table("totals")
    heading = totals[0][1]
    assert heading[heading.index("credited value") + 1] == "organic value"
    attributed = sum(1000.0 if d == SPIKE else 10.0 + d for d in range(DAYS) if d not in GAP)
    organic = 4.0 * (DAYS - len(GAP))
    by_model = {cells[0]: dict(zip(heading, cells)) for _, cells in totals[1:]}
    assert set(by_model) == set(MODELS)
    for cells in by_model.values():
        assert cells["credited value"] == f"{attributed:,.2f}"
        assert cells["organic value"] == f"{organic:,.2f}"
        assert cells["credited share"] == f"{attributed / (attributed + organic):.1%}"
    # Per day, per model: day 1 (1970-01-02) credits 11 and has 4 organic.
    _, cells = day_rows(page)["1970-01-02"]
    assert cells[3:] == ["11.00", "4.00"] * len(MODELS)
    saved = pd.read_csv(tmp_path / "report" / "totals.csv").set_index("model")
    assert saved["organic_value"].tolist() == [organic] * len(MODELS)


def test_the_totals_are_on_the_page_once(long_output, tmp_path, capsys):
    page = report_page(long_output, tmp_path / "report")
    assert page.count("<th>credited share</th>") == 1 and page.count("<h2>Totals") == 1
    assert "totals linear:" not in page            # not repeated above the table, as text
    printed = capsys.readouterr().out  # printed, one line per model
    assert printed.count("totals linear: 34 goals (17 attributed, 17 organic)") == 1


def test_a_one_model_report_says_which_model_it_shows(long_output, tmp_path):
    from jobs.report_render import conversions_chart, value_chart

    page = report_page(long_output, tmp_path / "one", "--models", "linear")
    assert "<title>Attribution report: linear</title>" in page
    titles = re.findall(r"<(?:title|h1|h2)>(.*?)</", page)
    assert not [t for t in titles if "model" in t.replace("linear", "")], titles
    assert "<h2>Totals</h2>" in page
    daily = pd.read_parquet(tmp_path / "one" / "campaigns.parquet")
    figure = conversions_chart(daily, tmp_path / "bars.png")
    assert figure.get_suptitle() == "Credited conversions per campaign: linear"
    assert not figure.legends  # one model: nothing to tell apart
    days = long_days(long_output)
    figure = value_chart(days[days["model"] == "linear"], tmp_path / "days.png")
    assert figure.get_suptitle() == "Daily credited and organic value: linear (UTC day of the goal)"
    # Five models: the titles say so.
    page = report_page(long_output, tmp_path / "five")
    assert "<title>Attribution report: 5 models</title>" in page
    figure = conversions_chart(pd.read_parquet(tmp_path / "five" / "campaigns.parquet"),
                               tmp_path / "bars5.png")
    assert figure.get_suptitle() == "Credited conversions per campaign, one bar per model"
    assert value_chart(days, tmp_path / "days5.png").get_suptitle() == (
        "Daily credited and organic value per model (UTC day of the goal)")


def long_days(path) -> pd.DataFrame:
    """``report_tables.model_days`` of the output at ``path``, as the report computes it."""
    from attribution.spark.changelog import fold_changelog
    from attribution.spark.output import read_committed_output
    from jobs.report_tables import model_days

    output = read_committed_output(path)
    return model_days(fold_changelog(output.rows), output.final_through_ms, True)


def test_the_daily_chart_has_one_panel_per_model_and_breaks_on_days_without_goals(
        long_output, tmp_path):
    import numpy as np

    from jobs.report_render import CREDITED_STYLE, ORGANIC_STYLE, value_chart

    days = long_days(long_output)
    assert len(days) == DAYS * len(MODELS)  # every calendar day, those without goals too
    gap = days[days["day"].isin([date(1970, 1, 1 + d) for d in GAP])]
    assert (gap["goals"] == 0).all() and gap[["credited_value", "organic_value"]].isna().all(
        ).all()
    figure = value_chart(days, tmp_path / "days.png")
    assert [ax.get_title(loc="left") for ax in figure.axes] == list(MODELS)
    for ax in figure.axes:
        for style in (CREDITED_STYLE, ORGANIC_STYLE):
            (line,) = [li for li in ax.get_lines() if li.get_label() == style["label"]]
            missing = np.flatnonzero(np.isnan(np.asarray(line.get_ydata(), dtype=float)))
            assert missing.tolist() == list(GAP)  # no line across the gap
            assert line.get_markersize() <= 4


def test_a_spike_is_cut_and_labelled_with_its_value(long_output, tmp_path):
    import numpy as np

    from jobs.report_render import CREDITED_STYLE, value_chart, value_cut

    days = long_days(long_output)
    figure = value_chart(days, tmp_path / "days.png")
    cut = value_cut(days[["credited_value", "organic_value"]].stack())
    assert cut is not None and cut < 100  # the other days are worth 4 to 29
    for ax in figure.axes:
        (line,) = [li for li in ax.get_lines() if li.get_label() == CREDITED_STYLE["label"]]
        assert np.nanmax(np.asarray(line.get_ydata(), dtype=float)) == cut
        assert [t.get_text() for t in ax.texts] == ["1,000"]
        assert ax.get_ylim()[1] < 2 * cut  # the scale is the other days', not the spike's
    assert f"axis cut at {cut:,.0f}" in figure.axes[0].get_title(loc="right")
    # Without the spike nothing is cut.
    assert value_cut(days.loc[days["day"] != date(1970, 1, 1 + SPIKE), "credited_value"]) is None


def test_the_provisional_days_are_shaded_in_every_panel(long_output, tmp_path):
    from matplotlib.dates import date2num

    from jobs.report_render import value_chart

    figure = value_chart(long_days(long_output), tmp_path / "days.png")
    for ax in figure.axes:
        (shade,) = [p for p in ax.patches if p.get_label().startswith("provisional days")]
        first, last = shade.get_x(), shade.get_x() + shade.get_width()
        assert (first, last) == (date2num(pd.Timestamp("1970-01-18")),
                                 date2num(pd.Timestamp("1970-01-21")))
    (legend,) = figure.legends
    assert "provisional days (may still change)" in [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize("final_through", [DAY1 - 1, DAY1, DAY1 + 12 * HOUR, 2 * DAY1 - 2])
def test_the_last_final_day_is_the_last_day_day_status_calls_final(final_through):
    from datetime import timedelta

    from jobs.report_tables import day_status, last_final_day

    last = last_final_day(final_through)
    assert day_status(last, final_through, True) == "final"
    assert day_status(last + timedelta(days=1), final_through, True) == "provisional"
