"""The benchmark harness (benchmarks/streaming) kept working: a tiny end-to-end run, not a benchmark.

The run goes through the same code as ``make bench`` at a few thousand events, in the suite's
Spark session, and checks that the table has every row with numbers that make sense and that
every run agreed with the core. Timings themselves are never asserted.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyspark.sql import functions as F

from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS
from benchmarks.streaming.cli import parse_args, run
from benchmarks.streaming.datasets import make_dataset
from benchmarks.streaming.kinds import RUN_KINDS, RUN_LABELS
from benchmarks.streaming.modes import interleaved
from benchmarks.streaming.report import plateau_verdict
from benchmarks.streaming.sustainable import (
    SUSTAINABLE_KINDS,
    SUSTAINABLE_LABELS,
    bisect_rates,
    percentile,
)
from support import ROOT


def test_tiny_run_prints_every_row_with_sane_numbers(spark, tmp_path, capsys):
    args = parse_args(["--events", "2000", "--repeats", "1", "--files", "3",
                       "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "r.json")])
    results = run(spark, args)
    out = capsys.readouterr().out

    section = results["main"]
    rows = {s["kind"]: s for s in section["summaries"]}
    assert list(rows) == list(RUN_KINDS)
    for kind in RUN_KINDS:
        assert RUN_LABELS[kind] in out
    assert 1_500 <= section["records"] <= 3_000
    assert section["goals"] > 0 and 0 < section["attributed"] <= section["goals"]
    for kind, row in rows.items():
        assert row["check"] == "ok", (kind, row["check"])
        assert row["seconds"] > 0 and row["events_per_s"] > 0
        assert row["total_mib"] > 0
    assert rows["native"]["ratio"] == pytest.approx(1.0)
    for kind in ("native", "applyInPandasWithState", "transformWithState"):
        assert rows[kind]["batches"] >= 4          # 3 files + heartbeat, one per micro-batch
        assert rows[kind]["jvm_mib"] > 100        # the JVM was found and sampled
        assert rows[kind]["state_peak_rows"] > 0
        assert rows[kind]["state_sst_bytes"] is not None
    # Python workers exist only for the runs that call Python; the native count needs none.
    assert rows["applyInPandasWithState"]["workers_mib"] > 0
    assert rows["transformWithState"]["workers_mib"] > 0
    # Until the heartbeat's batch nothing leaves the state, so at the peak every user is in it:
    # transformWithState keeps one row per user, applyInPandasWithState one per hash bucket that
    # holds users. The same seed generates the same users again, to count those buckets.
    encoding = section["state_encoding"]
    again = make_dataset(tmp_path / "again", 2000, 3, args.seed, "again")
    users = spark.read.parquet(str(again.events_dir)).where(F.col("user_id").isNotNull())
    assert encoding["users_with_state"] == users.select("user_id").distinct().count()
    assert rows["transformWithState"]["state_peak_rows"] == encoding["users_with_state"]
    buckets = users.select(F.pmod(F.xxhash64("user_id"), F.lit(DEFAULT_STATE_BUCKETS))).distinct()
    assert rows["applyInPandasWithState"]["state_peak_rows"] == buckets.count()
    assert 0 < encoding["blob_bytes_per_event"] < 10 * encoding["avro_bytes_per_event"]
    assert (tmp_path / "r.json").read_text().startswith("{")


@pytest.mark.slow
def test_state_growth_mode_plateaus_with_gc_and_grows_without(spark, tmp_path, capsys):
    # transformWithState keeps one state row per user, so its rows count users in state
    # (applyInPandasWithState's rows are hash buckets, capped at the bucket count).
    args = parse_args(["--only-modes", "--no-warmup", "--state-growth", "--growth-events", "4000",
                       "--growth-files", "10", "--growth-backends", "transformWithState",
                       "--work-dir", str(tmp_path / "work")])
    runs = {r["gc"]: r for r in run(spark, args)["state_growth"]["runs"]}
    with_gc, without = runs["GC"]["rows_per_batch"], runs["no GC"]["rows_per_batch"]
    assert len(with_gc) >= 10 and len(without) >= 10
    # Without GC every user ever seen keeps a row; with it, rows leave after the lookback.
    assert without == sorted(without)
    assert max(with_gc) < without[-2]
    assert runs["no GC"]["rows_verdict"].startswith("grows")
    assert "state rows per batch" in capsys.readouterr().out


@pytest.mark.slow
def test_join_mode_runs_every_strategy(spark, tmp_path, capsys):
    from jobs.join_job import STRATEGY_CHOICES

    args = parse_args(["--only-modes", "--no-warmup", "--join", "--join-events", "2000",
                       "--files", "3", "--work-dir", str(tmp_path / "work")])
    join = run(spark, args)["join"]
    out = capsys.readouterr().out
    assert 1_500 <= join["records"] <= 3_000
    assert [r["strategy"] for r in join["runs"]] == list(STRATEGY_CHOICES)
    for r in join["runs"]:
        assert r["strategy"] in out
        assert r["clicks"] > 0 and r["seconds"] > 0 and r["events_per_s"] > 0 and r["ratio"] > 0
        assert r["peak_rss_mib"] > 0
        assert len(r["state_rows_per_batch"]) >= 4    # 3 files + heartbeat, one per micro-batch
        assert max(r["state_rows_per_batch"]) > 0


@pytest.mark.slow
def test_sustainable_mode_reports_every_kind_with_sane_numbers(spark, tmp_path, capsys):
    # Seconds-long probes at two rates: the structure and the numbers' sanity, never a verdict
    # or an ordering between kinds (the machine may be busy with other work).
    args = parse_args(["--only-modes", "--no-warmup", "--sustainable",
                       "--sustainable-trigger", "2 seconds", "--sustainable-duration", "8 seconds",
                       "--sustainable-file-interval", "500 ms", "--sustainable-min-rate", "100",
                       "--sustainable-max-rate", "1000", "--sustainable-probes", "2",
                       "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "r.json")])
    report = run(spark, args)["sustainable"]
    out = capsys.readouterr().out
    assert [r["kind"] for r in report["runs"]] == list(SUSTAINABLE_KINDS)
    for r in report["runs"]:
        assert SUSTAINABLE_LABELS[r["kind"]] in out
        probes = r["probes"]
        assert [p["rate"] for p in probes] in ([100], [100, 1000])
        passed = [p["rate"] for p in probes if p["sustainable"]]
        assert r["sustainable_rate"] == (max(passed) if passed else None)
        failed = [p["rate"] for p in probes if not p["sustainable"]]
        assert r["lowest_unsustainable_rate"] == (min(failed) if failed else None)
        for p in probes:
            assert p["sustainable"] == (not p["reasons"])
            assert p["achieved_rate"] > 0 and p["files"] > 0 and p["cpu_seconds"] > 0
            assert p["goals_measured"] > 0 and 0 <= p["goals_pending"] <= p["goals_measured"]
            assert p["measured_batches"] == sum(b["measured"] for b in p["micro_batches"])
            assert sum(b["rows"] for b in p["micro_batches"]) == p["input_rows"]
            if p["input_rows"]:
                assert p["cpu_s_per_million"] > 0
            if p["latency_p50_s"] is not None:
                assert 0 < p["latency_p50_s"] <= p["latency_p99_s"]
        if r["sustainable_rate"] is not None:
            assert r["sustainable_rate"] > 0 and r["cpu_s_per_million"] > 0
            assert 0 < r["latency_p50_s"] <= r["latency_p99_s"]
    assert "sustainable" in json.loads((tmp_path / "r.json").read_text())


def test_bisection_probes_the_bounds_then_geometric_means():
    def search(limit, probes=6):
        seen = []

        def sustainable(rate):
            seen.append(rate)
            return rate <= limit
        return bisect_rates(1_000, 100_000, probes, sustainable), seen

    # Between 1,000 and 100,000: then sqrt(1,000 x 100,000), and so on between pass and fail.
    assert search(30_000) == ((23_714, 31_623), [1_000, 100_000, 10_000, 31_623, 17_783, 23_714])
    assert search(500) == ((None, 1_000), [1_000])           # the lower bound fails: stop
    assert search(10**6) == ((100_000, None), [1_000, 100_000])  # the upper bound holds: stop
    assert search(30_000, probes=2) == ((1_000, 100_000), [1_000, 100_000])


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0


def test_interleaving_rotates_the_order_each_repeat():
    plan = interleaved(["a", "b", "c"], 3)
    assert plan == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                    (2, "c"), (2, "a"), (2, "b")]


def test_plateau_verdict():
    assert plateau_verdict([5, 50, 100, 100, 102, 99, 101, 100, 98, 3]).startswith("plateau")
    assert plateau_verdict([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]).startswith("grows")
    assert plateau_verdict([1, 2]) == "too few batches to tell"


def test_help_shows_defaults_and_bad_arguments_fail_clearly():
    command = [sys.executable, "-m", "benchmarks.streaming"]
    out = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    for option in ("--events", "--repeats", "--scale", "--state-growth", "--join", "--runs",
                   "--files", "--max-files-per-trigger", "--json", "--sustainable",
                   "--sustainable-trigger", "--sustainable-min-rate", "--sustainable-max-rate"):
        assert option in out
    assert "1000000" in out and "(default: 3)" in out
    bad = subprocess.run([*command, "--runs", "native,fast"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode == 2 and "unknown kind(s) fast" in bad.stderr
    bad = subprocess.run([*command, "--events", "0"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--events must be at least 1" in bad.stderr
    bad = subprocess.run([*command, "--sustainable-trigger", "10"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode == 2 and "--sustainable-trigger: '10' has no unit" in bad.stderr
