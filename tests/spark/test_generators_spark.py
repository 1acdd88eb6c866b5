"""The generators against real Spark: the streaming source, the written files, the late rule.

All queries are driven by data, never by the clock: ``Trigger.AvailableNow`` with an end offset
(``totalRows``) for the source, and one file per micro-batch with ``processAllAvailable`` for
file streams.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from attribution.config import parse_duration_ms, spark_interval
from attribution.events import ts_to_ms
from attribution.spark.files import data_files, read_events
from attribution.spark.readers import read_event_batch, read_event_stream
from generators.dataset import generate
from generators.disorder import late_event_ids_in_dir
from generators.params import GeneratorParams
from generators.spark_source import register
from generators.stream import Position, stream_for
from generators.writers import id_array

SOURCE_OPTIONS = {"seed": "7", "users": "300", "sessionsPerBlock": "60", "disorder": "per-source",
                  "redelivery_rate": "0.03", "maxRowsPerBatch": "600", "numPartitions": "2"}


def _run_source(spark, total: int, out: Path, checkpoint: Path) -> list[dict]:
    register(spark)
    reader = spark.readStream.format("streamgen").options(**SOURCE_OPTIONS)
    query = (reader.option("totalRows", total).load().writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def _rows(spark, out: Path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(str(out)).collect())


def test_source_restarted_from_its_checkpoint_replays_the_same_events(spark, tmp_path):
    first = _run_source(spark, 1_200, tmp_path / "out", tmp_path / "cp")
    assert [p["numInputRows"] for p in first] == [600, 600]
    # Restart from the checkpoint with a later end: only the new records are read.
    second = _run_source(spark, 1_800, tmp_path / "out", tmp_path / "cp")
    assert [p["numInputRows"] for p in second] == [600]
    restarted = _rows(spark, tmp_path / "out")

    uninterrupted = _run_source(spark, 1_800, tmp_path / "whole", tmp_path / "whole-cp")
    assert [p["numInputRows"] for p in uninterrupted] == [600, 600, 600]
    assert restarted == _rows(spark, tmp_path / "whole")
    assert len(restarted) == 1_800

    # The records are the stream's first 1,800, computed without Spark.
    params = GeneratorParams.from_options({k: v for k, v in SOURCE_OPTIONS.items()
                                           if k not in ("maxRowsPerBatch", "numPartitions")})
    expected, _ = stream_for(params).read(Position(), 1_800)
    assert sorted(r[0] for r in restarted) == sorted(id_array(expected.seq).to_pylist())
    assert len({r[0] for r in restarted}) < 1_800  # redelivered copies share an event_id
    kinds = {r[2] for r in restarted}
    assert kinds == {"visit", "impression"}


def test_source_rejects_unknown_options(spark):
    register(spark)
    df = spark.readStream.format("streamgen").option("totalRows", 10).option("colour", "red").load()
    with pytest.raises(Exception, match="unknown streamgen option"):
        df.writeStream.format("memory").queryName("bad_option").start().processAllAvailable()


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_spark_reads_the_generated_files(spark, tmp_path, fmt):
    run = generate(GeneratorParams(format=fmt, users=80, files=3, heartbeat=True,
                                   redelivery_rate=0.05), tmp_path, truth=False, plot=False)
    rows = read_event_batch(spark, str(run.events_dir), fmt).collect()
    expected = read_events(run.events_dir)
    assert len(rows) == len(expected) == run.records
    as_spark = sorted((r.event_id, ts_to_ms(r.ts), r.event_type, r.url, r.referer, r.is_goal,
                       r.impression_id, r.source_url, r.target_url, r.campaign, r.value)
                      for r in rows)
    as_files = sorted((e.event_id, e.ts, e.event_type, e.url, e.referer,
                       e.is_goal if e.event_type == "visit" else None, e.impression_id,
                       e.source_url, e.target_url, e.campaign, e.value) for e in expected)
    assert as_spark == as_files
    assert any(r.campaign for r in rows) and any(r.value for r in rows)


def test_source_rows_carry_campaigns_and_goal_values(spark):
    register(spark)
    options = {k: v for k, v in SOURCE_OPTIONS.items() if k != "maxRowsPerBatch"}
    rows = spark.read.format("streamgen").options(**options).option("totalRows", 900).load() \
        .select("event_id", "event_type", "is_goal", "campaign", "value").collect()
    params = GeneratorParams.from_options({k: v for k, v in options.items()
                                           if k != "numPartitions"})
    stream = stream_for(params)
    expected, _ = stream.read(Position(), 900)
    campaigns = [None if c < 0 else stream.vocab.campaigns[c] for c in expected.campaign]
    values = [None if v != v else v for v in expected.value.tolist()]
    assert sorted((r.event_id, r.campaign, r.value) for r in rows) == sorted(
        zip(id_array(expected.seq).to_pylist(), campaigns, values))
    assert all(r.campaign for r in rows if r.event_type == "impression")
    assert all(r.value is None for r in rows if not r.is_goal)
    assert any(r.value for r in rows if r.is_goal)


def _dropped_by_watermark(spark, events_dir: Path, fmt: str, delay_ms: int, checkpoint: Path,
                          name: str) -> tuple[int, set]:
    """Stream the files one per batch through a watermarked dedup; return Spark's count of rows
    dropped as late and the event ids that came through."""
    stream = read_event_stream(spark, str(events_dir), fmt, max_files_per_trigger=1)
    deduped = (stream.withWatermark("ts", spark_interval(delay_ms))
               .dropDuplicates(["event_id", "ts"]))
    query = (deduped.writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(checkpoint)).start())
    query.processAllAvailable()
    query.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == len(data_files(events_dir))  # one file per micro-batch
    dropped = sum(s["numRowsDroppedByWatermark"] for p in query.recentProgress
                  for s in p["stateOperators"])
    return dropped, {r.event_id for r in spark.sql(f"select event_id from {name}").collect()}


def _copy_with_increasing_mtimes(src: Path, dst: Path) -> Path:
    # Spark orders new files by modification time; checked-out ch7 files all have the same one.
    dst.mkdir()
    first = time.time_ns() // 1_000_000_000 - 100
    for k, f in enumerate(data_files(src)):
        shutil.copy(f, dst / f.name)
        os.utime(dst / f.name, ns=((first + k) * 1_000_000_000,) * 2)
    return dst


def test_late_rule_matches_spark_on_the_chapter_7_files(spark, ch7_dir, tmp_path):
    events = _copy_with_increasing_mtimes(ch7_dir, tmp_path / "ch7")
    for seconds in (155, 156):
        delay = parse_duration_ms(f"{seconds} seconds")
        expected = late_event_ids_in_dir(events, delay)
        dropped, kept = _dropped_by_watermark(spark, events, "json", delay,
                                              tmp_path / f"cp-{seconds}", f"ch7_late_{seconds}")
        assert dropped == len(expected)
        assert kept == {e.event_id for e in read_events(events)} - set(expected)
    assert late_event_ids_in_dir(events, parse_duration_ms("155 seconds")) == ["v-signup"]


def test_late_rule_matches_spark_on_a_generated_dataset(spark, tmp_path):
    params = GeneratorParams(users=120, files=8, format="parquet", disorder="heavy-tail",
                             tail_scale="6 hours", tail_alpha=1.0, late_fraction=0.03)
    run = generate(params, tmp_path / "ds", truth=False, plot=False)
    d = run.manifest["disorder"]
    assert d["late_made_on_purpose"] > 0 and d["late_count"] > d["late_made_on_purpose"]
    dropped, kept = _dropped_by_watermark(spark, run.events_dir, "parquet",
                                          params.watermark_delay_ms, tmp_path / "cp", "gen_late")
    assert dropped == d["late_count"]
    assert kept == {e.event_id for e in read_events(run.events_dir)} - set(d["late_event_ids"])
