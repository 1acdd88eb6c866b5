"""Shared pytest fixtures: one SparkSession for the whole run, and paths to shared data."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CH7_DIR = ROOT.parent / "shared" / "data" / "ch7"


@pytest.fixture(scope="session")
def spark():
    """One local[2] session for the suite: 2 shuffle partitions, UI off, RocksDB state store."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from jobs.runtime import build_spark_session

    session = build_spark_session("streamjoin-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ch7_dir() -> Path:
    """The chapter 7 dataset as one JSON-lines file per arrival step (shared/data/ch7)."""
    if not CH7_DIR.is_dir():
        pytest.fail(f"shared data missing: {CH7_DIR}")
    return CH7_DIR


def stage_in_arrival_order(files, dest: Path) -> Path:
    """Copy event files into ``dest`` with strictly increasing modification times.

    Spark's file source orders new files by modification time, not by name; files checked out
    together share one, so a stream would read them in arbitrary order.
    """
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(files):
        target = Path(shutil.copy(f, dest))
        os.utime(target, (1_600_000_000 + n, 1_600_000_000 + n))
    return dest


@pytest.fixture
def ch7_stream_dir(ch7_dir, tmp_path) -> Path:
    """The chapter 7 files staged so that a file stream reads them in arrival order."""
    return stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "ch7")
