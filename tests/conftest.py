"""Fixtures of every tier: one SparkSession per worker, one local Kafka broker for the whole run
(started on first use, shared by the workers), and the chapter 7 dataset; and the order tests
start in.

Two tiers of the suite: ``make test`` runs every test not marked ``slow``, ``make test-slow`` the
ones marked ``slow`` (the configurations and benchmark modes that ``make test`` leaves out); CI
runs both. Each runs on several pytest-xdist workers, each with its own session. The run ends
when the last worker finishes, so the longest tests start first: by the seconds each took in a
recorded run (``tests/durations.json``, written by ``make durations``), a test without a
record by its tier's typical time. The list is laid out so that xdist's even split hands each
worker every n-th test of the ranking (``interleaved``), longest first on each; an idle worker
then takes short tests from the tail of a busy one's queue.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT
from support.datasets import CH7_DIR, stage_in_arrival_order
from timings import interleaved, recorded_seconds

# The seconds a test without a record is ranked by: its tier's typical test (system tests start
# their own processes, Spark tests run queries on the worker's session, unit tests neither).
_TIER_SECONDS = {"system": 60.0, "spark": 15.0, "unit": 0.1}


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected: lay out what will run
def pytest_collection_modifyitems(config, items):
    """Longest first, by recorded seconds or the tier's typical time, interleaved for two
    workers (the same order on every worker: xdist requires it)."""
    seconds = recorded_seconds()

    def estimate(item) -> float:
        tier = Path(str(item.path)).parent.name
        return seconds.get(item.nodeid, _TIER_SECONDS.get(tier, 1.0))

    ranked = sorted(items, key=estimate, reverse=True)  # stable: collection order on ties
    items[:] = interleaved(ranked, _workers(config))


def _workers(config) -> int:
    """How many xdist workers share the tests (0 without xdist)."""
    if hasattr(config, "workerinput"):
        return int(config.workerinput["workercount"])
    count = getattr(config.option, "numprocesses", None)
    return count if isinstance(count, int) else 0


@pytest.fixture(scope="session")
def spark():
    """One local[2] session for the suite: 2 shuffle partitions, UI off, RocksDB state store."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from jobs.runtime import build_spark_session

    session = build_spark_session("streamjoin-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


# -- one broker for the whole run ------------------------------------------------------------

KAFKA_LOCAL = [sys.executable, "-m", "jvm.kafka_local"]


def _run_root(config) -> Path:
    """The run's temporary directory, the same for every worker: xdist gives each worker a
    directory inside the controller's."""
    root = config._tmp_path_factory.getbasetemp()  # pytest's own, public on the fixture only
    return root.parent if hasattr(config, "workerinput") else root


@pytest.fixture(scope="session")
def kafka_bootstrap(pytestconfig) -> str:
    """``host:port`` of one Kafka broker for the whole run, started as a user starts it
    (``kafka-local start``) by the first worker that needs it, under a lock the others wait on,
    and stopped by its process id when the run ends (``pytest_sessionfinish``, in the
    controller)."""
    root = _run_root(pytestconfig)
    directory, address = root / "kafka-broker", root / "kafka-broker.address"
    with open(root / "kafka-broker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not address.exists():
            started = subprocess.run([*KAFKA_LOCAL, "start", "--dir", str(directory)],
                                     capture_output=True, text=True, check=False, cwd=ROOT)
            if started.returncode != 0:
                pytest.fail(f"kafka-local start failed: {started.stderr.strip()}",
                            pytrace=False)
            last = started.stdout.strip().splitlines()[-1]
            address.write_text(last.removeprefix("bootstrap.servers="))
    return address.read_text()


def pytest_sessionfinish(session):
    """The controller (or a run without workers) stops the run's broker, if one was started."""
    if hasattr(session.config, "workerinput"):
        return
    directory = _run_root(session.config) / "kafka-broker"
    if (directory / "broker.pid").exists():
        subprocess.run([*KAFKA_LOCAL, "stop", "--dir", str(directory)], check=False, cwd=ROOT)


@pytest.fixture(scope="session")
def ch7_dir() -> Path:
    """The chapter 7 dataset as one JSON-lines file per arrival step (tests/data/ch7)."""
    return CH7_DIR


@pytest.fixture
def ch7_stream_dir(ch7_dir, tmp_path) -> Path:
    """The chapter 7 files staged so that a file stream reads them in arrival order."""
    return stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "ch7")
