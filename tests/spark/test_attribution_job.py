"""The Spark attribution job: batch mode against the batch oracle (the chapter 7 files,
multi-touch sessions under every model, conflicting copies in either order), the command line
(help, one-line errors, spark-submit), and what a checkpoint pins (state layout, bucket count,
bucket keys, the state column).

Streams are file sources read with ``availableNow``, so nothing depends on wall-clock time. The
streaming layouts' scenarios run as users of one stream per layout in ``test_streaming_layouts``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from attribution.config import MODELS, AttributionConfig, parse_duration_ms
from attribution.oracle import attribute_batch, sort_key
from attribution.spark.files import read_events
from attribution.spark.output import read_attribution_rows
from jobs.attribution_job import parse_args, run
from support import ROOT
from support.commands import SPARK_CODEGEN_DEFAULTS, assert_no_traceback
from support.datasets import (
    CH7_ROWS,
    CONFLICTING_COPIES_ROWS,
    conflicting_copies,
    conflicting_copies_row,
    multi_touch_events,
    stage_conflicting_copies,
    stage_in_arrival_order,
)
from support.outputs import PARQUET_OUTPUT


def run_job(spark, tmp_path: Path, events: Path, *options: str):
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "checkpoint"), "--quiet", *PARQUET_OUTPUT,
                       *options])
    report = run(spark, args)
    return report, sorted(read_attribution_rows(tmp_path / "out"), key=sort_key)


# The streaming layouts run these scenarios, and more, as users of one stream each
# (test_streaming_layouts); batch mode runs them here, each on its own data.
BATCH = ["--mode", "batch"]


def test_ch7_files_give_the_two_expected_rows(spark, tmp_path, ch7_stream_dir):
    report, rows = run_job(spark, tmp_path, ch7_stream_dir, *BATCH)
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
    assert rows == attribute_batch(read_events(ch7_stream_dir))
    # Without --models: last_touch alone, and the columns of later sections at their defaults.
    assert {(r.model, r.credit, r.impression_campaign, r.goal_value, r.credited_value, r.sign,
             r.revision, r.emit_timing) for r in rows} == {
        ("last_touch", 1.0, None, None, None, 1, 0, "ON_TIME")}
    assert (report.goals, report.attributed, report.late_rows) == (2, 2, 0)
    assert report.attributed_by_model == {"last_touch": 2}


def test_every_model_on_multi_touch_data_equals_the_oracle_row_for_row(spark, tmp_path):
    """All five models in one run, on generated sessions where many goals have several clicks
    upstream, with campaigns and values: the oracle's rows, row for row."""
    events = multi_touch_events(tmp_path / "events")
    config = AttributionConfig(models=MODELS, half_life_ms=parse_duration_ms("2 days"))
    expected = attribute_batch(read_events(events), config)
    linear = [r for r in expected if r.model == "linear" and not r.organic]
    assert len(linear) - len({r.goal_event_id for r in linear}) >= 20  # goals of 2+ clicks
    assert any(r.impression_campaign and r.credited_value for r in linear)
    assert any(r.goal_value is None for r in expected) and any(r.organic for r in expected)

    report, rows = run_job(spark, tmp_path, events, "--models", "all", "--half-life", "2 days",
                           *BATCH)
    assert rows == expected
    goals = {r.goal_event_id for r in expected}
    assert report.goals == len(goals) and report.late_rows == 0
    assert report.attributed_by_model == {
        m: len({r.goal_event_id for r in expected if r.model == m and not r.organic})
        for m in MODELS}
    assert "first_touch" in report.render()


@pytest.mark.parametrize("order", ["smaller-first", "smaller-last"])
def test_conflicting_copies_give_the_same_rows_on_every_path_and_order(spark, tmp_path, order):
    """Copies of one record that differ, in two files (either way round; batch mode reads both
    at once): the smallest copy is kept (rule 1), so the rows are the oracle's, whatever the
    order, and those of the smaller copies alone."""
    events = stage_conflicting_copies(tmp_path / "events", order == "smaller-first")
    smaller, _, common = conflicting_copies()
    expected = attribute_batch(smaller + common)
    assert [conflicting_copies_row(r) for r in expected] == CONFLICTING_COPIES_ROWS
    assert attribute_batch(read_events(events)) == expected
    report, rows = run_job(spark, tmp_path, events, *BATCH)
    assert rows == expected
    assert report.late_rows == 0 and report.goals == len(CONFLICTING_COPIES_ROWS)


