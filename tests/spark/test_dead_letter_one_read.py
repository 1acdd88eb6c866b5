"""The dead letter without a second read of the input: the streaming job reads every input file
once when no record is invalid, reads again only the micro-batches that held invalid records,
writes each dead letter once even when a micro-batch is redone, and refuses a dead-letter
directory that another checkpoint's micro-batches filled.

The reads are counted from Spark's own metrics: the "number of files read" of every scan of the
input directory in the SQL executions of the run (Spark's SQL status store, fed by its listener
bus).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attribution.spark.dead_letter import DEAD_LETTERED_DIR, write_dead_letters
from attribution.spark.sources import file_source
from attribution.spark.sources.offset_log import committed_batches
from jobs.attribution_job import main, parse_args, run
from support import stage_in_arrival_order

FILES_READ = "number of files read"  # FileSourceScanExec's metric


def _scala_items(collection) -> list:
    """A Scala collection's elements (through py4j)."""
    iterator, out = collection.iterator(), []
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def _executions(spark) -> list:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    return _scala_items(spark._jsparkSession.sharedState().statusStore().executionsList())


def last_execution_id(spark) -> int:
    """The id of the latest SQL execution Spark has recorded (-1: none)."""
    return max((e.executionId() for e in _executions(spark)), default=-1)


@pytest.fixture
def whole_locations(spark):
    """Plans name their scans' locations in full (Spark cuts them at 100 characters), so that
    ``files_read_since`` can tell the input's scans by their directory."""
    key = "spark.sql.maxMetadataStringLength"
    spark.conf.set(key, "100000")
    yield
    spark.conf.unset(key)


def files_read_since(spark, after: int, under: Path) -> int:
    """How many files under ``under`` Spark's file scans read in the SQL executions after
    ``after``: the sum of the "number of files read" metrics of the scans whose location is
    there (a Delta output's commits scan its own log too, which is not the input)."""
    store = spark._jsparkSession.sharedState().statusStore()
    total = 0
    for execution in _executions(spark):
        if execution.executionId() <= after:
            continue
        ids = {m.accumulatorId()
               for node in _scala_items(store.planGraph(execution.executionId()).allNodes())
               if node.name().startswith("Scan") and str(under) in node.desc()
               for m in _scala_items(node.metrics()) if m.name() == FILES_READ}
        values = {kv._1(): kv._2() for kv in
                  _scala_items(store.executionMetrics(execution.executionId()))}
        total += sum(int(values[i].replace(",", "")) for i in ids if i in values)
    return total


def _with_bad_lines(ch7_dir: Path, tmp_path: Path, bad: dict[int, list[str]]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for n, f in enumerate(sorted(ch7_dir.glob("part-*.json"))):
        (src / f.name).write_text(f.read_text() + "".join(line + "\n" for line in bad.get(n, [])))
    return stage_in_arrival_order(sorted(src.glob("part-*.json")), tmp_path / "events")


def _args(tmp_path: Path, events: Path, *options: str):
    return ["--events", str(events), "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "checkpoint"), "--dead-letter", str(tmp_path / "dead"),
            "--max-files-per-trigger", "1", "--watermark-delay", "3 minutes", "--quiet",
            *options]


def _dead_records(spark, dead: Path) -> list[str]:
    return sorted(r.raw_record for r in spark.read.parquet(str(dead)).collect())


BAD = {2: ["{not json", json.dumps({"event_id": "no-user", "event_type": "visit", "url": "/x",
                                    "ts": "1970-01-01T12:00:00Z"})]}


def test_without_invalid_records_each_input_file_is_read_once(spark, tmp_path, ch7_stream_dir,
                                                              whole_locations):
    inputs = len(list(ch7_stream_dir.glob("part-*.json")))
    before = last_execution_id(spark)
    report = run(spark, parse_args(_args(tmp_path, ch7_stream_dir)))
    assert report.extra["invalid"] == 0 and report.batches >= inputs
    assert files_read_since(spark, before, ch7_stream_dir) == inputs
    # Every committed micro-batch is done, and none wrote a dead letter.
    dead = tmp_path / "dead"
    assert sorted(int(m.name) for m in (dead / DEAD_LETTERED_DIR).iterdir()) == committed_batches(
        tmp_path / "checkpoint")
    assert not list(dead.rglob("*.parquet"))


def test_only_the_micro_batches_with_invalid_records_are_read_again(spark, tmp_path, ch7_dir,
                                                                    whole_locations):
    """The control of the test above: the count does see a second read. One file holds invalid
    records: it alone is read twice, and its invalid records are dead-lettered once."""
    events = _with_bad_lines(ch7_dir, tmp_path, BAD)
    inputs = len(list(events.glob("part-*.json")))
    before = last_execution_id(spark)
    report = run(spark, parse_args(_args(tmp_path, events)))
    assert report.extra["invalid"] == 2
    assert files_read_since(spark, before, events) == inputs + 1
    assert _dead_records(spark, tmp_path / "dead") == sorted(BAD[2])


def test_a_micro_batch_redone_after_a_crash_writes_its_dead_letters_once(spark, tmp_path, ch7_dir):
    """A crash after a micro-batch's dead letters were written and before it was marked done:
    the next run reads it again (its count is unknown to that run) and replaces the same file."""
    events = _with_bad_lines(ch7_dir, tmp_path, BAD)
    run(spark, parse_args(_args(tmp_path, events)))
    dead = tmp_path / "dead"
    files = sorted(dead.rglob("*.parquet"))
    assert len(files) == 1
    shutil.rmtree(dead / DEAD_LETTERED_DIR)  # as if every micro-batch's marker was lost

    written = write_dead_letters(spark, str(tmp_path / "checkpoint"), str(dead),
                                 file_source("json"), 86_400_000, "1 day", invalid={},
                                 decided=lambda batch_id: True)
    assert written == 2
    assert sorted(dead.rglob("*.parquet")) == files
    assert _dead_records(spark, dead) == sorted(BAD[2])
    # A run on the same checkpoint finds nothing new and changes nothing.
    run(spark, parse_args(_args(tmp_path, events)))
    assert _dead_records(spark, dead) == sorted(BAD[2])


def test_a_dead_letter_of_another_checkpoint_is_refused(spark, tmp_path, ch7_dir, capsys):
    events = _with_bad_lines(ch7_dir, tmp_path, BAD)
    assert main(_args(tmp_path, events)) == 0
    capsys.readouterr()
    other = _args(tmp_path, events)
    other[other.index("--checkpoint") + 1] = str(tmp_path / "new-checkpoint")
    other[other.index("--output") + 1] = str(tmp_path / "new-out")
    assert main(other) == 4
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "holds the dead letters of another run" in error[0]
