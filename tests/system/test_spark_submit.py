"""Both jobs run the documented way, under ``spark-submit`` with Spark's own settings for code
generation, as users run them: a signal to the spark-submit process stops the run after the
current micro-batch with the final report and the signal's exit code, and Spark's log goes to
``--log-file``: no line of Spark's or the JVM's log reaches the terminal. spark-submit is given
no jars: the environment's Spark defaults carry them (``python -m jvm.artifacts``). The
attribution job gets SIGTERM (as ``kill PID`` or a scheduler sends it: exit code 143), the join
job SIGINT (exit code 130); the second tier sends each job the other signal.

Under spark-submit the JVM is the process signalled, and it started the Python driver as its
child; the job hands the JVM's SIGTERM and SIGINT to its own stop request (``jobs.runtime``,
the same for both jobs). Each run also asks for the Spark UI (``--conf spark.ui.enabled=true``,
whose address the job prints) and for its progress as JSON lines (``--progress-json``), one per
micro-batch.
"""
from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest

from commandline.exits import ExitCode
from support import ROOT
from support.commands import (
    SPARK_CODEGEN_DEFAULTS,
    assert_no_traceback,
    signal_after_batch_1,
)
from support.datasets import CH7_DIR, stage_in_arrival_order

SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
WAIT_SECONDS = 900  # a JVM start and a few micro-batches on a loaded 2-core machine
FILES = 7
# A log line of Spark's (log4j's pattern), of log4j itself, or of the JVM ("WARNING: ...").
LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ |log4j|^WARNING: |^NOTE: ")
# The one line the JVM prints itself before any setting applies: Spark's launcher adds the
# module (docs/attribution-job.md, "Running it").
JVM_OWN_LINE = "WARNING: Using incubator modules: jdk.incubator.vector"

# job -> its script, its own options, and the first words of its report's title
JOBS = {
    "attribution": ("attribution_job.py", ["--watermark-delay", "3 minutes"],
                    "attribution stream run (applyInPandasWithState) stopped by {} in "),
    "join": ("join_job.py", ["--strategy", "state-key", "--max-delay", "3 minutes"],
             "click-through join (state-key, inner) stopped by {}: "),
}
EXIT_CODES = {signal.SIGTERM: ExitCode.TERMINATED, signal.SIGINT: ExitCode.INTERRUPTED}
# make test: SIGTERM to the attribution job, SIGINT to the join job; the other two pairs are the
# second tier's.
CASES = [pytest.param("attribution", signal.SIGTERM, id="attribution-SIGTERM"),
         pytest.param("join", signal.SIGINT, id="join-SIGINT"),
         pytest.param("attribution", signal.SIGINT, id="attribution-SIGINT",
                      marks=pytest.mark.slow),
         pytest.param("join", signal.SIGTERM, id="join-SIGTERM", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, signum", CASES)
def test_a_signal_to_spark_submit_stops_after_the_batch_with_the_report(tmp_path, name, signum):
    script, options, title = JOBS[name]
    exit_code = EXIT_CODES[signum]
    signal_name = signal.Signals(signum).name
    events = stage_in_arrival_order(sorted(CH7_DIR.glob("part-*.json")), tmp_path / "events")
    command = [str(SPARK_SUBMIT), "--master", "local[2]", *SPARK_CODEGEN_DEFAULTS,
               str(ROOT / "jobs" / script),
               "--events", str(events), "--output", "out", "--checkpoint", "cp",
               "--max-files-per-trigger", "1", "--trigger", "3 seconds",
               "--log-file", "spark.log", "--progress-json", "progress.jsonl",
               "--conf", "spark.ui.enabled=true", *options]
    # spark-submit's PythonRunner merges the driver's stderr into its stdout; the signal goes
    # to spark-submit's process alone: the JVM.
    code, output, jvm_stderr = signal_after_batch_1(command, tmp_path, signum, watch="stdout",
                                                    wait_seconds=WAIT_SECONDS)

    assert code == exit_code, (output + jvm_stderr)[-3000:]
    assert_no_traceback(output + jvm_stderr)
    assert f"{signal_name}: stopping after the current micro-batch" in output
    lines = output.rstrip().splitlines()
    assert lines[-1] == f"stopped by {signal_name}; rerun with the same --checkpoint to resume"
    report = next(line for line in lines if line.startswith(title.format(signal_name)))
    batches = int(re.search(r"(\d+) batch", report).group(1))
    assert 2 <= batches < FILES  # stopped after batch 1's successor at the latest, files left

    # Spark's log is in the file, none of its lines on the terminal.
    assert not [line for line in (output + jvm_stderr).splitlines()
                if LOG_LINE.search(line) and line != JVM_OWN_LINE], (output + jvm_stderr)[-3000:]
    assert " INFO SparkContext: Running Spark version" in (tmp_path / "spark.log").read_text()
    assert re.search(r"^Spark UI: http://\S+:\d+$", output, re.M), output[-3000:]
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text()
                .splitlines()]
    assert len(progress) == batches
    assert [p.get("batch", p.get("batch_id")) for p in progress] == list(range(batches))
