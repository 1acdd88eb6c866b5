"""Section 8 on generated data: impressions that reach the job hours after the visits they led
to, plus records made late on purpose, read one file per micro-batch with an allowed lateness
that accepts some late records and drops others. For each streaming layout that revises:

* the records Spark dropped, derived here from the files alone, are exactly the late-record
  output, each once, and Spark's own count;
* the changelog folds to the batch oracle over the accepted records, row for row;
* per goal and model the revisions run 0, 1, 2, ..., every retraction cancels a row emitted
  before, every revision is LATE, and there are revisions to check.

Spark's rule for a file stream read one file per micro-batch is
``support.reference.dropped_by_spark``; the job gives Spark a delay of ``--watermark-delay`` plus
the allowed lateness (docs/attribution-job.md).
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from attribution import AttributionConfig, attribute_batch
from attribution.config import parse_duration_ms
from attribution.spark.files import data_files, read_events
from attribution.spark.late_records import read_late_records
from attribution.spark.output import read_attribution_rows
from jobs.attribution_job import parse_args, run
from support.datasets import generate_late_dataset, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT
from support.reference import assert_same_rows, dropped_by_spark, folded_rows, revisions_by_goal

DELAY, LATENESS = "10 minutes", "2 hours"
MODELS = ("last_touch", "linear")
LAYOUTS = {"buckets": [], "per-user": ["--state-buckets", "0"],
           "transformWithState": ["--backend", "transformWithState"]}


@pytest.fixture(scope="module")
def late_dataset(tmp_path_factory):
    """The staged files, each file's records, and the records Spark drops, by file."""
    root = tmp_path_factory.mktemp("late-generated")
    result = generate_late_dataset(root, users=30, seed=11, files=12, total_span="4 days",
                                   redelivery_rate=0.03, watermark_delay=DELAY)
    files = [read_events(f) for f in data_files(result.events_dir)]
    dropped = dropped_by_spark(files, parse_duration_ms(DELAY) + parse_duration_ms(LATENESS))
    # The generator's own late records (for the delay alone) include every dropped one.
    assert Counter(e.event_id for k in dropped for e in dropped[k]) <= Counter(
        result.manifest["disorder"]["late_event_ids"])
    events = stage_in_arrival_order(data_files(result.events_dir), root / "events")
    return events, files, dropped


def _run(spark, tmp_path, events, *options):
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), "--quiet", *PARQUET_OUTPUT,
                       "--watermark-delay", DELAY, "--allowed-lateness", LATENESS,
                       "--models", ",".join(MODELS), "--max-files-per-trigger", "1", *options])
    return run(spark, args)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_net_changelog_is_the_oracle_over_the_accepted_records_and_the_rest_is_written(
        spark, tmp_path, late_dataset, layout):
    events, files, dropped = late_dataset
    report = _run(spark, tmp_path, events, *LAYOUTS[layout])
    assert report.batches == len(files) + 1  # one file each, then the timer-only micro-batch

    # Dropped: exactly the late-record output, each record once, from its own file.
    names = [f.name for f in data_files(events)]
    expected_late = Counter((e.event_id, names[k]) for k, records in dropped.items()
                            for e in records)
    written = Counter((json.loads(rec["raw_record"])["event_id"],
                       rec["source_file"].rsplit("/", 1)[-1])
                      for rec in read_late_records(str(tmp_path / "out-late")).to_pylist())
    assert written == expected_late
    assert report.late_rows == sum(expected_late.values()) > 0
    assert report.extra["late accepted"] > 0

    # Accepted: everything else; the changelog folds to the oracle over it.
    gone = {id(e) for records in dropped.values() for e in records}
    accepted = [e for records in files for e in records
                if e.event_type != "heartbeat" and id(e) not in gone]
    changelog = read_attribution_rows(str(tmp_path / "out"))
    oracle = attribute_batch(accepted, AttributionConfig(models=MODELS))
    assert_same_rows(folded_rows(changelog), oracle, "the folded changelog and the oracle")

    # Revisions: 0, 1, 2, ... per goal and model; every revision is LATE.
    revisions = revisions_by_goal(changelog)
    assert all(seen == set(range(len(seen))) for seen in revisions.values())
    assert {r.emit_timing for r in changelog if r.sign == 1 and r.revision > 0} == {"LATE"}
    assert sum(r.sign == -1 for r in changelog) > 0
    assert {m for (_, m), seen in revisions.items() if len(seen) > 1} == set(MODELS)
