"""Section 8 on Spark: the chapter 7 files made late (watermark delay 1 minute), through the job
on every streaming layout that revises, give the changelogs derived by hand in
tests/unit/test_core_revisions.py, and the late-record output holds what is dropped."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

from attribution.spark.changelog import fold_changelog
from attribution.spark.checkpoint import LAYOUT_FILE
from attribution.spark.late_records import read_late_records
from attribution.spark.output import read_attribution_rows, read_attributions
from commandline.exits import ExitCode
from jobs.attribution_job import parse_args, run
from support import (
    PARQUET_OUTPUT,
    ROOT,
    command_environment,
    error_line,
    stage_in_arrival_order,
)

LAYOUTS = {"buckets": [], "per-user": ["--state-buckets", "0"],
           "transformWithState": ["--backend", "transformWithState"]}
BOOK_ROWS = {("g-signup", 123), ("g-receipt", 456)}


def _named(path, uri: bool) -> str:
    """``path`` as the job is given it: a local path, or a ``file://`` URI (which the job reads
    and writes through Hadoop's file system, as it would ``hdfs://``)."""
    return f"file://{path}" if uri else str(path)


def _run(spark, tmp_path, ch7_dir, *options, uri: bool = False):
    events = stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "in")
    args = parse_args(["--events", str(events), "--output", _named(tmp_path / "out", uri),
                       "--checkpoint", _named(tmp_path / "cp", uri), "--quiet", *PARQUET_OUTPUT,
                       "--watermark-delay", "1 minute", "--max-files-per-trigger", "1",
                       *options])
    report = run(spark, args)
    frame = read_attributions(str(tmp_path / "out"))
    changelog = Counter(
        (r.goal_event_id, None if pd.isna(r.impression_id) else int(r.impression_id),
         int(r.sign), int(r.revision), r.emit_timing) for r in frame.itertuples())
    net = {(r.goal_event_id, int(r.impression_id)) for r in fold_changelog(frame).itertuples()
           if not pd.isna(r.impression_id)}
    late = sorted(json.loads(r["raw_record"])["event_id"]
                  for r in read_late_records(str(tmp_path / "out-late")).to_pylist())
    return report, changelog, net, late


# Each layout on local paths; the default one also with file:// URIs for the checkpoint and the
# outputs (the code path of hdfs:// and s3a://).
@pytest.mark.parametrize("layout,uri", [*((layout, False) for layout in LAYOUTS),
                                        ("buckets", True)])
def test_allowed_lateness_revises_the_signup_goal(spark, tmp_path, ch7_dir, layout, uri):
    report, changelog, net, late = _run(spark, tmp_path, ch7_dir, "--allowed-lateness",
                                        "5 minutes", *LAYOUTS[layout], uri=uri)
    assert changelog == Counter([("g-signup", None, 1, 0, "ON_TIME"),
                                 ("g-signup", None, -1, 0, "ON_TIME"),
                                 ("g-signup", 123, 1, 1, "LATE"),
                                 ("g-receipt", 456, 1, 0, "ON_TIME")])
    assert net == BOOK_ROWS
    assert late == [] and report.late_rows == 0
    assert report.extra["late accepted"] == 4
    # Counted with their signs, the goals are the net table's, as are the attributed ones.
    assert (report.goals, report.attributed) == (2, 2)
    assert (report.extra["revisions"], report.extra["retractions"]) == (1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["buckets", "transformWithState"])
def test_early_results_revise_goals_until_the_watermark_passes_them(spark, tmp_path, ch7_dir,
                                                                    layout):
    report, changelog, net, _ = _run(spark, tmp_path, ch7_dir, "--allowed-lateness",
                                     "5 minutes", "--early-results", *LAYOUTS[layout])
    assert changelog == Counter([
        ("g-signup", None, 1, 0, "EARLY"), ("g-receipt", None, 1, 0, "EARLY"),
        ("g-signup", None, -1, 0, "EARLY"), ("g-signup", None, 1, 1, "ON_TIME"),
        ("g-signup", None, -1, 1, "ON_TIME"), ("g-signup", 123, 1, 2, "LATE"),
        ("g-receipt", None, -1, 0, "EARLY"), ("g-receipt", 456, 1, 1, "EARLY"),
        ("g-receipt", 456, -1, 1, "EARLY"), ("g-receipt", 456, 1, 2, "ON_TIME")])
    assert net == BOOK_ROWS
    assert (report.goals, report.attributed) == (2, 2)
    assert (report.extra["revisions"], report.extra["retractions"]) == (4, 4)


