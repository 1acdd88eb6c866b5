"""Reading a real Spark file sink's output and reporting on it.

The committed-output reader against Spark's own reading of the commit log, with a crashed run's
leftovers planted beside the committed files; the report on ``make run``'s output and on a
generated dataset run through the job in batch mode.
"""
from __future__ import annotations

import shutil
from collections import Counter
from datetime import date, datetime, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attribution.schema import PARTITION_COLUMN
from attribution.spark.output import (
    committed_files,
    read_attribution_rows,
    read_attributions,
    read_attributions_spark,
)
from generators.dataset import TRUTH_FILE, generate
from generators.params import GeneratorParams
from generators.truth import read_truth
from jobs import example, report
from jobs.attribution_job import parse_args, run
from support.outputs import PARQUET_OUTPUT, committed_attributions

COMPACT_INTERVAL = "spark.sql.streaming.fileSink.log.compactInterval"
# Spec sections 7 and 8: the columns' values when their features are off.
FEATURES_OFF = {"impression_campaign": None, "goal_value": None, "credited_value": None,
                "sign": 1, "revision": 0, "emit_timing": "ON_TIME"}


def test_the_reader_returns_exactly_the_committed_rows(spark, tmp_path, ch7_stream_dir):
    out = tmp_path / "out"
    spark.conf.set(COMPACT_INTERVAL, "3")  # eight micro-batches: 2.compact, 5.compact, 6, 7
    try:
        run(spark, parse_args(["--events", str(ch7_stream_dir), "--output", str(out),
                               *PARQUET_OUTPUT,
                               "--checkpoint", str(tmp_path / "checkpoint"), "--quiet",
                               "--max-files-per-trigger", "1", "--watermark-delay", "3 minutes"]))
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
    assert {"2.compact", "5.compact"} <= {p.name for p in (out / "_spark_metadata").iterdir()}
    committed = committed_attributions(spark, out)
    assert len(committed) == 2
    # Both goals are on 1970-01-01 (UTC): every committed file is in that date's directory.
    partition = out / f"{PARTITION_COLUMN}=1970-01-01"
    assert {f.parent for f in committed_files(out)} == {partition}
    assert not list(out.glob("*.parquet"))
    # A run killed during a micro-batch leaves a complete part file no log file lists (its rows
    # are written again after the restart) and a 0-byte one.
    with_rows = next(f for f in committed_files(out) if pq.read_metadata(f).num_rows > 0)
    shutil.copy(with_rows, partition / "part-00000-dead-beef-c000.snappy.parquet")
    (partition / "part-00001-dead-beef-c000.snappy.parquet").write_bytes(b"")

    assert sorted(read_attribution_rows(out), key=lambda r: r.goal_event_id) == sorted(
        committed, key=lambda r: r.goal_event_id)
    frame = read_attributions(out)
    assert sorted(frame["goal_event_id"]) == ["g-receipt", "g-signup"]
    assert set(frame[PARTITION_COLUMN]) == {date(1970, 1, 1)}
    assert committed_attributions(spark, out) == committed  # Spark ignores them too
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(out)  # a plain directory read fails on the 0-byte file ...
    (partition / "part-00001-dead-beef-c000.snappy.parquet").unlink()
    # ... or counts the leftover's rows twice
    assert pq.read_table(out).num_rows == len(committed) + pq.read_metadata(with_rows).num_rows

    frame = read_attributions_spark(spark, out)
    assert frame.count() == 2 and frame.columns[-1] == PARTITION_COLUMN
    first = frame.orderBy("goal_event_id").first().asDict()
    assert {c: first[c] for c in FEATURES_OFF} == FEATURES_OFF
    assert first[PARTITION_COLUMN] == date(1970, 1, 1)
    # A filter on the partition column reads only the directories of the dates asked for.
    assert frame.filter(frame[PARTITION_COLUMN] == date(1970, 1, 2)).count() == 0


def utc_day(ms: int):
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).date()


def assert_report_matches(report_dir, truth) -> None:
    """The report's daily table against the truth rows (last_touch, credit 1 per attributed
    goal): per UTC day, conversions = attributed goals, and the organic goals counted apart."""
    daily = pd.read_csv(report_dir / "daily.csv")
    assert set(daily["model"]) == {"last_touch"}
    attributed = Counter(str(utc_day(r.goal_ts)) for r in truth if not r.organic)
    organic = Counter(str(utc_day(r.goal_ts)) for r in truth if r.organic)
    credited = daily[daily["campaign"] != "(organic)"].groupby("day")
    assert credited["conversions"].sum().to_dict() == pytest.approx(dict(attributed))
    assert credited["attributed_goals"].sum().to_dict() == dict(attributed)
    organic_lines = daily[daily["campaign"] == "(organic)"]
    assert dict(zip(organic_lines["day"], organic_lines["organic_goals"])) == dict(organic)
    assert (organic_lines["conversions"] == 0).all()
    assert sum(attributed.values()) > 10 and sum(organic.values()) > 0
    for name in ("daily.parquet", "campaigns.csv", "campaigns.parquet", "report.html",
                 "conversions_by_campaign.png", "daily_credited_value.png"):
        assert (report_dir / name).stat().st_size > 0, name


def test_the_report_runs_on_make_runs_output(spark, tmp_path):
    out = tmp_path / "example"
    # `make run` with fewer users and files
    assert example.main(["--out", str(out), "--users", "60", "--files", "4"]) == 0
    assert report.main(["--attributions", str(out / "attributions"),
                        "--out", str(out / "report")]) == 0
    truth = read_truth(out / "data" / TRUTH_FILE)
    assert_report_matches(out / "report", truth)


def test_the_report_runs_on_a_batch_job_output(spark, tmp_path):
    dataset = generate(GeneratorParams(users=60, seed=5, files=3), tmp_path / "data", plot=False)
    run(spark, parse_args(["--events", str(dataset.events_dir), "--mode", "batch", "--quiet",
                           "--output", str(tmp_path / "attributions"),
                           *PARQUET_OUTPUT]))
    attributions = tmp_path / "attributions"
    assert (attributions / "_SUCCESS").exists()
    assert not (attributions / "_spark_metadata").exists()
    # One directory per goal date, each holding the rows of that UTC date only.
    for part in committed_files(attributions):
        assert set(read_attributions(part)[PARTITION_COLUMN]) == {
            date.fromisoformat(part.parent.name.split("=")[1])}
    assert not list(attributions.glob("*.parquet"))
    assert report.main(["--attributions", str(tmp_path / "attributions"),
                        "--out", str(tmp_path / "report")]) == 0
    assert_report_matches(tmp_path / "report", read_truth(dataset.truth_path))
