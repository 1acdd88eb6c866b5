"""``kafka-local``, run as a user runs it: ``start`` prints the bootstrap line last and within
60 s, the broker's JVM takes ``KAFKA_OPTS``, ``stop`` ends the broker's process, and a restart
on the same directory keeps its topics."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from jvm.kafka_local import BrokerDir, _is_broker
from support import ROOT
from support.commands import assert_no_traceback

COMMAND = [sys.executable, "-m", "jvm.kafka_local"]


def _run(*args: str, kafka_opts: str = "") -> subprocess.CompletedProcess:
    """``kafka-local`` with ``args``; ``kafka_opts`` added to the inherited ``KAFKA_OPTS``."""
    env = {**os.environ,
           "KAFKA_OPTS": " ".join(filter(None, [os.environ.get("KAFKA_OPTS"), kafka_opts]))}
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, check=False,
                          cwd=ROOT, timeout=180, env=env)


def _start(directory, kafka_opts: str = "") -> str:
    began = time.monotonic()
    result = _run("start", "--dir", str(directory), kafka_opts=kafka_opts)
    elapsed = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"bootstrap\.servers=127\.0\.0\.1:\d+", last), result.stdout
    assert elapsed < 60, f"kafka-local start took {elapsed:.0f} s"
    return last.split("=", 1)[1]


def _stop(directory) -> str:
    """``stop`` the broker of ``directory``; returns what it printed on stdout."""
    result = _run("stop", "--dir", str(directory))
    assert result.returncode == 0, result.stderr
    assert_no_traceback(result.stderr)
    return result.stdout


def test_start_stop_and_a_restart_that_keeps_the_topics(tmp_path, subtests):
    """One broker's life: ``start`` (with a probe in ``KAFKA_OPTS``), a topic created, ``stop``,
    a second ``stop``, a restart on the same directory, which still has the topic, ``stop``.
    Each check is a subtest; a failed one still stops the broker."""
    probe = "-Dkafka.local.test.probe=given"
    bootstrap = _start(tmp_path, kafka_opts=probe)
    pid = int(BrokerDir(tmp_path).pid_file.read_text())
    try:  # a failed check still stops the broker
        with subtests.test(msg="the started process is the broker and took KAFKA_OPTS"):
            assert _is_broker(pid)
            assert probe in Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        with subtests.test(msg="the bootstrap line names the broker"):
            brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers
            assert [f"{b.host}:{b.port}" for b in brokers.values()] == [bootstrap]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        created = admin.create_topics([NewTopic("kept", num_partitions=3, replication_factor=1)])
        created["kept"].result(30)
    finally:
        stopped = _stop(tmp_path)
    with subtests.test(msg="stop ends the broker's process and removes its pid file"):
        assert stopped.strip() == f"stopped the broker of {tmp_path} (process {pid})"
        assert not _is_broker(pid)
        assert not BrokerDir(tmp_path).pid_file.exists()
    with subtests.test(msg="a stop with nothing left to stop says so, not an error"):
        again = _run("stop", "--dir", str(tmp_path))
        assert again.returncode == 0 and "no broker running" in again.stderr

    restarted = _start(tmp_path)
    try:
        topics = AdminClient({"bootstrap.servers": restarted}).list_topics(timeout=30).topics
    finally:
        _stop(tmp_path)
    with subtests.test(msg="a restart on the same directory keeps its topics"):
        assert "kept" in topics and len(topics["kept"].partitions) == 3


def test_kafka_local_is_a_console_script():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    assert 'kafka-local = "jvm.kafka_local:main"' in scripts
    result = _run("--help")
    assert result.returncode == 0 and "start" in result.stdout and "stop" in result.stdout
