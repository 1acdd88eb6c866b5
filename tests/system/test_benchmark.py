"""The benchmark harness (benchmarks/streaming) kept working: end-to-end runs, not benchmarks.

Each run goes through the same code as ``make bench`` at a few thousand events, in the suite's
Spark session, and checks that the report has every row with numbers that make sense and that
every run agreed with the core. Timings themselves are never asserted. ``make test`` runs the
tiny run of the main table (every kind, the Kafka source on a broker of the harness's own) and
the command's ``--help``; the other modes (the realistic profile, state growth, allowed
lateness with the warm-up, the join, sustainable throughput, the cost model) are marked
``slow`` and run in ``make test-slow``. The harness's arithmetic and its refused arguments are
unit tests: ``tests/unit/test_benchmark_harness.py``.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyspark.sql import functions as F

from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS
from benchmarks.streaming.cli import parse_args, run
from benchmarks.streaming.cost_model import SCALING_LIMIT
from benchmarks.streaming.datasets import PROFILES, make_dataset
from benchmarks.streaming.kinds import (
    DEFAULT_LAYOUT,
    JOB_LAYOUT_LABELS,
    JOB_LAYOUTS,
    RUN_KINDS,
    RUN_LABELS,
    STREAMING_KINDS,
)
from benchmarks.streaming.sustainable import SUSTAINABLE_KINDS, SUSTAINABLE_LABELS
from generators.params import GeneratorParams, duration_ms
from jvm.kafka_local import BrokerDir
from support import ROOT


def test_tiny_run_prints_every_row_with_sane_numbers(spark, tmp_path, capsys):
    # Without the warm-up, which would run each of the seven Spark kinds once more
    # (test_allowed_lateness_..., in make test-slow, covers it on one kind).
    args = parse_args(["--events", "2000", "--repeats", "1", "--files", "3", "--no-warmup",
                       "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "r.json")])
    results = run(spark, args)
    out = capsys.readouterr().out

    section = results["main"]
    rows = {s["kind"]: s for s in section["summaries"]}
    kinds = tuple(RUN_KINDS)
    assert list(rows) == list(kinds) and "bare" in kinds
    for kind in kinds:
        assert RUN_LABELS[kind] in out
    assert "main, standard profile (" in out
    assert 1_500 <= section["records"] <= 3_000
    assert section["goals"] > 0 and 0 < section["attributed"] <= section["goals"]
    for kind, row in rows.items():
        assert row["check"] == "ok", (kind, row["check"])
        assert row["seconds"] > 0 and row["events_per_s"] > 0
        assert row["total_mib"] > 0
    assert rows["native"]["ratio"] == pytest.approx(1.0)
    for kind in ("native", "bare", *(k for k in STREAMING_KINDS if k in rows)):
        assert rows[kind]["batches"] >= 4          # 3 files + heartbeat, one per micro-batch
        assert rows[kind]["jvm_mib"] > 100        # the JVM was found and sampled
        assert rows[kind]["state_peak_rows"] > 0
        assert rows[kind]["state_sst_bytes"] is not None
    # Python workers exist only for the runs that call Python; the native count needs none.
    for kind in ("bare", *(k for k in STREAMING_KINDS if k in rows)):
        assert rows[kind]["workers_mib"] > 0
    # The Kafka source: the same events from a topic, every record read, in as many micro-batches
    # as the files make, and its ratio to the same query on the files printed under the table.
    kafka, files = rows["kafka"], rows["applyInPandasWithState"]
    assert kafka["batches"] == files["batches"]
    for run_ in section["runs"]:
        if run_["kind"] in ("kafka", "applyInPandasWithState"):
            assert sum(b["input_rows"] for b in run_["micro_batches"]) == section["records"]
    ratios = {r["kind"]: r for r in section["source_ratios"]}
    assert list(ratios) == [k for k in ("kafka", "delta") if k in rows]
    ratio = ratios["kafka"]
    assert (ratio["kind"], ratio["files_kind"]) == ("kafka", "applyInPandasWithState")
    assert ratio["ratio"] == pytest.approx(kafka["events_per_s"] / files["events_per_s"])
    assert ratio["cpu_ratio"] == pytest.approx(files["cpu_seconds"] / kafka["cpu_seconds"])
    assert f"{RUN_LABELS['kafka']}: x files {ratio['ratio']:.2f} " in out
    # The benchmark started its broker under its work directory and stopped it at the end.
    broker = BrokerDir(str(tmp_path / "work" / "kafka"))
    assert broker.log.is_file() and broker.pid() is None and not broker.pid_file.exists()
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
    assert rows["bare"]["state_peak_rows"] == buckets.count()   # the same query, the same state
    assert 0 < encoding["blob_bytes_per_event"] < 10 * encoding["avro_bytes_per_event"]
    assert (tmp_path / "r.json").read_text().startswith("{")


@pytest.mark.slow
def test_realistic_profile_spans_minutes_of_event_time_per_micro_batch(spark, tmp_path, capsys):
    # The realistic profile at a few thousand events over a few files (so hours, not its
    # minutes, per micro-batch): the rows, and each micro-batch's event time, as Spark reports
    # it, within the profile's day split over the files (plus the arrival disorder).
    profile = PROFILES["realistic"]
    files = 4
    args = parse_args(["--profile", "realistic", "--events", "2000", "--files", str(files),
                       "--repeats", "1", "--no-warmup", "--no-state-encoding",
                       "--runs", "native,bare,applyInPandasWithState,core",
                       "--work-dir", str(tmp_path / "work")])
    section = run(spark, args)["main"]
    out = capsys.readouterr().out
    rows = {s["kind"]: s for s in section["summaries"]}
    assert list(rows) == ["native", "bare", "applyInPandasWithState", "core"]
    assert all(row["check"] == "ok" for row in rows.values()), rows
    assert rows["native"]["ratio"] == pytest.approx(1.0)
    assert all(row["ratio"] > 0 for row in rows.values())
    assert f"main, realistic profile ({profile.description})" in out
    assert section["profile"]["generator"] == profile.generator
    day_ms = duration_ms(profile.generator["total_span"])
    assert 0.8 * day_ms <= section["event_time_s"] * 1000 < day_ms     # all within one day
    spans = section["batch_event_time_s"]
    assert len(spans) == files
    # A file of the arrival order holds a slice of the day, at most twice an even share (users
    # start over its first 20 h, so its first hours are thinner), widened by at most the
    # arrival disorder at either end.
    slack_ms = 2 * duration_ms(GeneratorParams().max_delay)
    assert all(0 < s * 1000 <= 2 * day_ms / files + slack_ms for s in spans), spans
    for run_ in section["runs"]:
        if run_["kind"] in ("bare", "applyInPandasWithState"):
            seen = [b["event_time_s"] for b in run_["micro_batches"] if b["input_rows"] > 1]
            assert seen == pytest.approx(spans)   # Spark's micro-batches are the files


@pytest.mark.slow
@pytest.mark.parametrize("lateness", ["0", "1 hour"])
def test_state_growth_mode_plateaus_with_gc_and_grows_without(spark, tmp_path, capsys, lateness):
    # transformWithState keeps one state row per user, so its rows count users in state
    # (applyInPandasWithState's rows are hash buckets, capped at the bucket count). With an
    # allowed lateness, garbage collection comes that much later and still bounds the state.
    args = parse_args(["--only-modes", "--no-warmup", "--state-growth", "--growth-events", "4000",
                       "--growth-files", "10", "--growth-backends", "transformWithState",
                       "--allowed-lateness", lateness, "--work-dir", str(tmp_path / "work")])
    runs = {r["gc"]: r for r in run(spark, args)["state_growth"]["runs"]}
    with_gc, without = runs["GC"]["rows_per_batch"], runs["no GC"]["rows_per_batch"]
    assert len(with_gc) >= 10 and len(without) >= 10
    # Without GC every user ever seen keeps a row; with it, rows leave after the lookback.
    assert without == sorted(without)
    assert max(with_gc) < without[-2]
    assert runs["no GC"]["rows_verdict"].startswith("grows")
    assert "state rows per batch" in capsys.readouterr().out


@pytest.mark.slow
def test_allowed_lateness_adds_a_row_per_value_for_each_streaming_backend(spark, tmp_path,
                                                                         capsys):
    # With the warm-up: it runs each Spark kind of --runs (here one) once, untimed, first.
    args = parse_args(["--events", "2000", "--repeats", "1", "--files", "3",
                       "--no-state-encoding", "--runs", "applyInPandasWithState,core",
                       "--allowed-lateness", "0,1 hour", "--work-dir", str(tmp_path / "work")])
    rows = run(spark, args)["main"]["summaries"]
    captured = capsys.readouterr()
    out = captured.out
    progress = [line for line in captured.err.splitlines() if line.startswith("[")]
    warmed = [n for n, line in enumerate(progress) if line.startswith("[warm-up] ")]
    measured = [n for n, line in enumerate(progress) if line.startswith("[main] run ")]
    assert [progress[n] for n in warmed] == [
        f"[warm-up] {RUN_LABELS['applyInPandasWithState']} ..."]
    assert len(measured) == 3 and warmed[0] < measured[0]  # untimed, before every measured run
    assert [(r["kind"], r["allowed_lateness_ms"]) for r in rows] == [
        ("applyInPandasWithState", 0), ("applyInPandasWithState", 3_600_000), ("core", 0)]
    assert all(r["check"] == "ok" for r in rows)  # no late record: the same goals either way
    assert all(r["state_peak_sst_bytes"] for r in rows[:2])
    assert "(b) stream applyInPandasWithState, allowed lateness 1 h " in out


@pytest.mark.slow
def test_join_mode_runs_every_strategy(spark, tmp_path, capsys):
    from attribution.spark.click_join import STRATEGIES

    args = parse_args(["--only-modes", "--no-warmup", "--join", "--join-events", "2000",
                       "--files", "3", "--work-dir", str(tmp_path / "work")])
    join = run(spark, args)["join"]
    out = capsys.readouterr().out
    assert 1_500 <= join["records"] <= 3_000
    assert [r["strategy"] for r in join["runs"]] == list(STRATEGIES)
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


@pytest.mark.slow
def test_cost_model_mode_fits_every_layout_with_sane_numbers(spark, tmp_path, capsys):
    # Micro-batches of a few hundred events: the structure and the numbers' sanity, never the
    # coefficients' values or the scaling verdict (the machine may be busy with other work).
    args = parse_args(["--cost-model", "--no-warmup", "--cost-batch-events", "150,300",
                       "--cost-batches", "8", "--work-dir", str(tmp_path / "work"),
                       "--json", str(tmp_path / "r.json")])
    results = run(spark, args)
    report = results["cost_model"]
    out = capsys.readouterr().out
    assert "main" not in results                       # the cost model replaces the main table
    assert len(report["runs"]) == len(JOB_LAYOUTS) * 2
    assert all(r["check"] == "ok" for r in report["runs"]), [r["check"] for r in report["runs"]]
    assert list(report["layouts"]) == list(JOB_LAYOUTS)
    for layout, figures in report["layouts"].items():
        assert JOB_LAYOUT_LABELS[layout] in out
        points = figures["points"]
        for size in (150, 300):
            # Micro-batches 2..8, but those beside the dead-letter query's at the start.
            mine = [p for p in points if p["size"] == size]
            batches = [p["batch"] for p in mine]
            assert batches == list(range(batches[0], 9)) and batches[0] <= 4
            assert all(100 <= p["events"] <= 2 * size for p in mine)
            read = [p["events_read"] for p in mine]
            assert read == sorted(read) and read[0] == pytest.approx(
                batches[0] * mine[0]["events"], rel=0.1)
            state = [p["state_mb"] for p in mine]
            assert state == sorted(state) and state[0] > 0
        for p in points:
            assert p["seconds"] > 0 and p["cpu_seconds"] > 0 and p["sst_mb"] > 0
            assert p["seconds_residual"] == pytest.approx(p["seconds"] - p["seconds_fitted"])
        assert 0 < figures["sst_bytes_per_event"] < 10_000
        for model in (figures["wall"], figures["cpu"]):
            assert model["points"] == len(points)
            assert all(model[k] == model[k] and model[k + "_se"] >= 0 for k in "abc")  # not NaN
        assert "core-s" in figures["sizing"] and "cores" in figures["sizing"]
    scaling = report["scaling"]
    # A size is judged when one of its first two micro-batches (a quarter of 8) was measured;
    # under load the start-up may overlap them all, and the verdict then says so.
    default_points = report["layouts"][DEFAULT_LAYOUT]["points"]
    judged = [size for size in (150, 300)
              if any(p["size"] == size and p["batch"] <= 2 for p in default_points)]
    assert [c["n"] for c in scaling["checks"]] == [2] * len(judged)
    for c in scaling["checks"]:
        assert c["ratio"] > 0 and c["cpu_ratio"] > 0
        assert c["events_read_ratio"] == pytest.approx(4, rel=0.05)
        assert c["within"] == (c["ratio"] <= SCALING_LIMIT)
    if judged:
        assert scaling["within"] == all(c["within"] for c in scaling["checks"])
        verdict = "within" if scaling["within"] else "NOT within"
        assert f"state scaling: {verdict} {SCALING_LIMIT}x at every size" in out
    else:
        assert scaling["within"] is None and "state scaling: not measured" in out
    assert "cost_model" in json.loads((tmp_path / "r.json").read_text())


def test_help_shows_every_option_and_its_defaults():
    command = [sys.executable, "-m", "benchmarks.streaming"]
    out = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    for option in ("--events", "--repeats", "--scale", "--state-growth", "--join", "--runs",
                   "--files", "--max-files-per-trigger", "--json", "--sustainable",
                   "--sustainable-trigger", "--sustainable-min-rate", "--sustainable-max-rate",
                   "--cost-model", "--cost-batch-events", "--cost-batches", "--cost-layouts",
                   "--allowed-lateness"):
        assert option in out
    assert "1000000" in out and "(default: 3)" in out
