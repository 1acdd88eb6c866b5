"""Running a command as a user would, and reading what it prints.

* ``command_environment``, ``obey_file_permissions``: the environment and permissions of a
  user's shell;
* ``suite_jvm_options_without_spark_settings``, ``SPARK_CODEGEN_DEFAULTS``,
  ``spark_submit_jar_options``: the JVM options and jars of runs that stand for a user;
* ``signal_after_batch_1``: a signal to a running job once its second micro-batch committed;
* ``assert_no_traceback``, ``error_line``, ``TRACEBACK_MARKERS``: a failure's one line on
  stderr, and no traceback.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional, Sequence

# What a Python or a Java stack trace prints; none of it may reach a user's terminal.
TRACEBACK_MARKERS = ("Traceback (most recent call last)", "\tat org.", "\tat java.",
                     "Exception in thread", "py4j.protocol", "Py4JJavaError")


# Spark's own defaults for its code generation. `make test` runs every driver JVM on Spark's
# interpreted expressions instead (TEST_SPARK_PROPS in the Makefile); the spark-submit runs of
# each job give these back, so that the suite also runs both jobs as users do.
SPARK_CODEGEN_DEFAULTS = ["--conf", "spark.sql.codegen.wholeStage=true",
                          "--conf", "spark.sql.codegen.factoryMode=FALLBACK"]


def suite_jvm_options_without_spark_settings() -> str:
    """The suite's JVM options (``SPARK_SUBMIT_OPTS``: the JIT's first tier and more) less the
    Spark settings among them (``-Dspark.*``: the interpreted expressions), for a JVM
    that runs with Spark's defaults, as users run it, or that may not take Spark settings (the
    cluster's daemons and executors)."""
    return " ".join(option for option in os.environ.get("SPARK_SUBMIT_OPTS", "").split()
                    if not option.startswith("-Dspark."))


def spark_submit_jar_options() -> list:
    """The documented spark-submit options that carry the project's jars (``--jars`` with the
    fetched ``spark`` profile, and Delta's session settings), as arguments."""
    from jvm import artifacts

    jars = artifacts.fetched_jars(artifacts.SPARK) or artifacts.fetch(artifacts.SPARK)
    conf = [arg for key, value in artifacts.DELTA_CONF.items()
            for arg in ("--conf", f"{key}={value}")]
    return ["--jars", ",".join(str(jar) for jar in jars), *conf]


def command_environment() -> dict:
    """The environment for a command run as a subprocess: this interpreter for Spark's Python."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def obey_file_permissions() -> None:
    """``preexec_fn`` for a subprocess that must obey file permissions even as root (which tests
    often run as): drops the capabilities that override them (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH) from its bounding set, so the command it executes never has them."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def assert_no_traceback(text: str) -> None:
    """Fail if ``text`` holds any part of a Python or Java stack trace."""
    found = [marker for marker in TRACEBACK_MARKERS if marker in text]
    if found:  # the trace's start names its thread and exception; its end may be frames only
        start = max(0, min(text.index(marker) for marker in found) - 500)
        raise AssertionError(f"a traceback reached the terminal ({found}):\n"
                             f"{text[start:start + 2500]}\n[...]\n{text[-500:]}")


def error_line(stderr: str) -> str:
    """The one ``error:`` line a failed command must end its stderr with, after checking that
    it is the last line, the only one, and that no traceback came before it."""
    assert_no_traceback(stderr)
    lines = stderr.rstrip("\n").splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("error: "), f"stderr does not end with an error line:\n{stderr}"
    assert sum(line.startswith("error: ") for line in lines) == 1, stderr
    return lines[-1]


def signal_after_batch_1(command: Sequence[str], cwd, signum: int, to_group: bool = False,
                         watch: str = "stderr", env: Optional[dict] = None,
                         wait_seconds: int = 900) -> tuple[int, str, str]:
    """Run a streaming job's ``command``, send it ``signum`` once its progress line of batch 1
    is printed on its ``watch`` stream (``stderr``, or ``stdout`` under spark-submit, which
    merges the driver's stderr into it), and return its exit code, the watched stream's text and
    the other stream's.

    :param command: the command line (the job should have files left after batch 1).
    :param cwd: its working directory.
    :param signum: the signal.
    :param to_group: send it to the whole process group, as a terminal's Ctrl-C does; else to
        the process alone, as ``kill PID`` or a container stop does.
    :param watch: the stream the progress lines are on.
    :param env: its environment (default: ``command_environment()``).
    :param wait_seconds: a watchdog kills the group after this long.
    """
    import signal
    import subprocess
    import threading

    def as_from_a_terminal() -> None:
        # A shell's background jobs start with SIGINT ignored, and a JVM keeps what it
        # inherits: the job gets the signals' defaults, as a command typed in a terminal has.
        for default in (signal.SIGINT, signal.SIGTERM):
            signal.signal(default, signal.SIG_DFL)

    job = subprocess.Popen(list(command), cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env or command_environment(),
                           start_new_session=True, preexec_fn=as_from_a_terminal)
    watchdog = threading.Timer(wait_seconds, os.killpg, (job.pid, signal.SIGKILL))
    watchdog.start()
    try:
        before = []
        for line in getattr(job, watch):
            before.append(line)
            if line.startswith("batch 1:"):
                break
        assert before and before[-1].startswith("batch 1:"), "".join(before)
        (os.killpg if to_group else os.kill)(job.pid, signum)
        stdout, stderr = job.communicate()
    finally:
        watchdog.cancel()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    if watch == "stdout":
        return job.returncode, "".join(before) + stdout, stderr
    return job.returncode, "".join(before) + stderr, stdout