def test_help_explains_every_option():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    for option in ("--events", "--format", "--output", "--checkpoint", "--mode", "--backend",
                   "--trigger", "--max-files-per-trigger", "--watermark-delay", "--lookback",
                   "--dedup-window", "--state-buckets", "--tws-state", "--models", "--half-life"):
        assert option in out
    assert "10 minutes" in out and "90 days" in out and "1 day" in out
    assert all(model in out for model in MODELS) and "7 days" in out


def test_bad_arguments_fail_with_one_clear_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"),
                             "--events", str(tmp_path / "missing")], capture_output=True, text=True)
    assert result.returncode == 3  # the input cannot be read as asked (checked before Spark)
    assert "is not a directory" in result.stderr
    result = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"),
                             "--events", str(tmp_path), "--lookback", "ninety days"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "not a duration" in result.stderr
    for option, value, error in (
            ("--models", "linear,u_shaped", "error: --models: unknown attribution model "
                                            "'u_shaped'; choose from last_touch, first_touch, "
                                            "linear, position_based, time_decay (or 'all')"),
            ("--models", "", "error: --models: no attribution model given; choose from"),
            ("--half-life", "0", "error: --half-life must be positive, got '0' (e.g. '7 days')"),
            ("--half-life", "a week", "error: --half-life: not a duration: 'a week'"),
            ("--state-buckets", "many", "error: argument --state-buckets: 'many' is not 'auto' "
                                        "or a bucket count from 0 to 4096"),
            ("--state-buckets", "5000", "error: argument --state-buckets: '5000' is not")):
        result = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"),
                                 "--events", str(tmp_path), option, value],
                                capture_output=True, text=True)
        assert result.returncode == 2 and error in result.stderr, (option, value)
        assert "Traceback" not in result.stderr


# Where the job's script goes among ``spark_submit``'s arguments.
JOB = "<the job>"


def spark_submit(*arguments, cwd: Path, conf_dir: Optional[Path] = None
                 ) -> subprocess.CompletedProcess:
    """The attribution job run under the venv's spark-submit, with ``arguments`` before and
    after the script's name (split at ``JOB``); ``conf_dir``: Spark's conf folder instead of the
    environment's (whose spark-defaults.conf ``make jars`` wrote)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if conf_dir is not None:
        env["SPARK_CONF_DIR"] = str(conf_dir)
    at = arguments.index(JOB)
    return subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         *arguments[:at], str(ROOT / "jobs" / "attribution_job.py"), *arguments[at + 1:]],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_spark_submit_without_the_delta_jars_is_refused_in_one_line(tmp_path, ch7_stream_dir):
    # A Spark installation of the user's own: its conf folder holds no defaults of this project.
    (tmp_path / "conf").mkdir()
    result = spark_submit(JOB, "--events", str(ch7_stream_dir), "--output",
                          str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"),
                          cwd=tmp_path, conf_dir=tmp_path / "conf")
    assert result.returncode == 2, result.stdout[-3000:]
    # spark-submit's PythonRunner merges the driver's stderr into its stdout
    assert ("error: Delta Lake not on spark-submit's classpath: add the --jars or --packages "
            "options that 'python -m jvm.artifacts --spark-submit' prints (or --output-format "
            "parquet)") in result.stdout
    assert_no_traceback(result.stdout + result.stderr)
    assert not (tmp_path / "out").exists()


def test_plain_spark_submit_runs_the_job_into_a_delta_table(tmp_path, ch7_stream_dir):
    # No --jars: the environment's spark-defaults.conf (python -m jvm.artifacts) carries them.
    result = spark_submit(
        *SPARK_CODEGEN_DEFAULTS, JOB,
        "--events", str(ch7_stream_dir), "--max-files-per-trigger", "1",
        "--watermark-delay", "3 minutes", "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "cp"), "--report-json", str(tmp_path / "report.json"),
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "attributed     : 2" in result.stdout
    # spark-submit's PythonRunner merges the driver's stderr into its stdout
    assert "batch 0: input 4 rows" in result.stdout + result.stderr
    assert (tmp_path / "out" / "_delta_log").is_dir()
    rows = read_attribution_rows(tmp_path / "out")
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
    assert {r.model for r in rows} == {"last_touch"}  # the default --models
    assert json.loads((tmp_path / "report.json").read_text())["goals"] == 2


def test_a_checkpoint_refuses_a_different_state_layout(spark, tmp_path, ch7_stream_dir):
    """A changed bucket count would silently re-home users' state; the job refuses it."""
    from attribution.spark.checkpoint import CheckpointMismatch

    run_job(spark, tmp_path, ch7_stream_dir, "--max-files-per-trigger", "7")
    for other, was in ((["--state-buckets", "128"], "--state-buckets 64"),
                       (["--backend", "transformWithState"], "--backend applyInPandasWithState"),
                       (["--models", "all"], "--models last_touch;"),
                       (["--models", "last_touch,linear"], "--models last_touch;")):
        with pytest.raises(CheckpointMismatch, match=f"was started with {was}"):
            run_job(spark, tmp_path, ch7_stream_dir, *other)
    report, rows = run_job(spark, tmp_path, ch7_stream_dir)  # the original options still run
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS


