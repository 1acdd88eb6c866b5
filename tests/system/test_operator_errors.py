"""Every failure a user can cause ends a command with one ``error:`` line naming the cause and
the fix, and with the documented exit code; no Python or Java traceback reaches the terminal.

The commands run as a user runs them, as subprocesses from a working directory of their own
(``python jobs/attribution_job.py ...``, ``python -m generators ...``). All but the corrupt-file
case are refused before Spark starts, so they take seconds.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attribution.spark.checkpoint import LAYOUT_FILE, pin_state_layout
from commandline.exits import ExitCode
from support import (
    CH7_DIR,
    ROOT,
    assert_no_traceback,
    command_environment,
    error_line,
    obey_file_permissions,
    stage_in_arrival_order,
)

JOB = ROOT / "jobs" / "attribution_job.py"
JOIN_JOB = ROOT / "jobs" / "join_job.py"


def _command(cwd: Path, *argv, obey_permissions: bool = False, timeout: int = 600):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True,
                          text=True, env=command_environment(), timeout=timeout,
                          preexec_fn=obey_file_permissions if obey_permissions else None)


def _job(cwd: Path, *options, **kwargs):
    return _command(cwd, JOB, *options, **kwargs)


@pytest.fixture
def events(tmp_path) -> Path:
    return stage_in_arrival_order(sorted(CH7_DIR.glob("part-*.json")), tmp_path / "events")


def _fails(result, code: ExitCode, *words: str) -> str:
    """The command failed with ``code`` and one error line holding every one of ``words``."""
    line = error_line(result.stderr)
    assert result.returncode == code, (result.returncode, result.stderr)
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def read_only_dir(tmp_path):
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    yield directory
    directory.chmod(0o755)


@pytest.mark.parametrize("option", ["--output", "--dead-letter"])
def test_an_output_directory_that_is_a_file(tmp_path, events, option):
    (tmp_path / "taken").write_text("not a directory\n")
    result = _job(tmp_path, "--events", events, option, "taken")
    _fails(result, ExitCode.OUTPUT, f"{option} taken is a file", "give a directory")
    result = _job(tmp_path, "--events", events, option, "taken/below")
    _fails(result, ExitCode.OUTPUT, f"{option} taken/below cannot be created", "is a file")


@pytest.mark.parametrize("option", ["--output", "--dead-letter"])
def test_an_output_directory_that_cannot_be_written(tmp_path, events, read_only_dir, option):
    result = _job(tmp_path, "--events", events, option, read_only_dir / "out",
                  obey_permissions=True)
    _fails(result, ExitCode.OUTPUT, f"{option} {read_only_dir / 'out'} cannot be created",
           "is not writable", "choose a writable directory")
    result = _job(tmp_path, "--events", events, option, read_only_dir, obey_permissions=True)
    _fails(result, ExitCode.OUTPUT, f"{option} {read_only_dir} is not writable")


def test_an_output_directory_of_another_query(tmp_path, events):
    """A new checkpoint writing into another query's file-sink output would have its first
    micro-batches skipped by the sink as already written."""
    metadata = tmp_path / "out" / "_spark_metadata"
    metadata.mkdir(parents=True)
    (metadata / "0").write_text("v1\n")
    result = _job(tmp_path, "--events", events, "--output", "out", "--checkpoint", "new")
    _fails(result, ExitCode.OUTPUT, "--output out holds the output of another streaming query",
           "checkpoint new is new", "Give a new --output, or the --checkpoint that wrote it")


def test_a_checkpoint_that_is_a_file_or_cannot_be_written(tmp_path, events, read_only_dir):
    (tmp_path / "taken").write_text("")
    _fails(_job(tmp_path, "--events", events, "--checkpoint", "taken"), ExitCode.CHECKPOINT,
           "--checkpoint taken is a file")
    _fails(_job(tmp_path, "--events", events, "--checkpoint", read_only_dir / "cp",
                obey_permissions=True),
           ExitCode.CHECKPOINT, "is not writable")


# An option value the job refuses as it parses its command line (argparse's usage error, exit
# code 2): the option, the value, and the words of the error line that name both.
BAD_DURATIONS = {
    "negative lateness": ("--allowed-lateness", "-1 hour",
                          "--allowed-lateness must not be negative, got '-1 hour'"),
    "unparseable lateness": ("--allowed-lateness", "an hour",
                             "--allowed-lateness: not a duration: 'an hour'"),
    "lateness without unit": ("--allowed-lateness", "5", "--allowed-lateness: '5' has no unit"),
    "negative half-life": ("--half-life", "-1 day", "--half-life must not be negative, got "
                                                    "'-1 day'"),
    "zero half-life": ("--half-life", "0", "--half-life must be positive, got '0'"),
    "zero days of half-life": ("--half-life", "0 days",
                               "--half-life must be positive, got '0 days' (e.g. '7 days')"),
}


@pytest.mark.parametrize("case", list(BAD_DURATIONS))
def test_a_bad_allowed_lateness_or_half_life_is_refused_before_spark(tmp_path, events, case):
    option, value, words = BAD_DURATIONS[case]
    result = _job(tmp_path, "--events", events, "--models", "time_decay", option, value)
    assert result.returncode == ExitCode.USAGE, (result.returncode, result.stderr)
    assert_no_traceback(result.stderr)
    lines = result.stderr.rstrip("\n").splitlines()
    assert sum("error:" in line for line in lines) == 1, result.stderr
    assert lines[-1].startswith(f"attribution_job.py: error: {words}"), lines[-1]
    assert "starting Spark" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before Spark: no log, no output


# The format a first run pinned, this run's options, and words of the error line.
STARTED_WITH_OTHER = {
    "input path": ("json", lambda events, other: ["--events", other],
                   ["was started on --events {events}", "this run reads --events {other}",
                    "rerun with --events {events}"]),
    "input format": ("parquet", lambda events, other: ["--events", events],
                     ["was started with --format parquet", "asks for --format json"]),
    "backend": ("json", lambda events, other: ["--events", events,
                                               "--backend", "transformWithState"],
                ["was started with --backend applyInPandasWithState",
                 "this run asks for --backend transformWithState"]),
    "state layout": ("json", lambda events, other: ["--events", events, "--state-buckets", "128"],
                     ["was started with --state-buckets 64;",
                      "this run asks for --state-buckets 128."]),
}


@pytest.mark.parametrize("case", list(STARTED_WITH_OTHER))
def test_a_checkpoint_started_with_other_input_or_layout_is_refused_before_spark(
        tmp_path, events, case):
    """The checkpoint is pinned as a first run pins it (nothing else of a first run matters to
    the check, which is made before Spark starts)."""
    pinned_format, options, words = STARTED_WITH_OTHER[case]
    other = tmp_path / "other-events"
    other.mkdir()
    (other / "part-00000.json").write_text((events / "part-00000.json").read_text())
    pin_state_layout(str(tmp_path / "cp"), "applyInPandasWithState", 64, "compact",
                     events=str(events), input_format=pinned_format)
    result = _job(tmp_path, *options(events, other), "--checkpoint", "cp")
    line = _fails(result, ExitCode.CHECKPOINT, "checkpoint cp", "new --checkpoint")
    for word in words:
        assert word.format(events=events.resolve(), other=other.resolve()) in line, line
    assert not (tmp_path / "out").exists()  # refused before Spark: nothing was started


def test_a_checkpoint_of_an_older_version_gets_its_input_recorded(tmp_path, events):
    """A layout file without input (written before the input was recorded) accepts the first
    input it sees and records it; the next run with another input is refused."""
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    old = {"backend": "transformWithState", "tws_state": "compact"}
    (checkpoint / LAYOUT_FILE).write_text(json.dumps(old))
    pin_state_layout(str(checkpoint), "transformWithState", 64, "compact", events=str(events),
                     input_format="json")
    assert json.loads((checkpoint / LAYOUT_FILE).read_text()) == {
        **old, "events": str(events.resolve()), "format": "json"}
    result = _job(tmp_path, "--events", tmp_path, "--checkpoint", "cp",
                  "--backend", "transformWithState")
    _fails(result, ExitCode.CHECKPOINT, f"was started on --events {events.resolve()}")


def test_input_of_another_format_is_refused_not_read_as_nothing(tmp_path, events):
    result = _job(tmp_path, "--events", events, "--format", "parquet")
    _fails(result, ExitCode.INPUT,
           f"--format parquet but {events} holds 7 .json/.jsonl files and no .parquet file",
           "use --format json")


def test_an_unreadable_input_directory(tmp_path, events):
    events.chmod(0o000)
    try:
        result = _job(tmp_path, "--events", events, obey_permissions=True)
    finally:
        events.chmod(0o755)
    _fails(result, ExitCode.INPUT, f"--events {events} cannot be read by this user",
           "change its permissions")


@pytest.mark.slow
def test_a_corrupt_input_file_ends_in_one_line_and_spark_logs_to_a_file(tmp_path):
    """A Parquet file whose impression_id is text cannot be decoded by Spark at all: the join
    job stops with one line naming the file and the way to resume (the attribution job
    dead-letters it: ``tests/spark/test_dead_letter.py``). Spark's own complaints (the failed
    task, its Java stack) are in the log file the line names, not on the terminal."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    events = tmp_path / "events"
    events.mkdir()
    pq.write_table(pa.table({"event_id": ["i-1"], "user_id": ["u"], "event_type": ["impression"],
                             "ts": pa.array([0], pa.timestamp("us", tz="UTC")),
                             "impression_id": ["one-two-three"], "source_url": ["/s"],
                             "target_url": ["/t"]}), events / "part-00000.parquet")
    result = _command(tmp_path, JOIN_JOB, "--events", events, "--format", "parquet",
                      "--master", "local[2]", "--log-file", "spark.log")
    line = _fails(result, ExitCode.INPUT, "part-00000.parquet cannot be read as events",
                  "same --checkpoint", "Spark's log: spark.log")
    assert "impression_id" in line
    assert result.stderr.startswith("starting Spark (local[2]); Spark's log: spark.log")
    log = (tmp_path / "spark.log").read_text()
    assert "part-00000.parquet" in log and "\tat org.apache.spark" in log