@pytest.mark.parametrize("order", ["smaller-first", "smaller-last"])
@pytest.mark.parametrize("layout", [
    "buckets", pytest.param("per-user", marks=pytest.mark.slow),
    pytest.param("transformWithState", marks=pytest.mark.slow)])
def test_conflicting_copies_revise_early_rows_to_the_smallest_copy(spark, tmp_path, layout,
                                                                   order):
    """With early results the larger copies, if they come first, are emitted early; the smaller
    ones revise their rows (or retract them: the smaller copy of goal g4 is no goal), so the
    folded changelog is the oracle's rows either way round."""
    from attribution.oracle import attribute_batch
    from support import (
        CONFLICTING_COPIES_ROWS,
        conflicting_copies,
        conflicting_copies_row,
        stage_conflicting_copies,
    )

    events = stage_conflicting_copies(tmp_path / "events", order == "smaller-first")
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), "--quiet", *PARQUET_OUTPUT,
                       "--watermark-delay", "10 minutes", "--max-files-per-trigger", "1",
                       "--allowed-lateness", "5 minutes", "--early-results", *LAYOUTS[layout]])
    run(spark, args)
    changelog = read_attribution_rows(tmp_path / "out")
    net: Counter = Counter()
    for r in changelog:
        net[r._replace(sign=1, revision=0, emit_timing="ON_TIME")] += r.sign
    assert set(net.values()) <= {0, 1}
    table = sorted(conflicting_copies_row(r) for r, n in net.items() if n)
    smaller, _, common = conflicting_copies()
    assert [conflicting_copies_row(r) for r in attribute_batch(smaller + common)] == \
        CONFLICTING_COPIES_ROWS
    assert table == CONFLICTING_COPIES_ROWS
    assert len(fold_changelog(read_attributions(str(tmp_path / "out")))) == len(table)
    # The larger copies' rows (goal g4, g1 worth 7) are emitted early and retracted only when
    # the larger copies come first.
    larger_rows = Counter((r.goal_event_id, r.sign) for r in changelog
                          if r.goal_event_id == "g4" or r.goal_value == 7.0)
    assert larger_rows == (Counter() if order == "smaller-first" else
                           Counter({("g4", 1): 1, ("g4", -1): 1, ("g1", 1): 1, ("g1", -1): 1}))


def test_without_allowed_lateness_the_late_records_are_dropped_and_written(spark, tmp_path,
                                                                            ch7_dir):
    report, changelog, net, late = _run(spark, tmp_path, ch7_dir)
    assert changelog == Counter([("g-signup", None, 1, 0, "ON_TIME"),
                                 ("g-receipt", None, 1, 0, "ON_TIME")])
    assert net == set()
    assert late == ["i-456", "i-789", "v-signup", "v-thing"] and report.late_rows == 4


def _late_table(late_dir) -> list[tuple]:
    """The late records, without what differs between two runs (the time they ran, the
    directory of their input): in order, each record with its reason, watermark and batch."""
    return sorted((r["raw_record"], r["reason"], r["watermark"], r["allowed_lateness_ms"],
                   r["batch_id"], r["source_file"].rsplit("/", 1)[-1])
                  for r in read_late_records(str(late_dir)).to_pylist())


