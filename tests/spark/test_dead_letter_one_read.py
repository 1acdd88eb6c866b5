"""The dead letter without a second read of the input: the streaming job reads again only the
micro-batches that held invalid records, writes each dead letter once even when a micro-batch is
redone, and refuses a dead-letter directory that another checkpoint's micro-batches filled.
(That a stream over clean input reads each input file once is proven on the chapter 7 stream of
test_delta_output; the first test below is its control.)

The reads are counted from Spark's own metrics: the "number of files read" of every scan of the
input directory in the SQL executions of the run (Spark's SQL status store, fed by its listener
bus; ``shared_runs.files_read_since``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attribution.spark.dead_letter import DEAD_LETTERED_DIR, write_dead_letters
from attribution.spark.sources import file_source
from jobs.attribution_job import main, parse_args, run
from shared_runs import files_read_since, last_execution_id
from shared_runs import whole_locations as plans_with_whole_locations
from support.datasets import stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT


@pytest.fixture
def whole_locations(spark):
    """Plans name their scans' locations in full, so that ``files_read_since`` can tell the
    input's scans by their directory."""
    with plans_with_whole_locations(spark):
        yield


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
            *PARQUET_OUTPUT, *options]


def _dead_records(spark, dead: Path) -> list[str]:
    return sorted(r.raw_record for r in spark.read.parquet(str(dead)).collect())


BAD = {2: ["{not json", json.dumps({"event_id": "no-user", "event_type": "visit", "url": "/x",
                                    "ts": "1970-01-01T12:00:00Z"})]}


def test_only_the_micro_batches_with_invalid_records_are_read_again(spark, tmp_path, ch7_dir,
                                                                    whole_locations):
    """The control of the one read of clean input (test_delta_output's chapter 7 stream): the
    count does see a second read. One file holds invalid records: it alone is read twice, and
    its invalid records are dead-lettered once."""
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
