"""The backfill window of the attribution job without Spark: parsing ``--goals-from``,
``--goals-to`` and ``--backfill-history``, the history it reads, and the outputs it refuses.

The refusals are checked through the job's ``main`` too: every one ends with one ``error:`` line
and its exit code before Spark starts (tests/spark/test_backfill.py runs real backfills).
"""
from __future__ import annotations

import datetime as dt

import pytest

from attribution.config import DEFAULT_DEDUP_WINDOW, DEFAULT_LOOKBACK, parse_duration_ms
from attribution.spark.backfill import (
    BackfillRefused,
    GoalWindow,
    Outcome,
    check_target,
    dates_of_marker,
    parse_goal_window,
)
from attribution.spark.output import BACKFILL_MARKER
from commandline.exits import ExitCode
from jobs import attribution_job
from support.commands import error_line
from support.outputs import attribution_record, write_batch_output, write_sink_output

LOOKBACK_MS = parse_duration_ms(DEFAULT_LOOKBACK)
DEDUP_MS = parse_duration_ms(DEFAULT_DEDUP_WINDOW)
DAY_MS = 86_400_000


def test_a_window_is_two_inclusive_utc_dates():
    window = parse_goal_window("2024-02-01", "2024-02-29", None, LOOKBACK_MS)
    assert (window.first, window.last, window.history_ms) == (
        dt.date(2024, 2, 1), dt.date(2024, 2, 29), None)
    start = dt.datetime(2024, 2, 1, tzinfo=dt.timezone.utc).timestamp() * 1000
    assert window.start_ms == start and window.end_ms == start + 29 * DAY_MS
    assert window.read_from_ms(DEDUP_MS) is None
    assert str(window) == "2024-02-01 to 2024-02-29"
    one_day = parse_goal_window("2024-02-29", "2024-02-29", None, LOOKBACK_MS)
    assert one_day.end_ms - one_day.start_ms == DAY_MS
    assert parse_goal_window(None, None, None, LOOKBACK_MS) is None


def test_a_bounded_history_starts_at_a_dedup_bucket_boundary():
    window = parse_goal_window("2024-03-01", "2024-03-31", "100 days", LOOKBACK_MS)
    assert window.history_ms == 100 * DAY_MS
    assert window.read_from_ms(DEDUP_MS) == window.start_ms - 100 * DAY_MS
    # With 7-hour buckets, the start is rounded down so that no logical impression is cut.
    seven_hours = 7 * 3_600_000
    since = window.read_from_ms(seven_hours)
    assert since % seven_hours == 0 and 0 <= window.start_ms - 100 * DAY_MS - since < seven_hours
    assert window.history_text(DEDUP_MS) == "100 days (events from 2023-11-22T00:00:00.000Z)"


def test_the_users_a_correction_can_touch_are_found_up_to_the_end_of_a_dedup_bucket():
    window = parse_goal_window("2024-02-01", "2024-02-29", None, LOOKBACK_MS)
    # Day buckets end with the window; 7-hour buckets are cut at its end: read to the bucket's.
    assert window.reach_end_ms(DEDUP_MS) == window.end_ms
    seven_hours = 7 * 3_600_000
    reach = window.reach_end_ms(seven_hours)
    assert reach % seven_hours == 0 and 0 < reach - window.end_ms < seven_hours


def test_the_marker_records_the_window_and_the_dates_being_rewritten():
    window = GoalWindow(dt.date(2024, 2, 1), dt.date(2024, 2, 29))
    dates = [dt.date(2024, 3, 5), dt.date(2024, 2, 20)]
    text = window.marker(dates)
    assert GoalWindow.from_marker(text) == window
    assert dates_of_marker(text) == sorted(dates)
    assert dates_of_marker('{"goals_from": "2024-02-01", "goals_to": "2024-02-29"}') == []


@pytest.mark.parametrize("outcome, line", [
    (Outcome(GoalWindow(dt.date(2024, 2, 1), dt.date(2024, 2, 29)),
             (dt.date(2024, 2, 20), dt.date(2024, 2, 21), dt.date(2024, 3, 5)),
             (dt.date(2024, 2, 20), dt.date(2024, 3, 5)), (dt.date(2024, 2, 21),)),
     "2 replaced (1 after the window), 1 without goals removed"),
    (Outcome(GoalWindow(dt.date(2024, 2, 1), dt.date(2024, 2, 29)), (), (), ()),
     "none differs from a full run over --events: the output is unchanged"),
    (Outcome(GoalWindow(dt.date(2024, 2, 1), dt.date(2024, 2, 29)), (), (), (),
             window_has_events=False),
     "no event of the window in --events: the output is unchanged"),
])
def test_the_report_says_which_dates_a_backfill_replaced(outcome, line):
    report = outcome.report(DEDUP_MS)
    assert report["goal dates"] == line
    assert report["backfill"] == "goals 2024-02-01 to 2024-02-29"
    assert report["history read"] == "all events"


