"""The attribution job's Delta output: the changelog as a Delta table (stream, both backends, and
batch), the current table beside it, the completeness frontier each commit carries, and a
backfill as one commit. The chapter 7 stream of each backend also answers for what every stream
of clean input does whatever its output: one read of each input file, one progress line per
micro-batch.

Streams are file sources read one file per micro-batch under ``availableNow``. Each micro-batch
commits one version of the changelog and one MERGE of the current table, both carrying the
micro-batch's frontier, so the state after every micro-batch is read back by Delta's time travel
(with the ``deltalake`` package, outside Spark), and checked micro-batch by micro-batch.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from attribution import AttributionConfig, attribute_batch
from attribution.config import parse_duration_ms
from attribution.events import ts_to_ms
from attribution.finality import BATCH_ID_KEY, FINAL_THROUGH_KEY, parse_frontier
from attribution.oracle import sort_key
from attribution.rows import Attribution
from attribution.schema import OUTPUT_FIELDS
from attribution.spark.dead_letter import DEAD_LETTERED_DIR
from attribution.spark.files import data_files, read_events
from attribution.spark.output import read_attributions_spark
from attribution.spark.sources.offset_log import committed_batches
from jobs.attribution_job import main, parse_args, run
from shared_runs import files_read_since, last_execution_id, whole_locations
from support.datasets import CH7_ROWS, generate_late_dataset, stage_in_arrival_order
from support.reference import dropped_by_spark, folded_rows

STREAM_BACKENDS = ("applyInPandasWithState", "transformWithState")
DELAY, LATENESS = "10 minutes", "2 hours"
MODELS = ("last_touch", "linear")


def table_rows(path: Path, version: int | None = None) -> list[Attribution]:
    """The rows of a Delta table's version (latest: ``None``), read outside Spark."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version).to_pyarrow_table()
    rows = []
    for record in table.select(list(OUTPUT_FIELDS)).to_pylist():
        record["goal_ts"] = ts_to_ms(record["goal_ts"])
        if record["impression_ts"] is not None:
            record["impression_ts"] = ts_to_ms(record["impression_ts"])
        record["trail"] = tuple(record["trail"] or ())
        rows.append(Attribution(**record))
    return sorted(rows, key=sort_key)


def history(path: Path) -> list[dict]:
    """A Delta table's commits, oldest first, each with its parsed frontier (``None``: none)."""
    from deltalake import DeltaTable

    commits = sorted(DeltaTable(str(path)).history(), key=lambda c: c["version"])
    return [{**c, "frontier": parse_frontier(c.get("userMetadata"))} for c in commits]


def standing(changelog: list[Attribution]) -> list[Attribution]:
    """The rows a changelog folds to as they stand in it, revision and timing included (what
    the current table holds; ``support.reference.folded_rows`` resets those columns)."""
    import pandas as pd

    from attribution.spark.changelog import fold_changelog

    if not changelog:
        return []
    frame = pd.DataFrame([r._asdict() for r in changelog]).assign(position=range(len(changelog)))
    return sorted((changelog[k] for k in fold_changelog(frame)["position"]), key=sort_key)


def spark_rows(spark, path: Path) -> list[Attribution]:
    """The rows ``read_attributions_spark`` reads, as core rows."""
    from pyspark.sql import functions as F

    frame = read_attributions_spark(spark, path)
    frame = (frame.withColumn("goal_ts", F.unix_millis("goal_ts"))
             .withColumn("impression_ts", F.unix_millis("impression_ts")))
    return sorted((Attribution(**{k: (tuple(v) if k == "trail" else v)
                                  for k, v in r.asDict().items() if k in OUTPUT_FIELDS})
                   for r in frame.collect()), key=sort_key)


def run_job(spark, tmp_path: Path, events: Path, *options: str):
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "checkpoint"), "--quiet", *options])
    return run(spark, args)


