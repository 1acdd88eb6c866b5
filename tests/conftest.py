"""Fixtures of every tier: one SparkSession for the whole run, and the chapter 7 dataset."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support import CH7_DIR, stage_in_arrival_order


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
    """The chapter 7 dataset as one JSON-lines file per arrival step (tests/data/ch7)."""
    return CH7_DIR


@pytest.fixture
def ch7_stream_dir(ch7_dir, tmp_path) -> Path:
    """The chapter 7 files staged so that a file stream reads them in arrival order."""
    return stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "ch7")