@pytest.mark.parametrize("goals_from, goals_to, history, message", [
    ("2024-02-30", "2024-03-01", None, "--goals-from '2024-02-30' is not a date; write it "
                                       "YYYY-MM-DD (UTC)"),
    ("2024-02-01", "2024/03/01", None, "--goals-to '2024/03/01' is not a date"),
    ("2024-02-01", "20240301", None, "--goals-to '20240301' is not a date"),
    ("", "2024-03-01", None, "--goals-from '' is not a date"),
    ("2024-03-02", "2024-03-01", None, "the window --goals-from 2024-03-02 --goals-to "
                                       "2024-03-01 is empty: it ends before it starts"),
    ("2024-03-01", None, None, "--goals-from needs --goals-to too"),
    (None, "2024-03-01", None, "--goals-to needs --goals-from too"),
    (None, None, "100 days", "--backfill-history needs a window"),
    ("2024-03-01", "2024-03-31", "30 days", "--backfill-history 30 days is shorter than "
                                            "--lookback (90 days)"),
    ("2024-03-01", "2024-03-31", "30", "--backfill-history"),
])
def test_a_bad_window_is_refused_naming_the_option_and_value(goals_from, goals_to, history,
                                                             message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_goal_window(goals_from, goals_to, history, LOOKBACK_MS)


@pytest.mark.parametrize("options, message", [
    (["--mode", "batch", "--goals-from", "2024-02-31", "--goals-to", "2024-03-01"],
     "--goals-from '2024-02-31' is not a date"),
    (["--mode", "batch", "--goals-from", "2024-03-02", "--goals-to", "2024-03-01"],
     "is empty: it ends before it starts"),
    (["--goals-from", "2024-03-01", "--goals-to", "2024-03-31"],
     "--goals-from and --goals-to backfill a --mode batch output; add --mode batch"),
    (["--mode", "batch", "--goals-from", "2024-03-01", "--goals-to", "2024-03-31",
      "--backfill-history", "10 days"], "is shorter than --lookback"),
])
def test_the_job_refuses_a_bad_window_with_one_line_and_exit_code_2(tmp_path, capsys, options,
                                                                   message):
    with pytest.raises(SystemExit) as exit_:
        attribution_job.main(["--events", str(tmp_path), *options])
    assert exit_.value.code == ExitCode.USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("attribution_job.py: error: ") and message in lines[-1], lines
    assert sum("error:" in line for line in lines) == 1


WINDOW = GoalWindow(dt.date(1970, 1, 1), dt.date(1970, 1, 31))


def _records():
    return [attribution_record("g1", 3_600_000, impression=1)]


@pytest.mark.parametrize("case, refusal", [
    ("missing", None),
    ("empty", None),
    ("finished", None),
    ("unfinished backfill covered", None),
    ("streaming", "is a streaming query's output"),
    ("flat", "holds part files at its top level .written without goal_date partitions"),
    ("unfinished write", "holds no finished batch output .no _SUCCESS"),
    ("unfinished backfill elsewhere", "holds an unfinished backfill of the goals 1970-02-01 to "
                                      "1970-02-28 .* rerun with --goals-from 1970-02-01 "
                                      "--goals-to 1970-02-28"),
])
def test_the_outputs_a_backfill_refuses(tmp_path, case, refusal):
    out = tmp_path / "out"
    if case == "empty":
        out.mkdir()
    elif case == "finished":
        write_batch_output(out / "goal_date=1970-01-01", _records(), success=False)
        (out / "_SUCCESS").write_text("")
    elif case == "streaming":
        write_sink_output(out, [_records()], partitioned=True)
    elif case == "flat":
        write_batch_output(out, _records())
    elif case == "unfinished write":
        write_batch_output(out / "goal_date=1970-01-01", _records(), success=False)
    elif case.startswith("unfinished backfill"):
        write_batch_output(out / "goal_date=1970-01-01", _records(), success=False)
        unfinished = WINDOW if case.endswith("covered") else GoalWindow(dt.date(1970, 2, 1),
                                                                      dt.date(1970, 2, 28))
        (out / BACKFILL_MARKER).write_text(unfinished.marker())
    if refusal is None:
        check_target(str(out), WINDOW)
        return
    with pytest.raises(BackfillRefused, match=refusal):
        check_target(str(out), WINDOW)


def test_the_job_refuses_such_an_output_before_spark_starts(tmp_path, capsys):
    events = tmp_path / "events"
    events.mkdir()
    (events / "part-00000.json").write_text("{}\n")
    write_batch_output(tmp_path / "flat", _records())
    code = attribution_job.main(["--events", str(events), "--mode", "batch",
                                 "--output", str(tmp_path / "flat"),
                                 "--goals-from", "1970-01-01", "--goals-to", "1970-01-31"])
    assert code == ExitCode.OUTPUT
    assert "written without goal_date partitions" in error_line(capsys.readouterr().err)
