"""The automatic bucket count of applyInPandasWithState's state (``--state-buckets auto``): how
it follows the shuffle partitions, how a checkpoint keeps it, the warnings about counts that hold
the stateful stage back, and the warning when, by the cost model, the buckets' state outweighs
the events of a micro-batch."""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from attribution.spark import cost
from attribution.spark.bucket_keys import MAX_ALIGNED_BUCKETS
from attribution.spark.checkpoint import (
    LAYOUT_FILE,
    CheckpointMismatch,
    needs_shuffle_partitions,
    pin_state_layout,
    shuffle_partitions_of,
)
from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS, OUTPUT_METRICS, state_buckets_for
from jobs.attribution_job import AttributionProgress, bucket_warnings, parse_args, pin_checkpoint

APIWS = "applyInPandasWithState"


@pytest.mark.parametrize("partitions, buckets", [
    (1, 32), (2, 64), (3, 96), (128, 4096),
    (200, 4000),                # the largest multiple of 200 under the cap
    (5000, MAX_ALIGNED_BUCKETS),
])
def test_32_buckets_per_shuffle_partition_up_to_the_cap(partitions, buckets):
    assert state_buckets_for(partitions) == buckets


def test_no_partitions_is_refused():
    with pytest.raises(ValueError, match="shuffle partitions must be >= 1, not 0"):
        state_buckets_for(0)


def test_a_new_checkpoint_records_the_count_and_keeps_it(tmp_path):
    checkpoint = str(tmp_path / "cp")
    assert needs_shuffle_partitions(checkpoint, APIWS, None)
    assert not needs_shuffle_partitions(checkpoint, APIWS, 64)
    assert not needs_shuffle_partitions(checkpoint, "transformWithState", None)
    with pytest.raises(ValueError, match="needs the shuffle partitions"):
        pin_state_layout(checkpoint, APIWS, None, "compact")
    assert pin_state_layout(checkpoint, APIWS, None, "compact",
                            shuffle_partitions=3).state_buckets == 96
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text())["state_buckets"] == 96
    assert not needs_shuffle_partitions(checkpoint, APIWS, None)
    # Later runs keep it, whatever the partitions; an explicit other count is refused.
    assert pin_state_layout(checkpoint, APIWS, None, "compact",
                            shuffle_partitions=8).state_buckets == 96
    assert pin_state_layout(checkpoint, APIWS, 96, "compact").state_buckets == 96
    with pytest.raises(CheckpointMismatch, match="started with --state-buckets 96; this run "
                                                 "asks for --state-buckets 128\\. .*original "
                                                 "options \\(--state-buckets auto, the default, "
                                                 "takes the checkpoint's count\\)"):
        pin_state_layout(checkpoint, APIWS, 128, "compact")


def test_checkpoints_that_cannot_record_the_count_get_the_old_constant(tmp_path):
    # Started by a version before the layout file: offsets, no record.
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    assert pin_state_layout(str(tmp_path / "old"), APIWS, None, "compact",
                            shuffle_partitions=8).state_buckets == DEFAULT_STATE_BUCKETS


def test_a_checkpoint_uri_is_pinned_once_spark_runs_not_skipped(tmp_path, monkeypatch):
    """Before Spark starts a URI cannot be read: the check before Spark leaves the settings as
    they are, and the run pins them once the session (and its Hadoop file systems) exists
    (tests/spark/test_revisions.py: a refusal on a file:// checkpoint)."""
    monkeypatch.setattr("attribution.spark.storage._context", lambda: None)  # before Spark
    events = tmp_path / "events"
    events.mkdir()
    args = parse_args(["--events", str(events), "--checkpoint", "hdfs://nn/cp",
                       "--shuffle-partitions", "2"])
    assert pin_checkpoint(args) == args
    assert args.state_buckets is None and args.bucket_keys is None


