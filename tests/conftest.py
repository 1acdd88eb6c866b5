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