def test_the_bucket_count_follows_the_shuffle_partitions_and_stays_with_the_checkpoint(
        spark, tmp_path, ch7_dir, capsys):
    """--state-buckets auto (the default): 32 buckets per shuffle partition for a new checkpoint;
    a restart under another session setting keeps the checkpoint's partitions and buckets. An
    explicit count below the partitions is warned about, and still gives the book's rows."""
    from attribution.spark.checkpoint import LAYOUT_FILE

    files = sorted(ch7_dir.glob("part-*.json"))
    staged = stage_in_arrival_order(files[:3], tmp_path / "ch7")
    layout = tmp_path / "checkpoint" / LAYOUT_FILE
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "3")
        report, _ = run_job(spark, tmp_path, staged, "--watermark-delay", "3 minutes")
        assert json.loads(layout.read_text())["state_buckets"] == 96
        assert "96 buckets of users over 3 shuffle partitions" in report.render()
        spark.conf.set("spark.sql.shuffle.partitions", "5")  # the checkpoint says 3
        stage_in_arrival_order(files, staged)
        report, rows = run_job(spark, tmp_path, staged, "--watermark-delay", "3 minutes")
        assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
        assert json.loads(layout.read_text())["state_buckets"] == 96
        assert "96 buckets of users over 3 shuffle partitions" in report.render()
        assert "warning" not in capsys.readouterr().err

        few = tmp_path / "few"
        few.mkdir()
        report, rows = run_job(spark, few, staged, "--watermark-delay", "3 minutes",
                               "--state-buckets", "2")
        assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
        assert ("warning: 2 state buckets for 5 shuffle partitions: only 2 of the stateful "
                "stage's 5 tasks have state to work on; a new --checkpoint with --state-buckets "
                "auto would use 160") in capsys.readouterr().err
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def test_a_checkpoint_started_with_bucket_numbers_as_keys_keeps_them(spark, tmp_path, ch7_dir):
    """Checkpoints of the version before aligned bucket keys (layout without bucket_keys) hold
    their users under the bucket numbers: a restart must find them there. The first file holds
    both goals; the impressions they are attributed to arrive after the restart."""
    from attribution.spark.checkpoint import LAYOUT_FILE

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    old_layout = {"backend": "applyInPandasWithState", "state_buckets": 64,
                  "state_column": "base64 text"}
    files = sorted(ch7_dir.glob("part-*.json"))
    staged = stage_in_arrival_order(files[:1], tmp_path / "ch7")
    # The first run stands for the old version: bucket numbers as keys, whatever the job infers.
    (checkpoint / LAYOUT_FILE).write_text(json.dumps({**old_layout, "bucket_keys": "index"}))
    run_job(spark, tmp_path, staged, "--watermark-delay", "3 minutes")
    (checkpoint / LAYOUT_FILE).write_text(json.dumps(old_layout))
    stage_in_arrival_order(files, staged)
    report, rows = run_job(spark, tmp_path, staged, "--watermark-delay", "3 minutes")
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
    assert json.loads((checkpoint / LAYOUT_FILE).read_text()).get("bucket_keys") is None


def test_a_checkpoint_with_binary_state_is_refused_with_advice(tmp_path):
    """Checkpoints of versions that kept applyInPandasWithState's state as binary (their layout
    file has no state_column) cannot be read by the text column: one clear refusal, no Spark."""
    from attribution.spark.checkpoint import LAYOUT_FILE, CheckpointMismatch, pin_state_layout
    from jobs.attribution_job import parse_args

    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    (checkpoint / LAYOUT_FILE).write_text(
        json.dumps({"backend": "applyInPandasWithState", "state_buckets": 64}))
    args = parse_args(["--events", str(tmp_path), "--checkpoint", str(checkpoint)])
    with pytest.raises(CheckpointMismatch, match="binary column of an earlier version.*new "
                                                 "--checkpoint"):
        pin_state_layout(args.checkpoint, args.backend, args.state_buckets, args.tws_state)
    # A transformWithState checkpoint of that time is unaffected.
    (checkpoint / LAYOUT_FILE).write_text(
        json.dumps({"backend": "transformWithState", "tws_state": "compact"}))
    args = parse_args(["--events", str(tmp_path), "--checkpoint", str(checkpoint),
                       "--backend", "transformWithState"])
    pin_state_layout(args.checkpoint, args.backend, args.state_buckets, args.tws_state)