def test_generate_and_stream_refuse_an_output_that_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("")
    for command in ("generate", "stream"):
        result = _command(tmp_path, "-m", "generators", command, "--out", "taken")
        _fails(result, ExitCode.OUTPUT, "--out taken is a file")


def test_the_join_job_shares_the_machinery(tmp_path, events):
    (tmp_path / "taken").write_text("")
    _fails(_command(tmp_path, JOIN_JOB, "--events", events, "--output", "taken"),
           ExitCode.OUTPUT, "--output taken is a file")
    _fails(_command(tmp_path, JOIN_JOB, "--events", events, "--format", "parquet"),
           ExitCode.INPUT, "use --format json")


@pytest.mark.parametrize("command", [[JOB], [JOIN_JOB], ["-m", "generators"]])
def test_help_documents_the_exit_codes(tmp_path, command):
    result = _command(tmp_path, *command, "--help")
    assert result.returncode == 0
    assert_no_traceback(result.stderr)
    help_text = result.stdout
    assert "exit codes:" in help_text
    for code in (ExitCode.USAGE, ExitCode.OUTPUT, ExitCode.INTERRUPTED, ExitCode.TERMINATED):
        assert f"\n  {int(code):<4} " in help_text, (code, help_text)
    if command != ["-m", "generators"]:
        for code in (ExitCode.FAILED, ExitCode.INPUT, ExitCode.CHECKPOINT):
            assert f"\n  {int(code):<4} " in help_text, (code, help_text)
