"""The automatic bucket count of applyInPandasWithState's state (``--state-buckets auto``): how
it follows the shuffle partitions, how a checkpoint keeps it, and the warnings about counts that
hold the stateful stage back."""
from __future__ import annotations

import json

import pytest

from attribution.spark.bucket_keys import MAX_ALIGNED_BUCKETS
from attribution.spark.checkpoint import (
    LAYOUT_FILE,
    CheckpointMismatch,
    needs_shuffle_partitions,
    pin_state_layout,
    shuffle_partitions_of,
)
from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS, state_buckets_for
from jobs.attribution_job import bucket_warnings, parse_args, pin_checkpoint

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
    with pytest.raises(CheckpointMismatch, match="started with .*state_buckets=96.*; this run "
                                                 "asks for .*state_buckets=128.*original "
                                                 "options \\(--state-buckets auto, the default, "
                                                 "takes the checkpoint's count\\)"):
        pin_state_layout(checkpoint, APIWS, 128, "compact")


def test_checkpoints_that_cannot_record_the_count_get_the_old_constant(tmp_path):
    # Started by a version before the layout file: offsets, no record.
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    assert pin_state_layout(str(tmp_path / "old"), APIWS, None, "compact",
                            shuffle_partitions=8).state_buckets == DEFAULT_STATE_BUCKETS
    assert pin_state_layout("hdfs://nn/cp", APIWS, None, "compact").state_buckets == 64


def test_the_job_pins_before_spark_only_when_it_knows_the_partitions(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    args = parse_args(["--events", str(events), "--checkpoint", str(tmp_path / "cp")])
    assert args.state_buckets is None                   # auto
    pin_checkpoint(args)
    assert not (tmp_path / "cp" / LAYOUT_FILE).exists()  # nothing to check, nothing pinned
    pin_checkpoint(args, shuffle_partitions=4)
    assert (args.state_buckets, args.bucket_keys) == (128, "aligned")
    args = parse_args(["--events", str(events), "--checkpoint", str(tmp_path / "cp2"),
                       "--shuffle-partitions", "2"])
    pin_checkpoint(args)
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
