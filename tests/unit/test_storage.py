"""attribution.spark.storage on the local file system (no Spark): the calls the checkpoint,
late-record and output readers make, and the refusal to read a URI before Spark runs."""
from __future__ import annotations

import pytest

from attribution.spark.storage import StorageUnavailable, available, is_uri, location


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    target = location(str(tmp_path / "a" / "b" / "layout.json"))
    target.write_text("first")
    target.write_text("second")
    assert target.read_text() == "second" and target.size() == 6
    assert sorted(p.name for p in target.parent.iterdir()) == ["layout.json"]
    assert target.is_file() and target.parent.is_dir() and not target.is_dir()


def test_listing_globbing_and_deleting(tmp_path):
    root = location(str(tmp_path))
    for name in ("d=2024-01-01/batch-1.parquet", "d=2024-01-02/batch-2.parquet",
                 "d=2024-01-02/.batch-3.parquet.tmp", "_audited/1"):
        (root / name).write_bytes(b"x")
    assert [p.name for p in root.glob_files("d=*/batch-*.parquet")] == ["batch-1.parquet",
                                                                      "batch-2.parquet"]
    assert (root / "missing").iterdir() == [] and not (root / "missing").exists()
    (root / "d=2024-01-02").delete()
    assert sorted(p.name for p in root.iterdir()) == ["_audited", "d=2024-01-01"]


def test_a_uri_is_hadoops_and_waits_for_spark(monkeypatch):
    # Before Spark starts (a session of another tier in this process would be running).
    monkeypatch.setattr("attribution.spark.storage._context", lambda: None)
    assert is_uri("file:///tmp/x") and is_uri("hdfs://nn/cp") and is_uri("s3a://b/k")
    assert not is_uri("/tmp/x") and not is_uri("out/cp") and not is_uri("C:/data")
    assert available("out/cp") and not available("hdfs://nn/cp")
    with pytest.raises(StorageUnavailable, match="hdfs://nn/cp"):
        location("hdfs://nn/cp").exists()
    assert str(location("hdfs://nn/cp") / "offsets") == "hdfs://nn/cp/offsets"
    assert str(location("hdfs://nn/cp/offsets").parent) == "hdfs://nn/cp"
