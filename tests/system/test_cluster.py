"""A real Spark standalone cluster: a master and two 1-core workers on 127.0.0.1, started from the
pyspark distribution's ``spark-class``; the job is submitted to it with ``spark-submit`` with
Spark's own settings for code generation, as users submit it, and its output must equal the batch
oracle. ``make test`` submits the transformWithState backend, whose application also runs a
Python worker in the driver, and checks from the event log that the stateful stage ran as
generated code; the applyInPandasWithState backend (the default) runs in ``make test-slow``, on
a cluster of its own.

The executors run a Python that can import pyspark, pandas and pyarrow but *not* this project
(``python -S`` skips the editable install's ``.pth`` hook; a control below proves it), so the job
can only work if ``jobs.runtime.ship_packages`` really delivered the project's packages.

Each application writes Spark's event log; from it, the tasks of the stateful stage (those that
updated the state store's metrics) must have run on both executors, not on one of them.

Every process the test starts (master, workers, spark-submit) gets its own process group, and a
``finally`` stops each group by its PID - SIGTERM, then SIGKILL - even when the test fails.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from attribution.oracle import sort_key
from generators.truth import read_truth
from support import ROOT
from support.commands import SPARK_CODEGEN_DEFAULTS, suite_jvm_options_without_spark_settings
from support.outputs import PARQUET_OUTPUT, committed_attributions

WAIT_SECONDS = 180
# A SQL metric that every stateful operator (a StateStoreWriter) updates in each of its tasks.
STATE_METRIC = "number of total state rows"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _site_packages() -> str:
    import pandas

    return str(Path(pandas.__file__).resolve().parent.parent)


class Daemon:
    """A process in its own process group, logging to a file, stopped by PID."""

    def __init__(self, name: str, command: list[str], env: dict, log_dir: Path, cwd: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {text!r} in time:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM the process group (a worker takes its executors with it), then SIGKILL."""
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; make sure nothing else of its group lingers.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        self.log.close()

    def group_alive(self) -> list[int]:
        """PIDs of this process group still running (zombies excluded: here PID 1 may not reap
        orphans, and a zombie holds no resources)."""
        alive = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            state, pgrp = fields[0], int(fields[2])
            if pgrp == self.pid and state != "Z":
                alive.append(int(entry))
        return alive