@pytest.mark.parametrize("backend", STREAM_BACKENDS)
def test_a_ch7_stream_into_delta_gives_the_two_rows_reads_each_file_once_and_reports_each_batch(
        spark, tmp_path, ch7_stream_dir, subtests, backend):
    """The chapter 7 files streamed one per micro-batch into the job's default output, a Delta
    table: the chapter's two rows, the oracle's, read alike by Spark and outside it; one commit
    per micro-batch, each with its frontier. The same run, as every stream over input without
    invalid records, reads each input file once: the dead letter needs no second read (counted
    from Spark's "number of files read" over the run's SQL executions; the control, a file with
    invalid records read twice, is in test_dead_letter_one_read). And ``--progress-json``
    writes one JSON line per micro-batch, as the run goes: its report's history."""
    progress = tmp_path / "progress.jsonl"
    dead = tmp_path / "dead"
    inputs = len(list(ch7_stream_dir.glob("part-*.json")))
    with whole_locations(spark):
        before = last_execution_id(spark)
        report = run_job(spark, tmp_path, ch7_stream_dir, "--max-files-per-trigger", "1",
                         "--watermark-delay", "3 minutes", "--backend", backend,
                         "--dead-letter", str(dead), "--progress-json", str(progress))
        read = files_read_since(spark, before, ch7_stream_dir)
    out = tmp_path / "out"
    with subtests.test(msg="a Delta table, not a file sink's output"):
        assert (out / "_delta_log").is_dir() and not (out / "_spark_metadata").exists()
    rows = spark_rows(spark, out)
    with subtests.test(msg="the chapter's two rows"):
        assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
    with subtests.test(msg="the oracle's rows, read by Spark and outside it alike"):
        assert rows == attribute_batch(read_events(ch7_stream_dir)) == table_rows(out)
    with subtests.test(msg="observed metrics still count"):
        assert (report.goals, report.attributed) == (2, 2)
    commits = history(out)
    # One commit per micro-batch, in order, each with its frontier; the frontier only grows.
    with subtests.test(msg="one commit per micro-batch, in order"):
        assert [c["frontier"][BATCH_ID_KEY] for c in commits] == list(range(report.batches))
    finals = [c["frontier"][FINAL_THROUGH_KEY] for c in commits]
    with subtests.test(msg="the frontier is first unknown, then known"):
        assert finals[0] is None and finals[-1] is not None
    with subtests.test(msg="the frontier only grows"):
        known = [f for f in finals if f is not None]
        assert known == sorted(known)

    with subtests.test(msg="no invalid record, and a micro-batch per file at least"):
        assert report.extra["invalid"] == 0 and report.batches >= inputs
    with subtests.test(msg="each input file is read once"):
        assert read == inputs
    with subtests.test(msg="every committed micro-batch is done, and none wrote a dead letter"):
        assert sorted(int(m.name) for m in (dead / DEAD_LETTERED_DIR).iterdir()) == \
            committed_batches(tmp_path / "checkpoint")
        assert not list(dead.rglob("*.parquet"))

    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    with subtests.test(msg="one progress line per micro-batch, a file each"):
        assert len(lines) == len(report.history) >= inputs
    with subtests.test(msg="the progress lines are the report's history"):
        assert lines == json.loads(json.dumps(report.history, default=str))
    with subtests.test(msg="every record is in one progress line or another"):
        assert sum(line["input"] for line in lines) == len(read_events(ch7_stream_dir))


def test_ch7_files_give_the_two_rows_in_a_delta_table_in_batch(spark, tmp_path, ch7_stream_dir):
    report = run_job(spark, tmp_path, ch7_stream_dir, "--max-files-per-trigger", "1",
                     "--watermark-delay", "3 minutes", "--mode", "batch")
    out = tmp_path / "out"
    assert (out / "_delta_log").is_dir() and not (out / "_spark_metadata").exists()
    rows = spark_rows(spark, out)
    assert {(r.goal_event_id, r.impression_id, r.trail) for r in rows} == CH7_ROWS
    assert rows == attribute_batch(read_events(ch7_stream_dir)) == table_rows(out)
    assert (report.goals, report.attributed) == (2, 2)  # observed metrics still count
    assert [c["operation"] for c in history(out)] == ["WRITE"]


