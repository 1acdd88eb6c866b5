"""Checkpoints written before attribution models, campaigns and values existed resume unchanged.

``tests/data/legacy_checkpoints`` holds, per state layout, a query stopped by the single-model
version of the job after two of four event files (see its README). Each is unpacked here, its
paths rewritten to this test's directory, and resumed by the current job with the options it was
started with: every row, before and after the restart, must be the batch oracle's, and state
held across the restart (a last_touch consumption, a pending goal, an applyInPandasWithState
inbox) must count.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from attribution.oracle import attribute_batch, sort_key
from attribution.spark.checkpoint import LAYOUT_FILE, CheckpointMismatch, pin_state_layout
from attribution.spark.files import read_events
from attribution.spark.output import committed_files, read_attribution_rows
from jobs.attribution_job import parse_args, run
from support import ROOT
from support.datasets import stage_in_arrival_order

FIXTURES = ROOT / "tests" / "data" / "legacy_checkpoints"
WRITTEN_UNDER = "/tmp/attribution-legacy-checkpoint"  # the paths inside the archives
LAYOUTS = {
    "applyInPandasWithState": ["--backend", "applyInPandasWithState"],
    "applyInPandasWithState-per-user": ["--backend", "applyInPandasWithState",
                                        "--state-buckets", "0"],
    "transformWithState": ["--backend", "transformWithState"],
    "transformWithState-declared": ["--backend", "transformWithState", "--tws-state", "declared"],
}
FIXTURE_MTIME = 1_600_000_000  # make_fixture.py's MTIME: file n was staged at it + n
# The columns of the output before campaign, value and revisions existed.
OLD_COLUMNS = ("user_id", "goal_event_id", "goal_url", "goal_ts", "impression_id",
               "impression_event_id", "impression_source_url", "impression_target_url",
               "impression_ts", "trail", "model", "credit")


def unpack(layout: str, tmp_path: Path) -> Path:
    """The layout's archive under ``tmp_path/layout``, its paths rewritten to lie there."""
    base = tmp_path / layout
    with tarfile.open(FIXTURES / f"{layout}.tar.gz") as tar:
        tar.extractall(base, filter="data")
    for f in base.rglob("*"):
        if not f.is_file():
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # the state store's own files hold no paths
            continue
        if WRITTEN_UNDER in text:
            f.write_text(text.replace(f"{WRITTEN_UNDER}/{layout}", str(base)))
    return base


def _old_columns(row) -> tuple:
    return tuple(getattr(row, c) for c in OLD_COLUMNS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_checkpoint_of_the_single_model_version_resumes_with_the_oracles_rows(spark, tmp_path,
                                                                               layout):
    base = unpack(layout, tmp_path)
    before = read_attribution_rows(base / "out")
    assert [(r.goal_event_id, r.impression_id) for r in before] == [("a-goal-1", 2)]

    files = sorted((FIXTURES / "events").glob("part-*.json"))
    # The first two files are in the checkpoint's source log, with the modification times the
    # fixture gave them: staged with others, Spark's file source would take them for new files
    # (it forgets entries older than its newest file's time minus maxFileAge). Those times are
    # years before the events, so --max-future-skew is widened to keep them valid.
    events = stage_in_arrival_order(files, base / "events", FIXTURE_MTIME)
    args = parse_args(["--events", str(events), "--output", str(base / "out"),
                       "--checkpoint", str(base / "checkpoint"), "--quiet",
                       "--max-files-per-trigger", "1", "--watermark-delay", "1 minute",
                       "--max-future-skew", "36500 days", *LAYOUTS[layout]])
    report = run(spark, args)

    expected = attribute_batch(read_events(FIXTURES / "events"))
    rows = sorted(read_attribution_rows(base / "out"), key=sort_key)
    assert [_old_columns(r) for r in rows] == [_old_columns(r) for r in expected]
    # alice's second goal gets impression 1: impression 2, later, was consumed before the restart.
    assert [(r.goal_event_id, r.impression_id, r.trail) for r in rows] == [
        ("a-goal-1", 2, ("/land",)), ("a-goal-2", 1, ("/land",)), ("b-goal", 7, ("/shop",)),
        ("d-goal", 9, ("/d",))]
    # Rows written after the restart are the current version's, new columns included.
    after = [r for r in rows if r.goal_event_id != "a-goal-1"]
    assert after == [r for r in expected if r.goal_event_id != "a-goal-1"]
    assert report.goals == 3 and report.late_rows == 0
    assert json.loads((base / "checkpoint" / LAYOUT_FILE).read_text()).get("models") is None
    # The output and the dead letter were written without date partitions: they keep that
    # layout, every committed file at the top level, as the old ones are.
    assert {f.parent for f in committed_files(base / "out")} == {base / "out"}
    for directory in (base / "out", base / "out-dead-letter"):
        assert not [p for p in directory.iterdir() if p.is_dir() and "=" in p.name], directory


def test_a_checkpoint_without_models_means_last_touch_alone(tmp_path):
    base = unpack("applyInPandasWithState", tmp_path)
    checkpoint = str(base / "checkpoint")
    for models in ("last_touch", "all", "linear"):
        args = parse_args(["--events", str(tmp_path), "--checkpoint", checkpoint,
                           "--models", models])
        if models == "last_touch":
            pin_state_layout(checkpoint, args.backend, args.state_buckets, args.tws_state,
                             args.config)
            continue
        asked = ",".join(args.config.models)
        with pytest.raises(CheckpointMismatch, match="started with --models last_touch; this "
                                                     f"run asks for --models {asked}"):
            pin_state_layout(checkpoint, args.backend, args.state_buckets, args.tws_state,
                             args.config)


def test_the_half_life_is_pinned_only_with_time_decay(tmp_path):
    def pin(checkpoint, *options):
        args = parse_args(["--events", str(tmp_path), "--checkpoint", str(checkpoint), *options])
        return pin_state_layout(args.checkpoint, args.backend, args.state_buckets,
                                args.tws_state, args.config, shuffle_partitions=2)

    pin(tmp_path / "decay", "--models", "all", "--half-life", "1 day")
    layout = json.loads((tmp_path / "decay" / LAYOUT_FILE).read_text())
    assert layout["models"] == ["last_touch", "first_touch", "linear", "position_based",
                                "time_decay"] and layout["half_life_ms"] == 86_400_000
    pin(tmp_path / "decay", "--models", "time_decay,last_touch,linear,first_touch,"
                                        "position_based", "--half-life", "24 hours")
    with pytest.raises(CheckpointMismatch, match="--half-life '1 days'; this run asks for "
                                                 "--half-life '1 h'"):
        pin(tmp_path / "decay", "--models", "all", "--half-life", "1 hour")
    # Without time_decay the half-life shapes nothing, and is not pinned.
    pin(tmp_path / "linear", "--models", "linear", "--half-life", "1 day")
    assert "half_life_ms" not in json.loads((tmp_path / "linear" / LAYOUT_FILE).read_text())
    pin(tmp_path / "linear", "--models", "linear", "--half-life", "2 days")
