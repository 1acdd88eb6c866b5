"""SIGINT (Ctrl-C) and SIGTERM stop a streaming run cleanly: after the current micro-batch, with
the final report, the documented exit code and no traceback, and the checkpoint as a kill
between two micro-batches or in the middle of one leaves it.

The job runs as a user runs it, a subprocess with its own JVM, over the chapter 7 files with a
processing-time trigger and one file per micro-batch, so it would idle forever after the last
file. The signal is sent once the progress line of batch 1 is printed, with files left to read:
SIGINT to the whole process group, as a terminal's Ctrl-C does (the JVM is in it), SIGTERM to
the driver alone, as ``kill PID`` or a container stop does.

A clean stop of the attribution job leaves its query's checkpoint as a kill between two
micro-batches does (the last planned micro-batch ``N`` committed, no ``offsets/N+1``), or, when
the next trigger was due before the stop reached the query, as a kill in the middle of
micro-batch ``N+1`` does (``offsets/N+1`` planned, not committed); that a rerun from either
gives exactly the batch oracle's rows is proven by the crash tests' kills
(``tests/system/test_reliability_crash.py``), and here by a rerun after the clean stop, for
both jobs. The output is read through Spark, which honours the file
sink's log: files of a micro-batch cut short by the stop do not count.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attribution.oracle import attribute_batch
from attribution.spark.files import read_events
from commandline.exits import ExitCode
from support import ROOT
from support.commands import assert_no_traceback, command_environment
from support.commands import signal_after_batch_1 as run_and_signal
from support.datasets import CH7_DIR, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT, committed_attributions

JOB = ROOT / "jobs" / "attribution_job.py"
WAIT_SECONDS = 900  # a JVM start and a few micro-batches on a loaded 2-core machine
FILES = 7

# signal, backend, exit code, whether it goes to the whole process group
CASES = {"SIGINT": (signal.SIGINT, "applyInPandasWithState", ExitCode.INTERRUPTED, True),
         "SIGTERM": (signal.SIGTERM, "transformWithState", ExitCode.TERMINATED, False)}


def _batch_ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def stopped_after_a_batch(checkpoint: Path) -> list[int]:
    """The micro-batches a query's checkpoint committed, after checking that it was left as a
    kill between two of them or in the middle of one leaves it: every planned micro-batch
    (``offsets/N``) committed (``commits/N``) but, at most, the last one. The stop waits for the
    micro-batch in flight to commit; when the next trigger is already due (a micro-batch longer
    than the trigger interval), Spark plans the next one before the stop reaches it, and the
    stop cancels it uncommitted, to be redone on a restart."""
    planned, committed = _batch_ids(checkpoint / "offsets"), _batch_ids(checkpoint / "commits")
    assert committed, f"{checkpoint}: nothing committed (planned {planned})"
    assert committed == list(range(len(committed))), (checkpoint, planned, committed)
    assert planned in (committed, [*committed, committed[-1] + 1]), (checkpoint, planned,
                                                                     committed)
    return committed


def signal_after_batch_1(command: list, cwd, signum: int, to_group: bool) -> tuple[int, str, str]:
    """Run ``command`` (a job's script and options) with a 3-second processing-time trigger,
    send ``signum`` once its progress line of batch 1 is printed (to the whole process group
    when ``to_group``, as a terminal's Ctrl-C does, else to the driver alone, as ``kill PID``
    does), and return its exit code, stdout and stderr."""
    code, stderr, stdout = run_and_signal(
        [sys.executable, *command, "--trigger", "3 seconds"], cwd, signum, to_group,
        wait_seconds=WAIT_SECONDS)
    return code, stdout, stderr


@pytest.mark.parametrize("name", list(CASES))
def test_a_signal_stops_the_run_after_the_current_batch_with_its_report(spark, tmp_path, name):
    signum, backend, code, to_group = CASES[name]
    events = stage_in_arrival_order(sorted(CH7_DIR.glob("part-*.json")), tmp_path / "events")
    assert len(list(events.iterdir())) == FILES
    options = [str(JOB), "--events", str(events), "--output", "out", "--checkpoint", "cp",
               *PARQUET_OUTPUT,
               "--backend", backend, "--master", "local[2]", "--max-files-per-trigger", "1",
               "--watermark-delay", "3 minutes", "--log-file", "spark.log"]
    returncode, stdout, stderr = signal_after_batch_1(options, tmp_path, signum, to_group)

    assert returncode == code, stderr[-3000:]
    assert_no_traceback(stderr + stdout)
    assert f"{name}: stopping after the current micro-batch" in stderr
    assert stderr.rstrip().splitlines()[-1] == (
        f"stopped by {name}; rerun with the same --checkpoint to resume")
    title, *fields = stdout.rstrip().splitlines()
    assert title.startswith(f"attribution stream run ({backend}) stopped by {name} in "), stdout
    batches = int(re.search(r"over (\d+) batch", title).group(1))
    assert 2 <= batches < FILES  # stopped after batch 1's successor at the latest, files left
    for label in ("input rows", "goals", "attributed", "users in state", "watermark", "output"):
        assert any(f.strip().startswith(label) for f in fields), (label, stdout)

    # The query committed the micro-batches the report counts, and at most a cancelled one
    # after them: the state a rerun starts from (the dead letter comes from the same query's
    # micro-batches).
    assert stopped_after_a_batch(tmp_path / "cp") == list(range(batches))

    # The rerun on the same checkpoint completes the run: exactly the batch oracle's rows.
    rerun = subprocess.run([sys.executable, *options], cwd=tmp_path, capture_output=True,
                           text=True, env=command_environment(), timeout=WAIT_SECONDS)
    assert rerun.returncode == ExitCode.OK, rerun.stderr[-3000:]
    assert_no_traceback(rerun.stderr + rerun.stdout)
    assert committed_attributions(spark, tmp_path / "out") == attribute_batch(read_events(events))


JOIN_JOB = ROOT / "jobs" / "join_job.py"


# The second tier: make test stops the join job with SIGINT under spark-submit
# (tests/system/test_spark_submit.py).
@pytest.mark.slow
def test_a_signal_stops_the_join_job_after_the_current_batch_and_a_rerun_completes_it(
        spark, tmp_path):
    """The join job handles SIGTERM as the attribution job does: the micro-batch in flight
    commits, the report names the signal, the exit code is 143, and a rerun on the same
    checkpoint gives exactly the rows of an uninterrupted run."""
    from jobs import join_job

    events = stage_in_arrival_order(sorted(CH7_DIR.glob("part-*.json")), tmp_path / "events")
    common = ["--events", str(events), "--max-files-per-trigger", "1", "--window", "1 hour",
              "--max-delay", "3 minutes", "--strategy", "state-key"]
    options = [str(JOIN_JOB), *common, "--output", "out", "--checkpoint", "cp",
               *PARQUET_OUTPUT,
               "--master", "local[2]", "--log-file", "spark.log"]
    returncode, stdout, stderr = signal_after_batch_1(options, tmp_path, signal.SIGTERM, False)

    assert returncode == ExitCode.TERMINATED, stderr[-3000:]
    assert_no_traceback(stderr + stdout)
    assert "SIGTERM: stopping after the current micro-batch" in stderr
    assert stderr.rstrip().splitlines()[-1] == (
        "stopped by SIGTERM; rerun with the same --checkpoint to resume")
    title = stdout.strip().splitlines()[0]
    assert title.startswith("click-through join (state-key, inner) stopped by SIGTERM: "), stdout
    batches = int(re.search(r": (\d+) batch", title).group(1))
    assert 2 <= batches < FILES

    rerun = subprocess.run([sys.executable, *options], cwd=tmp_path, capture_output=True,
                           text=True, env=command_environment(), timeout=WAIT_SECONDS)
    assert rerun.returncode == ExitCode.OK, rerun.stderr[-3000:]
    assert_no_traceback(rerun.stderr + rerun.stdout)

    join_job.run(spark, join_job.parse_args(
        [*common, "--output", str(tmp_path / "whole"), "--checkpoint", str(tmp_path / "cp2"),
         *PARQUET_OUTPUT,
         "--quiet"]))

    def rows(path):
        return sorted(tuple(r) for r in spark.read.parquet(str(path)).collect())

    uninterrupted = rows(tmp_path / "whole")
    assert uninterrupted  # the ch7 clicks join
    assert rows(tmp_path / "out") == uninterrupted