def test_the_job_pins_before_spark_only_when_it_knows_the_partitions(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    args = parse_args(["--events", str(events), "--checkpoint", str(tmp_path / "cp")])
    assert args.state_buckets is None                   # auto
    assert pin_checkpoint(args) == args
    assert not (tmp_path / "cp" / LAYOUT_FILE).exists()  # nothing to check, nothing pinned
    args = pin_checkpoint(args, shuffle_partitions=4)
    assert (args.state_buckets, args.bucket_keys) == (128, "aligned")
    args = parse_args(["--events", str(events), "--checkpoint", str(tmp_path / "cp2"),
                       "--shuffle-partitions", "2"])
    args = pin_checkpoint(args)
    assert args.state_buckets == 64


def test_shuffle_partitions_come_from_the_checkpoints_offset_log(tmp_path):
    offsets = tmp_path / "offsets"
    assert shuffle_partitions_of(str(tmp_path)) is None
    offsets.mkdir()
    for batch, partitions in ((0, 3), (1, 3), (10, 7)):
        (offsets / str(batch)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": {
                "spark.sql.shuffle.partitions": str(partitions)}}) + '\n{"logOffset":0}\n')
    (offsets / ".10.crc").write_text("")
    assert shuffle_partitions_of(str(tmp_path)) == 7      # the latest entry, by number


def test_warnings_name_the_count_the_partitions_and_the_remedy():
    assert bucket_warnings(64, 2) == [] and bucket_warnings(0, 16) == []
    [fewer] = bucket_warnings(8, 16)
    assert fewer == ("8 state buckets for 16 shuffle partitions: only 8 of the stateful stage's "
                     "16 tasks have state to work on; a new --checkpoint with --state-buckets "
                     "auto would use 512")
    [uneven] = bucket_warnings(64, 3)
    assert uneven.startswith("64 state buckets do not divide evenly over 3 shuffle partitions: "
                             "each task holds 21 or 22 buckets")


def _batch(batch_id: int, events: int, sst_bytes: int) -> SimpleNamespace:
    """A stand-in of Spark's progress for one micro-batch of the bucketed layout."""
    operator = SimpleNamespace(numRowsDroppedByWatermark=0, numRowsTotal=64,
                               customMetrics={"rocksdbSstFileSize": sst_bytes})
    return SimpleNamespace(batchId=batch_id, numInputRows=events, inputRowsPerSecond=1.0,
                           processedRowsPerSecond=1.0,
                           durationMs={"addBatch": 1, "triggerExecution": 1000},
                           stateOperators=[operator], eventTime={}, observedMetrics={})


def test_a_dominating_state_is_warned_about_once_with_the_cheaper_layout():
    fit = cost.BUCKETED
    # The state size at which the state costs as much CPU as the rest of a 10,000-event
    # micro-batch, and the size below which no warning is given.
    even = fit.seconds(10_000, 0) / fit.c * cost.MB
    floor = cost.WARN_FROM_STATE_SECONDS / fit.c * cost.MB
    small, large = int(0.9 * max(even, floor)), int(1.1 * max(even, floor))
    assert cost.state_dominates(10_000, None) is None
    assert cost.state_dominates(10_000, small) is None
    warning = cost.state_dominates(10_000, large)
    assert warning.startswith(f"by the cost model (docs/sizing.md) the state's "
                              f"{large / cost.MB:,.0f} MB cost about")
    assert "10,000 events" in warning and "--max-files-per-trigger" in warning
    # Cheaper elsewhere only from the crossover on, and then the cheapest layout is named.
    assert "another layout would cost more at this size" in warning
    huge = 100 * large
    cheapest = min(cost.ALTERNATIVES, key=lambda n: cost.ALTERNATIVES[n].seconds(10_000, 0))
    assert f"at this size {cheapest} would cost about" in cost.state_dominates(10_000, huge)

    # The job's progress: three micro-batches in a row, judged by the smallest of their sizes.
    for bucketed, sizes, expected in ((True, [large, 2 * large, large], 1),
                                      (True, [large, small, 2 * large], 0),
                                      (True, [large, large, large, large, large], 1),
                                      (False, [large, large, large], 0)):
        out = io.StringIO()
        progress = AttributionProgress(OUTPUT_METRICS, quiet=True, bucketed=bucketed, stream=out)
        progress.consume([_batch(i, 10_000, size) for i, size in enumerate(sizes)])
        assert out.getvalue().count("warning: by the cost model") == expected, (bucketed, sizes)
