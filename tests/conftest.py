"""Fixtures of every tier: one SparkSession for the whole run, one local Kafka broker for the
whole run (started on first use), and the chapter 7 dataset; and the order tests start in.

``make test`` runs the tests on several pytest-xdist workers (each with its own session and, when
a test asks for one, its own broker). The run ends when the last worker finishes, so the longest
tests start first: the system tier, then the Spark tier, then the unit tier, the tests marked
``slow`` first within each, so that short tests fill the gaps at the end.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import CH7_DIR, ROOT, stage_in_arrival_order

# Tiers in the order they start (the directories under tests/).
_TIER_ORDER = {"system": 0, "spark": 1, "unit": 2}


def pytest_collection_modifyitems(config, items):
    """Longest first: by tier, then the tests marked ``slow``; otherwise collection order."""
    def rank(item):
        tier = Path(str(item.path)).parent.name
        return (_TIER_ORDER.get(tier, len(_TIER_ORDER)), item.get_closest_marker("slow") is None)

    items.sort(key=rank)  # stable: collection order within a rank


@pytest.fixture(scope="session")
def spark():
    """One local[2] session for the suite: 2 shuffle partitions, UI off, RocksDB state store."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from jobs.runtime import build_spark_session

    session = build_spark_session("streamjoin-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    """``host:port`` of one Kafka broker for the suite, started as a user starts it
    (``kafka-local start``) on first use and stopped by its process id at the end."""
    directory = tmp_path_factory.mktemp("kafka-broker")
    command = [sys.executable, "-m", "jvm.kafka_local"]
    started = subprocess.run([*command, "start", "--dir", str(directory)], capture_output=True,
                             text=True, check=False, cwd=ROOT)
    if started.returncode != 0:
        pytest.fail(f"kafka-local start failed: {started.stderr.strip()}", pytrace=False)
    bootstrap = started.stdout.strip().splitlines()[-1].removeprefix("bootstrap.servers=")
    yield bootstrap
    subprocess.run([*command, "stop", "--dir", str(directory)], check=True, cwd=ROOT)


@pytest.fixture(scope="session")
def ch7_dir() -> Path:
    """The chapter 7 dataset as one JSON-lines file per arrival step (tests/data/ch7)."""
    return CH7_DIR


@pytest.fixture
def ch7_stream_dir(ch7_dir, tmp_path) -> Path:
    """The chapter 7 files staged so that a file stream reads them in arrival order."""
    return stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "ch7")