@pytest.fixture(scope="module")
def late_dataset(tmp_path_factory):
    """Generated files with late records (some within the allowed lateness, some not), staged in
    arrival order, and the records a stream accepts."""
    root = tmp_path_factory.mktemp("delta-late")
    result = generate_late_dataset(root, users=16, seed=11, files=5, total_span="3 days",
                                   redelivery_rate=0.03, watermark_delay=DELAY)
    files = [read_events(f) for f in data_files(result.events_dir)]
    dropped = dropped_by_spark(files, parse_duration_ms(DELAY) + parse_duration_ms(LATENESS))
    gone = {id(e) for records in dropped.values() for e in records}
    accepted = [e for records in files for e in records
                if e.event_type != "heartbeat" and id(e) not in gone]
    events = stage_in_arrival_order(data_files(result.events_dir), root / "events")
    return events, accepted


@pytest.mark.parametrize("backend", STREAM_BACKENDS)
def test_the_current_table_is_the_fold_after_every_micro_batch_and_final_goals_never_change(
        spark, tmp_path, late_dataset, backend):
    events, accepted = late_dataset
    current = tmp_path / "current"
    report = run_job(spark, tmp_path, events, "--backend", backend, "--current-table",
                     str(current), "--watermark-delay", DELAY, "--allowed-lateness", LATENESS,
                     "--early-results", "--models", ",".join(MODELS),
                     "--max-files-per-trigger", "1")
    out = tmp_path / "out"
    changelog_commits = history(out)
    current_commits = history(current)
    batches = list(range(report.batches))
    assert [c["frontier"][BATCH_ID_KEY] for c in changelog_commits] == batches
    # The current table: created empty, then one MERGE per micro-batch, each once.
    assert current_commits[0]["frontier"] is None
    assert [(c["operation"], c["frontier"][BATCH_ID_KEY]) for c in current_commits[1:]] == [
        ("MERGE", k) for k in batches]

    seen: dict = {}
    revised_after: list = []  # (final_through of micro-batch k, rows of later micro-batches)
    previous: list = []
    for k, (log_commit, table_commit) in enumerate(zip(changelog_commits,
                                                       current_commits[1:])):
        changelog = table_rows(out, log_commit["version"])
        # After micro-batch k: the current table is the fold of the changelog so far.
        assert table_rows(current, table_commit["version"]) == standing(changelog), k
        added = Counter(changelog) - Counter(previous)
        assert sum(added.values()) == len(changelog) - len(previous)  # appended only
        revised_after.append((log_commit["frontier"][FINAL_THROUGH_KEY], k))
        seen[k] = added
        previous = changelog
    assert sum(r.sign == -1 for r in previous) > 0  # revisions happened: the test can fail

    # Finality: no row of a goal at or before micro-batch k's frontier comes in a later one.
    checked = 0
    for final_through, k in revised_after:
        if final_through is None:
            continue
        for later in batches[k + 1:]:
            late_rows = [r for r in seen[later] if r.goal_ts <= final_through]
            assert not late_rows, (k, later, late_rows[:2])
        checked += sum(r.goal_ts <= final_through for r in previous)
    assert checked > 0

    # At the end: the oracle over the accepted records.
    oracle = attribute_batch(accepted, AttributionConfig(models=MODELS))
    assert folded_rows(table_rows(current)) == sorted(oracle, key=sort_key)


