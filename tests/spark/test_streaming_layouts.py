"""One streaming run per state layout of both backends, carrying every streaming scenario as
separate users of one generated stream (``spark_scenarios``), asserted scenario by scenario.

The stream's eight files are read two per micro-batch (``--max-files-per-trigger 2``,
available-now), the first four in one run and the last four in a second run on the same
checkpoint, so that state, timers, the watermark and the user count cross a restart. Proven per
layout, each in its own subtest:

* every scenario's rows are the batch oracle's over the records on time, under all five models:
  the chapter 7 events (the book's two rows), generated multi-touch sessions with campaigns and
  values, random disordered users with redelivered copies (the generator's truth), conflicting
  copies of records met in state across the restart in either order (the smaller copy wins);
* records that arrive behind the watermark are dropped, counted and used by no row;
* the state of users whose lookback the watermark has passed is dropped while later users are
  held: the users in the checkpoint's state after each run are those the rules hold;
* each micro-batch's progress record and line (input, late rows, goals and attributed goals per
  model, users in state, state size, the watermark or "none yet", Spark's duration and rates)
  and each run's report give the figures the rules give; after the restart the users already
  held are counted from the checkpoint.

Batch mode's runs of the same scenarios are in ``test_attribution_job``.
"""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

from attribution.config import MODELS
from attribution.oracle import attribute_batch, sort_key
from attribution.spark.output import read_attribution_rows
from jobs.attribution_job import parse_args, run
from jobs.progress import per_model
from spark_scenarios import (
    BATCH_PLAN,
    CONFIG,
    DELAY_MS,
    JOB_OPTIONS,
    LAYOUTS,
    MINUTE,
    RUN_1_FILES,
    RUN_BATCHES,
    group_of,
    late_records,
    rich_stream,
    simulate,
    users_in_checkpoint,
    watermark_text,
)
from support.datasets import (
    CH7_ROWS,
    CONFLICTING_COPIES_ROWS,
    FILE_TIME,
    conflicting_copies,
    stage_in_arrival_order,
)
from support.outputs import PARQUET_OUTPUT

COPY_GROUPS = ("copies-smaller-first", "copies-smaller-last")


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """The stream's files and what is known of them (no Spark): built once per module."""
    return rich_stream(tmp_path_factory.mktemp("rich-stream"))


def _run(spark, tmp_path, stream, layout, first: int, last: int, capsys):
    """Stage files ``first`` to ``last - 1`` after those already staged and run the job over the
    stream; its report and progress lines."""
    stage_in_arrival_order(stream.paths[first:last], tmp_path / "events", FILE_TIME + first)
    args = parse_args(["--events", str(tmp_path / "events"), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), *PARQUET_OUTPUT, *JOB_OPTIONS,
                       *LAYOUTS[layout]])
    report = run(spark, args)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("batch ")]
    return report, lines


def _by_group(rows) -> dict:
    groups = defaultdict(list)
    for r in rows:
        groups[group_of(r.user_id)].append(r)
    return groups


def _goals(rows, model=None) -> set:
    return {(r.user_id, r.goal_event_id) for r in rows
            if model is None or (r.model == model and not r.organic)}


def _copies_row(row, base_ms: int) -> tuple:
    """A row in the form of ``support.datasets.CONFLICTING_COPIES_ROWS``, its minute counted from
    ``base_ms``."""
    return (row.user_id.split(":", 1)[1], row.goal_event_id, (row.goal_ts - base_ms) // MINUTE,
            row.impression_id, row.impression_campaign, tuple(row.trail), row.goal_value)