def _event_log(event_log_dir: Path) -> list[dict]:
    """The events of the one application's event log in ``event_log_dir``."""
    logs = [p for p in event_log_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    assert logs, f"no event log in {event_log_dir}"
    return [json.loads(line) for log in logs for line in log.read_text().splitlines()]


def _stateful_tasks(events: list[dict]) -> tuple[Counter, set[str]]:
    """From the event log of one application: how many successful tasks that updated the
    state store's metrics each executor ran, and the executors the application had."""
    tasks: Counter = Counter()
    executors: set[str] = set()
    for event in events:
        if event["Event"] == "SparkListenerExecutorAdded":
            executors.add(event["Executor ID"])
        elif (event["Event"] == "SparkListenerTaskEnd"
              and event["Task End Reason"]["Reason"] == "Success"):
            info = event["Task Info"]
            if any(a.get("Name") == STATE_METRIC for a in info.get("Accumulables", [])):
                tasks[info["Executor ID"]] += 1
    return tasks, executors


def _executor_python(tmp_path: Path) -> tuple[Path, Path]:
    """A Python for the executors that sees site-packages but not this project, and the file
    where it logs its command lines (proof that the executors really ran it)."""
    wrapper, calls = tmp_path / "executor-python", tmp_path / "executor-python.calls"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        "# In an executor (its working directory is under a worker's), also forget the driver's\n"
        "# copy of the project that the job puts on the functions' PYTHONPATH: it exists here "
        "only\n"
        "# because driver and workers share this machine. Only the shipped copy may serve.\n"
        'case "$PWD" in */worker-*/app-*)\n'
        '  PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -v streamjoin-pyfiles'
        ' | paste -sd: -) ;;\n'
        "esac\n"
        "# -S: no site.py, so no .pth hooks (the editable install of this project is one).\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{_site_packages()}" '
        f'exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, calls


def _run_on_a_cluster(spark, tmp_path: Path, backend: str) -> list[dict]:
    """Start the cluster, submit the job with ``backend`` to it, stop every process, and check
    the application: the project reached the executors, its output is the oracle's, and the
    stateful stage ran on both executors. Returns its event log's events."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    # Two event files and the heartbeat: three micro-batches, so the state crosses two of them
    # through the executors' state stores, each micro-batch's stateful stage two tasks (one per
    # shuffle partition), one per executor's single core.
    dataset = generate(GeneratorParams(users=12, seed=5, files=2, heartbeat=True,
                                       disorder="bounded", max_delay="2 minutes",
                                       redelivery_rate=0.05, watermark_delay="10 minutes"),
                       tmp_path / "data", plot=False)
    truth = sorted(read_truth(dataset.truth_path), key=sort_key)
    assert truth and any(r.trail for r in truth)

    # The control: the executors' Python has the libraries, and not the project.
    executor_python, executor_calls = _executor_python(tmp_path)
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    probe = subprocess.run([str(executor_python), "-c", "import pyspark, pandas, pyarrow"],
                           cwd=neutral, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    probe = subprocess.run([str(executor_python), "-c", "import attribution"], cwd=neutral,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert "No module named 'attribution'" in probe.stderr

    spark_home = _spark_home()
    spark_class = str(spark_home / "bin" / "spark-class")
    # The master, the workers and the executors run with the JVM options of the suite's drivers
    # (the Makefile's TEST_JVM_OPTS, in SPARK_SUBMIT_OPTS): the JIT's first tier, and the class
    # archive, which needs the drivers' class path, so Spark's own (absent) conf directory.
    # Spark settings among them (-Dspark.*) reach the executors from the driver, and Spark
    # refuses them in spark.executor.extraJavaOptions.
    jvm_options = suite_jvm_options_without_spark_settings()
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": str(executor_python), "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
           "SPARK_DAEMON_JAVA_OPTS": jvm_options, "SPARK_LOG_DIR": str(tmp_path / "logs")}
    for inherited in ("PYTHONPATH", "SPARK_CONF_DIR"):
        env.pop(inherited, None)
    master_port = _free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    daemons: list[Daemon] = []
    try:
        master = Daemon("master", [spark_class, "org.apache.spark.deploy.master.Master",
                                   "--host", "127.0.0.1", "--port", str(master_port),
                                   "--webui-port", str(_free_port())],
                        env, tmp_path, neutral)
        daemons.append(master)
        master.wait_for("I have been elected leader")
        for n in (1, 2):
            work_dir = tmp_path / f"worker-{n}"
            work_dir.mkdir()
            worker = Daemon(f"worker-{n}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(_free_port()), "--webui-port", str(_free_port()),
                "--cores", "1", "--memory", "1536m", "--work-dir", str(work_dir), master_url],
                env, tmp_path, neutral)
            daemons.append(worker)
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")

        (tmp_path / "events").mkdir()
        # Spark's code generation as users have it: the driver's SPARK_SUBMIT_OPTS may carry
        # the suite's interpreted-expression properties, which these --conf override.
        submit = Daemon("spark-submit", [
            str(spark_home / "bin" / "spark-submit"), "--master", master_url,
            *SPARK_CODEGEN_DEFAULTS,
            "--conf", "spark.executor.memory=1g", "--conf", "spark.executor.cores=1",
            "--conf", "spark.cores.max=2", "--conf", "spark.driver.host=127.0.0.1",
            *(["--conf", f"spark.executor.extraJavaOptions={jvm_options}"]
              if jvm_options else []),
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.eventLog.enabled=true",
            # One plain JSON-lines file (Spark 4 rolls and compresses event logs by default).
            "--conf", "spark.eventLog.rolling.enabled=false",
            "--conf", "spark.eventLog.compress=false",
            "--conf", f"spark.eventLog.dir={(tmp_path / 'events').as_uri()}",
            str(ROOT / "jobs" / "attribution_job.py"), "--backend", backend,
            "--events", str(dataset.events_dir), "--output", str(tmp_path / "out"),
            *PARQUET_OUTPUT,
            "--checkpoint", str(tmp_path / "checkpoint"),
            "--max-files-per-trigger", "1", "--watermark-delay", "10 minutes",
            "--shuffle-partitions", "2"],
            env, tmp_path, neutral)
        daemons.append(submit)
        code = submit.proc.wait(timeout=900)
        assert code == 0, submit.output()[-4000:]
        report = submit.output()
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
    survivors = {d.name: d.group_alive() for d in daemons if d.group_alive()}
    assert not survivors, f"cluster processes survived: {survivors}"

    # The executors' Python workers were the wrapper (which cannot import the project by
    # itself), both workers ran an executor, and each received the project's zip.
    assert "pyspark.daemon" in executor_calls.read_text()
    for n in (1, 2):
        executor_dirs = list((tmp_path / f"worker-{n}").glob("app-*/*"))
        assert len(executor_dirs) == 1, f"worker {n} did not run the application's executor"
        assert (executor_dirs[0] / "streamjoin.zip").exists(), \
            f"{executor_dirs[0]} did not receive the project's packages"
    assert f"attribution stream run ({backend})" in report and "late dropped   : 0" in report
    assert committed_attributions(spark, tmp_path / "out") == truth
    # The stateful stage ran on both executors: Spark's own record of where its tasks ran.
    events = _event_log(tmp_path / "events")
    tasks, executors = _stateful_tasks(events)
    assert len(executors) == 2, executors
    assert set(tasks) == executors and min(tasks.values()) > 0, dict(tasks)
    return events


def _generated_code_plans(events: list[dict]) -> list[str]:
    """The physical plans of the application's SQL executions (as its event log describes
    them, in Spark's "formatted" explain mode) with operators compiled into whole-stage
    generated code: the plan gives each such operator its ``[codegen id : N]``. Spark's
    interpreted mode (``spark.sql.codegen.wholeStage=false``) gives none."""
    return [event["physicalPlanDescription"] for event in events
            if event["Event"].endswith("SparkListenerSQLExecutionStart")
            and re.search(r"\[codegen id : \d+\]", event.get("physicalPlanDescription", ""))]


def test_standalone_cluster_runs_the_job_and_matches_the_oracle(spark, tmp_path):
    """transformWithState, with Spark's code generation on: the project shipped to the
    executors and to the driver's Python worker, the oracle's rows, the stateful stage on both
    executors; from the event log, its queries ran with whole-stage generated code."""
    events = _run_on_a_cluster(spark, tmp_path, "transformWithState")
    assert _generated_code_plans(events), "no query of the application ran generated code"


@pytest.mark.slow
def test_standalone_cluster_runs_the_default_backend_and_matches_the_oracle(spark, tmp_path):
    """applyInPandasWithState, the default backend, on a cluster of its own: the same checks."""
    _run_on_a_cluster(spark, tmp_path, "applyInPandasWithState")