def test_file_uris_keep_the_late_records_and_the_checkpoint_refusals_of_local_paths(
        spark, tmp_path, ch7_dir, capsys):
    """With file:// URIs for the checkpoint, the output and the late records (Hadoop's file
    system, as for hdfs://): the same late records as with local paths, the report's count is
    Spark's dropped-row count, and a restart with another --allowed-lateness, --models or
    bucket count exits 5, checked before the run when Spark runs already (in this process) and
    once it has started when it does not (a new process)."""
    from jobs import attribution_job

    local, remote = tmp_path / "local", tmp_path / "remote"
    report, changelog, _, _ = _run(spark, local, ch7_dir)
    uri_report, uri_changelog, _, _ = _run(spark, remote, ch7_dir, uri=True)
    assert uri_changelog == changelog
    assert _late_table(remote / "out-late") == _late_table(local / "out-late")
    assert len(_late_table(remote / "out-late")) == 4
    assert uri_report.late_rows == report.late_rows == 4  # Spark's dropped-row count
    assert uri_report.extra["late records"] == f"4 in file://{remote}/out-late"

    checkpoint = _named(remote / "cp", True)
    layout = (remote / "cp" / LAYOUT_FILE).read_text()
    common = ["--events", str(remote / "in"), "--output", _named(remote / "out", True),
              "--checkpoint", checkpoint, "--watermark-delay", "1 minute",
              "--max-files-per-trigger", "1", "--quiet", "--log-file", str(tmp_path / "log")]
    for options, was, asked in [
            (["--allowed-lateness", "5 minutes"], "--allowed-lateness '0 ms'",
             "--allowed-lateness '5 min'"),
            (["--state-buckets", "16"], "--state-buckets 64", "--state-buckets 16")]:
        assert attribution_job.main([*common, *options]) == ExitCode.CHECKPOINT, options
        line = error_line(capsys.readouterr().err)
        assert line.startswith(f"error: checkpoint {checkpoint} was started with {was}; this "
                               f"run asks for {asked}."), line
    result = subprocess.run(
        [sys.executable, ROOT / "jobs" / "attribution_job.py", *common, "--models", "all"],
        cwd=tmp_path, capture_output=True, text=True, env=command_environment(), timeout=300)
    line = error_line(result.stderr)
    assert result.returncode == ExitCode.CHECKPOINT, result.stderr
    assert line.startswith(f"error: checkpoint {checkpoint} was started with --models "
                           "last_touch; this run asks for --models "), line
    assert (remote / "cp" / LAYOUT_FILE).read_text() == layout


# A checkpoint's first run, and restarts that change its revising options one at a time: each
# restart's options, and what the refusal must say the checkpoint was started with and this run
# asks for: the options that differ, as options (a lateness of 0 and no early results, the
# defaults, are recorded as no entry at all).
RESTARTS = {
    "allowed lateness": (["--allowed-lateness", "5 minutes"], [
        (["--allowed-lateness", "10 minutes"],
         "--allowed-lateness '5 min'", "--allowed-lateness '10 min'"),
        ([], "--allowed-lateness '5 min'", "--allowed-lateness '0 ms'"),
        (["--allowed-lateness", "5 minutes", "--early-results"],
         "no early results", "--early-results"),
    ]),
    "early results": (["--early-results"], [
        ([], "--early-results", "no early results"),
        (["--early-results", "--allowed-lateness", "1 minute"],
         "--allowed-lateness '0 ms'", "--allowed-lateness '1 min'"),
    ]),
}


@pytest.mark.parametrize("started", list(RESTARTS))
def test_a_checkpoint_refuses_another_allowed_lateness_or_early_results(spark, tmp_path, ch7_dir,
                                                                       started):
    """Revisions keep other state (emitted rows, open goals) under another Spark watermark: a
    restart that changes --allowed-lateness or toggles --early-results is refused before Spark
    starts, with one line asking for the original options or a new checkpoint, and leaves the
    checkpoint and output as they were."""
    first, restarts = RESTARTS[started]
    _, changelog, _, _ = _run(spark, tmp_path, ch7_dir, *first)
    checkpoint = tmp_path / "cp"
    layout = (checkpoint / LAYOUT_FILE).read_text()
    commits = sorted(p.name for p in (checkpoint / "commits").iterdir())
    common = ["--events", tmp_path / "in", "--output", tmp_path / "out", "--checkpoint",
              checkpoint, "--watermark-delay", "1 minute", "--max-files-per-trigger", "1",
              "--trigger", "available-now"]
    for options, was, asked in restarts:
        result = subprocess.run(
            [sys.executable, ROOT / "jobs" / "attribution_job.py", *map(str, common), *options],
            cwd=tmp_path, capture_output=True, text=True, env=command_environment(),
            timeout=300)
        line = error_line(result.stderr)
        assert result.returncode == ExitCode.CHECKPOINT, (options, result.stderr)
        assert "starting Spark" not in result.stderr, options
        started_with, _, this_run = line.partition("; this run asks for ")
        assert started_with.startswith(f"error: checkpoint {checkpoint} was started with "), line
        assert started_with.endswith(f"was started with {was}"), (options, line)
        assert this_run.startswith(f"{asked}. "), (options, line)
        assert this_run.endswith("Use the original options, or a new --checkpoint (and "
                                 "--output)."), line
        assert (checkpoint / LAYOUT_FILE).read_text() == layout
    assert sorted(p.name for p in (checkpoint / "commits").iterdir()) == commits
    # The original options still resume it: nothing new to read, the same changelog.
    _, again, _, _ = _run(spark, tmp_path, ch7_dir, *first)
    assert again == changelog and sum(changelog.values()) > 0