def test_a_micro_batch_written_again_commits_nothing(spark, tmp_path):
    """A micro-batch run again after a crash (same query id and batch id) leaves both tables as
    they were: Delta's transaction identifiers skip the append and the MERGE."""
    from attribution.schema import OUTPUT_SCHEMA
    from attribution.spark.layout import GOAL_DATE, by_date
    from attribution.spark.sinks import DeltaSink
    from attribution.spark.types import spark_struct
    from support.outputs import attribution_record

    records = [{**attribution_record("g1", 1_700_000_000_000, 7), "sign": 1, "revision": 0,
                "emit_timing": "ON_TIME"}]
    rows, columns = by_date(spark.createDataFrame(records, spark_struct(OUTPUT_SCHEMA)),
                            GOAL_DATE)
    sink = DeltaSink(str(tmp_path / "out"), GOAL_DATE, current=str(tmp_path / "current"))
    sink._create_current(spark, rows.schema, columns)
    for _ in range(2):
        sink.write_micro_batch_rows(rows, 0, "query-1", '{"final_through_ms": null}', columns)
    assert len(table_rows(tmp_path / "out")) == len(table_rows(tmp_path / "current")) == 1
    assert [c["operation"] for c in history(tmp_path / "current")] == ["WRITE", "MERGE"]
    assert len(history(tmp_path / "out")) == 1


def test_an_output_keeps_its_format_and_a_contradicting_one_is_refused(tmp_path, capsys,
                                                                        ch7_dir):
    (tmp_path / "out" / "_delta_log").mkdir(parents=True)
    code = main(["--events", str(ch7_dir), "--output", str(tmp_path / "out"),
                 "--output-format", "parquet", "--checkpoint", str(tmp_path / "cp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and "holds delta output and --output-format is parquet" in err[0]
    from attribution.spark.sinks import choose_output_format

    assert choose_output_format(str(tmp_path / "out"), None) == "delta"
    assert choose_output_format(str(tmp_path / "new"), None) == "delta"
    assert choose_output_format(str(tmp_path / "new"), "parquet") == "parquet"
    (tmp_path / "pq" / "_spark_metadata").mkdir(parents=True)
    assert choose_output_format(str(tmp_path / "pq"), None) == "parquet"


def test_a_backfill_of_a_delta_output_is_one_commit_and_equals_the_full_run(spark, tmp_path):
    from generators.dataset import generate
    from generators.params import GeneratorParams

    data = generate(GeneratorParams(users=30, seed=3, files=2, format="parquet",
                                    span="60 days", total_span="70 days"),
                    tmp_path / "data", truth=False, plot=False).events_dir
    window = ("2024-01-20", "2024-02-05")
    corrected = tmp_path / "corrected"
    corrected.mkdir()
    for file in sorted(data.glob("*.parquet")):
        table = pq.read_table(file)
        day = pc.strftime(table["ts"], format="%Y-%m-%d")
        odd = pc.is_in(pc.utf8_slice_codeunits(table["user_id"], -1),
                       value_set=pa.array(["1", "4", "7"]))
        drop = pc.and_(pc.and_(pc.greater_equal(day, window[0]), pc.less_equal(day, window[1])),
                       pc.and_(pc.fill_null(table["is_goal"], False), pc.fill_null(odd, False)))
        pq.write_table(table.filter(pc.invert(pc.fill_null(drop, False))), corrected / file.name)

    def batch(events: Path, output: Path, *options: str):
        return run(spark, parse_args(["--events", str(events), "--format", "parquet", "--mode",
                                      "batch", "--output", str(output), "--dead-letter",
                                      str(output) + "-dead", "--quiet", *options]))

    out, full = tmp_path / "out", tmp_path / "full"
    batch(data, out)
    before = table_rows(out)
    batch(corrected, full)
    batch(corrected, out, "--goals-from", window[0], "--goals-to", window[1])
    commits = history(out)
    assert len(commits) == 2  # the full run, then the backfill: one commit
    assert table_rows(out) == table_rows(full) != before
    assert table_rows(full) == attribute_batch(read_events(corrected))  # the oracle's rows
    # replaceWhere: an overwrite of the planned dates only, in the window or after it.
    replaced = commits[1]["operationParameters"]
    assert replaced["mode"] == "Overwrite" and replaced["predicate"].startswith("goal_date IN")
    start_ms = dt.datetime.fromisoformat(window[0] + "T00:00:00+00:00").timestamp() * 1000
    assert [r for r in table_rows(out) if r.goal_ts < start_ms] == [
        r for r in before if r.goal_ts < start_ms]  # goals before the window keep their rows
