"""The Parquet sink's batch writes: laid out by date, replacing everything or only the dates the
rows fall in (a backfill), one file per date when asked; a streaming query's files committed in
its log."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq

from attribution.spark.layout import GOAL_DATE
from attribution.spark.sinks import REPLACE_ALL, REPLACE_DATES, ParquetSink
from attribution.spark.sinks.base import Sink

UTC = dt.timezone.utc


def _rows(spark, *pairs):
    return spark.createDataFrame([(n, dt.datetime(2024, 1, day, 12, tzinfo=UTC))
                                  for n, day in pairs], "n long, goal_ts timestamp")


def _by_date(path: Path) -> dict[str, list[int]]:
    out = {}
    for directory in sorted(path.glob("goal_date=*")):
        files = list(directory.glob("*.parquet"))
        out[directory.name] = sorted(n for f in files for n in pq.read_table(f)["n"].to_pylist())
    return out


def test_a_batch_write_replaces_all_or_only_the_dates_of_its_rows(spark, tmp_path):
    out = tmp_path / "out"
    sink = ParquetSink(str(out), GOAL_DATE, one_file_per_date=True)
    assert isinstance(sink, Sink)
    sink.write_batch(_rows(spark, (1, 1), (2, 1), (3, 2), (4, 3)))
    assert _by_date(out) == {"goal_date=2024-01-01": [1, 2], "goal_date=2024-01-02": [3],
                             "goal_date=2024-01-03": [4]}
    assert [len(list(d.glob("*.parquet"))) for d in sorted(out.glob("goal_date=*"))] == [1, 1, 1]
    sink.write_batch(_rows(spark, (5, 2)), replace=REPLACE_DATES)
    assert _by_date(out) == {"goal_date=2024-01-01": [1, 2], "goal_date=2024-01-02": [5],
                             "goal_date=2024-01-03": [4]}
    sink.write_batch(_rows(spark, (6, 3)), replace=REPLACE_ALL)
    assert _by_date(out) == {"goal_date=2024-01-03": [6]}
    assert (out / "_SUCCESS").is_file()


def test_a_flat_sink_streams_its_rows_into_the_file_sinks_log(spark, tmp_path):
    from attribution.spark.output import committed_files

    source = tmp_path / "in"
    source.mkdir()
    _rows(spark, (1, 1), (2, 2)).write.parquet(str(source / "batch"))
    stream = spark.readStream.schema("n long, goal_ts timestamp").parquet(str(source / "batch"))
    query = ParquetSink(str(tmp_path / "out")).start_stream(
        stream, str(tmp_path / "cp"), "available-now", "sink_test")
    query.awaitTermination()
    files = committed_files(tmp_path / "out")
    assert files and all(f.parent == tmp_path / "out" for f in files)
    assert sorted(n for f in files for n in pq.read_table(f)["n"].to_pylist()) == [1, 2]