def _assert_the_stream_holds_every_scenario(stream, batches, figures, late, expected_by_group):
    """What the data must hold for the subtests to mean anything (checked before Spark runs)."""
    # late: the records placed behind the watermark, under Spark's rule and under the stricter
    # reading alike, with or without the first run's timer-only micro-batch.
    assert {(e.user_id, e.event_id) for e in late} == stream.intended_late
    assert late_records(batches, DELAY_MS, lag_batches=0) == late
    without_timer_batch = stream.batches(
        [files for files in BATCH_PLAN[:RUN_BATCHES[0]] if files]
        + list(BATCH_PLAN[RUN_BATCHES[0]:]))
    assert ({(e.user_id, e.event_id) for e in late_records(without_timer_batch, DELAY_MS)}
            == stream.intended_late)
    assert {"i-456", "i-789"} <= {e.event_id for e in late}
    # ch7: the goals a micro-batch before the impressions; the oracle gives the book's rows.
    ch7_batches = [{e.event_id for e in records if e.user_id == "ch7:UserX"}
                   for records in batches]
    assert {"g-signup", "g-receipt"} <= ch7_batches[0] and {"i-123", "i-456"} <= ch7_batches[1]
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in expected_by_group["ch7"]
            if r.model == "last_touch"} == CH7_ROWS
    # multi-touch: goals of several clicks, campaigns and values, organic goals.
    touch = expected_by_group["multi-touch"]
    linear = [r for r in touch if r.model == "linear" and not r.organic]
    assert len(linear) - len({r.goal_event_id for r in linear}) >= 20  # goals of 2+ clicks
    assert any(r.impression_campaign and r.credited_value for r in linear)
    assert any(r.goal_value is None for r in touch) and any(r.organic for r in touch)
    # copies: one copy of each record before the restart, the other after it; the oracle keeps
    # the smaller copies (rule 1) whatever the order, and they give support's rows.
    smaller, larger, common = conflicting_copies()
    shift = stream.copies_base_ms - min(e.ts for e in smaller + larger + common)
    by_group = _by_group(e for e in stream.records() if e.user_id is not None)
    for group in COPY_GROUPS:
        ids = [{e.event_id for e in records if group_of(e.user_id or "") == group}
               for records in batches]
        assert ids[1] and ids[3] and ids[3] <= ids[1]  # the second copies after the restart
        alone = attribute_batch([e._replace(user_id=f"{group}:{e.user_id}", ts=e.ts + shift)
                                 for e in smaller + common], CONFIG)
        assert [_copies_row(r, stream.copies_base_ms) for r in alone
                if r.model == "last_touch"] == CONFLICTING_COPIES_ROWS
        assert attribute_batch(by_group[group], CONFIG) == alone == expected_by_group[group]
    # random: the generator made no record late; its truth has organic goals and trails.
    assert stream.random_manifest["disorder"]["no_late_events"] is True
    truth = stream.random_truth
    assert len(truth) > 20 and any(r.organic for r in truth)
    assert any(len(r.trail) > 1 for r in truth)
    # shrink: alice and bob held after micro-batch 0 and gone when the first run ends, carol
    # held then; nobody at the end.
    shrink = [{u for u in f.users if group_of(u) == "shrink"} for f in figures]
    assert shrink[0] == {"shrink:alice", "shrink:bob"}
    assert shrink[RUN_BATCHES[0] - 1] == {"shrink:carol"} and not figures[-1].users


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_run_per_layout_gives_every_scenario_the_rules_rows_and_figures(
        spark, tmp_path, stream, layout, subtests, capsys):
    batches = stream.batches()
    figures = simulate(batches, CONFIG, DELAY_MS)
    late = late_records(batches, DELAY_MS)
    on_time = [e for e in stream.records() if all(e is not x for x in late)]
    expected = attribute_batch(on_time, CONFIG)
    expected_by_group = _by_group(expected)
    _assert_the_stream_holds_every_scenario(stream, batches, figures, late, expected_by_group)

    # -- the two runs ----------------------------------------------------------------------------
    report1, lines1 = _run(spark, tmp_path, stream, layout, 0, RUN_1_FILES, capsys)
    held1 = users_in_checkpoint(spark, tmp_path / "cp", layout)
    report2, lines2 = _run(spark, tmp_path, stream, layout, RUN_1_FILES, len(stream.paths),
                           capsys)
    held2 = users_in_checkpoint(spark, tmp_path / "cp", layout)
    rows = sorted(read_attribution_rows(tmp_path / "out"), key=sort_key)
    by_group = _by_group(rows)
    reports, history = (report1, report2), report1.history + report2.history

    with subtests.test(msg="micro-batches: two runs of two files each and a timer-only one"):
        assert [(b["batch"], b["input"]) for b in history] == [
            (n, f.input) for n, f in enumerate(figures)]
        assert [len(report1.history), len(report2.history)] == list(RUN_BATCHES)
        assert [r.batches for r in reports] == list(RUN_BATCHES)
        assert [len(lines1), len(lines2)] == list(RUN_BATCHES)
        assert sum(r.input_rows for r in reports) == len(stream.records())

    with subtests.test(msg="all users: the rows are the oracle's over the records on time"):
        assert rows == expected, sorted({group_of(r.user_id) for r in set(rows) ^ set(expected)})

    with subtests.test(msg="ch7: the book's two rows, every model's rows the oracle's"):
        assert {(r.goal_event_id, r.impression_id, r.trail) for r in by_group["ch7"]
                if r.model == "last_touch"} == CH7_ROWS
        assert by_group["ch7"] == expected_by_group["ch7"]
        assert (len(_goals(by_group["ch7"])), len(_goals(by_group["ch7"], "last_touch"))) == (2, 2)

    with subtests.test(msg="ch7: the columns of later sections at their defaults"):
        assert {(r.model, r.credit, r.impression_campaign, r.goal_value, r.credited_value,
                 r.sign, r.revision, r.emit_timing) for r in by_group["ch7"]
                if r.model == "last_touch"} == {
            ("last_touch", 1.0, None, None, None, 1, 0, "ON_TIME")}
        assert {r.model for r in by_group["ch7"]} == set(MODELS)

    with subtests.test(msg="multi-touch: every model's rows are the oracle's, row for row"):
        touch = expected_by_group["multi-touch"]
        assert by_group["multi-touch"] == touch
        assert len(_goals(by_group["multi-touch"])) == len(_goals(touch))

    for group in COPY_GROUPS:
        with subtests.test(msg=f"{group}: the smaller copies' rows, met in state across the "
                               "restart"):
            assert by_group[group] == expected_by_group[group]
            assert len(_goals(by_group[group])) == len(CONFLICTING_COPIES_ROWS)

    with subtests.test(msg="random: the generator's truth, every model the oracle's, no "
                           "duplicate"):
        truth = stream.random_truth
        assert [r for r in by_group["random"] if r.model == "last_touch"] == truth
        assert by_group["random"] == expected_by_group["random"]
        last_touch = [r for r in by_group["random"] if r.model == "last_touch"]
        assert len({r.goal_event_id for r in last_touch}) == len(last_touch)  # no duplicates
        assert len(_goals(by_group["random"])) == len(truth)

    with subtests.test(msg="late: dropped and counted, used by no row"):
        assert sum(r.late_rows for r in reports) == len(late)
        assert [b["late"] for b in history] == [f.late for f in figures]
        assert {r.goal_event_id for r in by_group["late"]} == {"g-signup", "g-receipt"}
        assert all(r.impression_id not in (456, 789) for r in by_group["late"])
        assert len(_goals(by_group["late"])) == 2
        assert by_group["late"] == expected_by_group["late"]

    with subtests.test(msg="shrink: state dropped once the watermark passes ts + lookback"):
        assert [(r.goal_event_id, r.impression_id) for r in by_group["shrink"]
                if r.model == "last_touch"] == [("a-goal", 1)]
        assert by_group["shrink"] == expected_by_group["shrink"]
        state_rows = [b["state_rows"] for b in history]
        assert state_rows[0] > 0 and state_rows[-1] < state_rows[0]
        if layout in ("applyInPandasWithState-per-user", "transformWithState"):
            # One state row per user.
            assert state_rows == [len(f.users) for f in figures]
        # Every user the rules hold when the first run ends: carol, not alice or bob.
        assert held1 == figures[RUN_BATCHES[0] - 1].users
        assert held2 == set()

    with subtests.test(msg="report: goals, attributed goals per model and late rows of both "
                           "runs"):
        assert sum(r.goals for r in reports) == len(_goals(expected))
        assert {m: sum(r.attributed_by_model[m] for r in reports) for m in MODELS} == {
            m: len(_goals(expected, m)) for m in MODELS}
        assert all("first_touch" in r.render() for r in reports)

    with subtests.test(msg="progress: each micro-batch's record, users counted across the "
                           "restart"):
        assert [(b["goals"], b["attributed_by_model"], b["users_in_state"], b["watermark"])
                for b in history] == [
            (f.goals, f.attributed, len(f.users), watermark_text(f.watermark)) for f in figures]
        # The restart's first micro-batch counts the users the checkpoint holds.
        first = report2.history[0]
        assert first["users_in_state"] == len(figures[RUN_BATCHES[0]].users) > 0

    with subtests.test(msg="progress: micro-batch 0's line, Spark's numbers to the precision "
                           "shown"):
        zeros = per_model(dict.fromkeys(MODELS, 0))
        line = re.fullmatch(
            rf"batch 0: input {figures[0].input} rows in (\d+\.\d) s \(input ([\d.,]+) rows/s, "
            rf"processed ([\d.,]+) rows/s\), late dropped 0, goals 0 \(attributed per model: "
            rf"{zeros}\), users in state {len(figures[0].users)}, state size ([\d.]+ [KM]?B), "
            r"watermark none yet, invalid 0 \(dead-lettered\)", lines1[0])
        assert line, lines1[0]
        batch = report1.history[0]
        assert line[1] == f"{batch['duration_ms'] / 1000:.1f}"
        assert float(line[2].replace(",", "")) == pytest.approx(batch["input_rate"], rel=0.01,
                                                                abs=0.01)
        assert float(line[3].replace(",", "")) == pytest.approx(batch["processed_rate"],
                                                                rel=0.01)
        assert batch["processed_rate"] > 0

    with subtests.test(msg="progress: every line's figures"):
        for n, (line, f) in enumerate(zip(lines1 + lines2, figures)):
            watermark = "none yet" if f.watermark == 0 else watermark_text(f.watermark)
            assert line.startswith(f"batch {n}: input {f.input} rows in "), line
            assert (f"late dropped {f.late}, goals {f.goals} (attributed per model: "
                    f"{per_model(f.attributed)}), users in state {len(f.users)}, state size "
                    in line), line
            assert line.endswith(f"watermark {watermark}, invalid 0 (dead-lettered)"), line

    with subtests.test(msg="progress: each run's report"):
        runs = (figures[:RUN_BATCHES[0]], figures[RUN_BATCHES[0]:])
        for report, run_figures in zip(reports, runs):
            last = run_figures[-1]
            goals = sum(f.goals for f in run_figures)
            attributed = {m: sum(f.attributed[m] for f in run_figures) for m in MODELS}
            rendered = report.render()
            for text in (f"input rows     : {sum(f.input for f in run_figures)}",
                         f"late dropped   : {sum(f.late for f in run_figures)}",
                         f"goals          : {goals}",
                         f"attributed     : {per_model(attributed)}",
                         "organic        : " + per_model({m: goals - a
                                                          for m, a in attributed.items()}),
                         f"users in state : {len(last.users)}",
                         f"watermark      : {watermark_text(last.watermark)}",
                         "state size     : "):
                assert text in rendered, rendered
            assert report.watermark == watermark_text(last.watermark)
            assert report.users_in_state == len(last.users)
            assert report.state_bytes > 0
