"""Every failure a user can cause ends a command with one ``error:`` line naming the cause and
the fix, and with the documented exit code; no Python or Java traceback reaches the terminal.

All but the corrupt-file case are refused before Spark starts. Those refusals run in this
process, through the command's own entry (``main(argv)`` of ``jobs.attribution_job``,
``jobs.join_job`` and ``generators.cli``) from a working directory of their own, with the
stderr, stdout and exit code a user would see (argparse's usage errors as its ``SystemExit``);
starting Spark there fails the test. A few run as a user runs them, as subprocesses
(``python jobs/attribution_job.py ...``), so that the real process path stays proven: one
refusal of each exit code's kind (a usage error; an unreadable input; an output and a
checkpoint that cannot be written, which must be subprocesses anyway, to drop the root
capabilities that override file permissions), the corrupt file, which Spark reads, and
``--help``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attribution.spark.checkpoint import LAYOUT_FILE, pin_state_layout
from commandline.exits import ExitCode
from generators import cli as generators_cli
from jobs import attribution_job, command, join_job
from support import ROOT
from support.commands import (
    assert_no_traceback,
    command_environment,
    error_line,
    obey_file_permissions,
)
from support.datasets import CH7_DIR, stage_in_arrival_order

JOB = ROOT / "jobs" / "attribution_job.py"
JOIN_JOB = ROOT / "jobs" / "join_job.py"


def _command(cwd: Path, *argv, obey_permissions: bool = False, timeout: int = 600):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True,
                          text=True, env=command_environment(), timeout=timeout,
                          preexec_fn=obey_file_permissions if obey_permissions else None)


def _job(cwd: Path, *options, **kwargs):
    return _command(cwd, JOB, *options, **kwargs)


def _spark_must_not_start(*args, **kwargs):
    pytest.fail("the command started Spark: it must refuse this before Spark starts",
                pytrace=False)


@pytest.fixture
def in_process(tmp_path, monkeypatch, capsys):
    """Runs a command's entry (``main(argv)``) here, from ``tmp_path`` as its working directory,
    and returns what a subprocess would: a ``CompletedProcess`` with its exit code (``main``'s
    return value, or the code of argparse's ``SystemExit``), stdout and stderr. Starting Spark
    fails the test: every refusal run so comes before it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(command, "start_spark", _spark_must_not_start)

    def run(entry, *argv) -> subprocess.CompletedProcess:
        argv = [str(arg) for arg in argv]
        capsys.readouterr()  # what came before is not the command's
        try:
            code = entry(argv)
        except SystemExit as exit_:
            code = exit_.code
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)

    return run


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
def test_an_output_directory_that_is_a_file(tmp_path, events, in_process, option):
    (tmp_path / "taken").write_text("not a directory\n")
    result = in_process(attribution_job.main, "--events", events, option, "taken")
    _fails(result, ExitCode.OUTPUT, f"{option} taken is a file", "give a directory")
    result = in_process(attribution_job.main, "--events", events, option, "taken/below")
    _fails(result, ExitCode.OUTPUT, f"{option} taken/below cannot be created", "is a file")


@pytest.mark.parametrize("option", ["--output", "--dead-letter"])
def test_an_output_directory_that_cannot_be_written(tmp_path, events, read_only_dir, option):
    result = _job(tmp_path, "--events", events, option, read_only_dir / "out",
                  obey_permissions=True)
    _fails(result, ExitCode.OUTPUT, f"{option} {read_only_dir / 'out'} cannot be created",
           "is not writable", "choose a writable directory")
    result = _job(tmp_path, "--events", events, option, read_only_dir, obey_permissions=True)
    _fails(result, ExitCode.OUTPUT, f"{option} {read_only_dir} is not writable")


def test_an_output_directory_of_another_query(tmp_path, events, in_process):
    """A new checkpoint writing into another query's file-sink output would have its first
    micro-batches skipped by the sink as already written."""
    metadata = tmp_path / "out" / "_spark_metadata"
    metadata.mkdir(parents=True)
    (metadata / "0").write_text("v1\n")
    result = in_process(attribution_job.main, "--events", events, "--output", "out",
                        "--checkpoint", "new")
    _fails(result, ExitCode.OUTPUT, "--output out holds the output of another streaming query",
           "checkpoint new is new", "Give a new --output, or the --checkpoint that wrote it")


def test_a_checkpoint_that_is_a_file_or_cannot_be_written(tmp_path, events, read_only_dir,
                                                          in_process):
    (tmp_path / "taken").write_text("")
    _fails(in_process(attribution_job.main, "--events", events, "--checkpoint", "taken"),
           ExitCode.CHECKPOINT, "--checkpoint taken is a file")
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


def _refused_duration(result, tmp_path, words: str) -> None:
    """The job refused an option value with argparse's usage error and nothing else."""
    assert result.returncode == ExitCode.USAGE, (result.returncode, result.stderr)
    assert_no_traceback(result.stderr)
    lines = result.stderr.rstrip("\n").splitlines()
    assert sum("error:" in line for line in lines) == 1, result.stderr
    assert lines[-1].startswith(f"attribution_job.py: error: {words}"), lines[-1]
    assert "starting Spark" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before Spark: no log, no output


@pytest.mark.parametrize("case", list(BAD_DURATIONS))
def test_a_bad_allowed_lateness_or_half_life_is_refused_before_spark(tmp_path, events, case,
                                                                     in_process):
    option, value, words = BAD_DURATIONS[case]
    result = in_process(attribution_job.main, "--events", events, "--models", "time_decay",
                        option, value)
    _refused_duration(result, tmp_path, words)


def test_a_usage_error_ends_the_real_process_with_exit_code_2(tmp_path, events):
    """One usage error as a user meets it: ``python jobs/attribution_job.py`` in a process of
    its own."""
    option, value, words = BAD_DURATIONS["negative lateness"]
    result = _job(tmp_path, "--events", events, "--models", "time_decay", option, value)
    _refused_duration(result, tmp_path, words)


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
        tmp_path, events, case, in_process):
    """The checkpoint is pinned as a first run pins it (nothing else of a first run matters to
    the check, which is made before Spark starts)."""
    pinned_format, options, words = STARTED_WITH_OTHER[case]
    other = tmp_path / "other-events"
    other.mkdir()
    (other / "part-00000.json").write_text((events / "part-00000.json").read_text())
    pin_state_layout(str(tmp_path / "cp"), "applyInPandasWithState", 64, "compact",
                     events=str(events), input_format=pinned_format)
    result = in_process(attribution_job.main, *options(events, other), "--checkpoint", "cp")
    line = _fails(result, ExitCode.CHECKPOINT, "checkpoint cp", "new --checkpoint")
    for word in words:
        assert word.format(events=events.resolve(), other=other.resolve()) in line, line
    assert not (tmp_path / "out").exists()  # refused before Spark: nothing was started


def test_a_checkpoint_of_an_older_version_gets_its_input_recorded(tmp_path, events,
                                                                  in_process):
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
    result = in_process(attribution_job.main, "--events", tmp_path, "--checkpoint", "cp",
                        "--backend", "transformWithState")
    _fails(result, ExitCode.CHECKPOINT, f"was started on --events {events.resolve()}")


def test_input_of_another_format_is_refused_not_read_as_nothing(tmp_path, events, in_process):
    result = in_process(attribution_job.main, "--events", events, "--format", "parquet")
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


def test_generate_and_stream_refuse_an_output_that_is_a_file(tmp_path, in_process):
    (tmp_path / "taken").write_text("")
    for name in ("generate", "stream"):
        result = in_process(generators_cli.main, name, "--out", "taken")
        _fails(result, ExitCode.OUTPUT, "--out taken is a file")


def test_the_join_job_shares_the_machinery(tmp_path, events, in_process):
    (tmp_path / "taken").write_text("")
    _fails(in_process(join_job.main, "--events", events, "--output", "taken"),
           ExitCode.OUTPUT, "--output taken is a file")
    _fails(in_process(join_job.main, "--events", events, "--format", "parquet"),
           ExitCode.INPUT, "use --format json")


def _documents_the_exit_codes(result, every_kind: bool) -> None:
    """``--help`` succeeded and lists the exit codes (``every_kind``: the jobs' too)."""
    assert result.returncode == 0
    assert_no_traceback(result.stderr)
    help_text = result.stdout
    assert "exit codes:" in help_text
    for code in (ExitCode.USAGE, ExitCode.OUTPUT, ExitCode.INTERRUPTED, ExitCode.TERMINATED):
        assert f"\n  {int(code):<4} " in help_text, (code, help_text)
    if every_kind:
        for code in (ExitCode.FAILED, ExitCode.INPUT, ExitCode.CHECKPOINT):
            assert f"\n  {int(code):<4} " in help_text, (code, help_text)


def test_help_documents_the_exit_codes(tmp_path):
    """The attribution job's ``--help``, in a process of its own as a user asks for it."""
    _documents_the_exit_codes(_command(tmp_path, JOB, "--help"), every_kind=True)


@pytest.mark.parametrize("entry", [join_job.main, generators_cli.main],
                         ids=["join_job", "generators"])
def test_help_of_the_other_commands_documents_the_exit_codes(in_process, entry):
    _documents_the_exit_codes(in_process(entry, "--help"),
                              every_kind=entry is not generators_cli.main)
