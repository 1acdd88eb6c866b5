"""Backfills in batch mode: ``--goals-from``/``--goals-to`` replace the ``goal_date`` partitions of
a window with the rows a full batch run gives for its goals, and leave every other partition's
files as they were, byte for byte and untouched.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from attribution.config import MODELS
from attribution.oracle import sort_key
from attribution.schema import PARTITION_COLUMN
from attribution.spark.output import BACKFILL_MARKER, read_attribution_rows, read_attributions
from jobs.attribution_job import parse_args, run

WINDOW = ("2024-02-01", "2024-02-29")
# The batch output's commit marker (and its checksum): a backfill removes and writes it again.
MARKERS = {"_SUCCESS", "._SUCCESS.crc"}


@pytest.fixture(scope="module")
def months(tmp_path_factory):
    """Four months of generated events (January to April 2024) and a full batch run over them
    with every model."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    root = tmp_path_factory.mktemp("months")
    dataset = generate(GeneratorParams(users=60, seed=3, files=4, format="parquet",
                                       span="100 days", total_span="120 days"),
                       root / "data", truth=False, plot=False)
    return dataset.events_dir


def batch(spark, events: Path, output: Path, *options: str, fmt: str = "parquet"):
    args = parse_args(["--events", str(events), "--format", fmt, "--mode", "batch",
                       "--output", str(output), "--dead-letter", str(output) + "-dead",
                       "--quiet", *options])
    return run(spark, args)


def snapshot(output: Path) -> dict:
    """Every file under ``output`` but the commit markers: its bytes and modification time, by
    relative path."""
    return {str(p.relative_to(output)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(output.rglob("*")) if p.is_file() and p.name not in MARKERS}


def partition_of(relative: str) -> str:
    """The top-level entry a file lies in: its ``goal_date=`` directory, or itself."""
    return relative.split("/")[0]


def dates_of(files) -> set[str]:
    """The goal dates of the partitions the files lie in."""
    prefix = f"{PARTITION_COLUMN}="
    return {partition_of(f)[len(prefix):] for f in files if f.startswith(prefix)}


def in_window(row, first: str, last: str) -> bool:
    day = dt.datetime.fromtimestamp(row.goal_ts / 1000, dt.timezone.utc).date().isoformat()
    return first <= day <= last


@pytest.mark.slow
def test_a_backfill_of_one_month_replaces_its_partitions_only_with_the_full_runs_rows(
        spark, tmp_path, months):
    output = tmp_path / "out"
    batch(spark, months, output, "--models", "all")
    full = sorted(read_attribution_rows(output), key=sort_key)
    before = snapshot(output)
    assert {day[:7] for day in dates_of(before)} == {"2024-01", "2024-02", "2024-03", "2024-04"}
    window_dirs = {f"{PARTITION_COLUMN}={day}" for day in dates_of(before)
                   if WINDOW[0] <= day <= WINDOW[1]}
    assert len(window_dirs) > 10

    report = batch(spark, months, output, "--models", "all",
                   "--goals-from", WINDOW[0], "--goals-to", WINDOW[1])
    after = snapshot(output)

    # Every file outside the window's partitions is the same file, unchanged and untouched.
    outside = {f: v for f, v in before.items() if partition_of(f) not in window_dirs}
    assert {f: v for f, v in after.items() if partition_of(f) not in window_dirs} == outside
    assert len(dates_of(outside)) == len(dates_of(before)) - len(window_dirs) > 40
    assert (output / "_SUCCESS").is_file() and BACKFILL_MARKER not in after
    # The window's partitions are new files, with the full run's rows for its goals.
    rewritten = {f for f in after if partition_of(f) in window_dirs}
    assert {partition_of(f) for f in rewritten} == window_dirs
    assert not rewritten & {f for f in before if partition_of(f) in window_dirs}
    rows = sorted(read_attribution_rows(output), key=sort_key)
    assert rows == full
    window_rows = [r for r in full if in_window(r, *WINDOW)]
    assert {r.model for r in window_rows} == set(MODELS) and len(window_rows) > 50
    assert report.goals == len({r.goal_event_id for r in window_rows})
    assert report.extra["goal dates"] == f"{len(window_dirs)} replaced, 0 without goals removed"
    assert report.extra["history read"] == "all events before the window's end"
    assert report.extra["dead letter"] == "not written by a backfill"


def _event(kind: str, event_id: str, ts: str, **fields) -> dict:
    if kind == "impression":
        fields = {"impression_id": fields["impression_id"], "source_url": "/s",
                  "target_url": "/land"}
    return {"event_id": event_id, "user_id": "u", "event_type": kind, "ts": ts, **fields}


# A 7-day lookback, so a 7-day history of the February window reads from 2024-01-25. Goal g1, in
# that history, has two candidates: impression 100, a day before the history, and 101 inside it.
# Goal g2, in the window, can reach 101 only (100 is older than the lookback).
CHAIN = [
    _event("impression", "i100", "2024-01-24T10:00:00Z", impression_id=100),
    _event("visit", "v0", "2024-01-24T10:00:05Z", url="/land", referer="/s", is_goal=False),
    _event("impression", "i101", "2024-01-26T01:00:00Z", impression_id=101),
    _event("visit", "v1", "2024-01-26T01:00:05Z", url="/land", referer="/s", is_goal=False),
    _event("visit", "g1", "2024-01-27T10:00:00Z", url="/goal", referer="/land", is_goal=True),
    _event("visit", "g2", "2024-02-01T12:00:00Z", url="/goal2", referer="/land", is_goal=True),
]


@pytest.mark.slow
def test_a_bounded_history_can_change_first_touch_rows_only(spark, tmp_path):
    """first_touch credits g1 the earliest candidate: 100 in a full run, leaving 101 to g2; a
    history that starts after 100 makes g1 take 101, and g2 is organic. last_touch takes 101 for
    g1 either way, and the models that credit every candidate take both: their g2 rows, organic,
    are the full run's."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "part-00000.json").write_text("".join(json.dumps(e) + "\n" for e in CHAIN))
    output, options = tmp_path / "out", ["--models", "all", "--lookback", "7 days"]
    batch(spark, events, output, *options, fmt="json")
    full = {(r.goal_event_id, r.model): r.impression_id for r in read_attribution_rows(output)}
    assert full[("g1", "first_touch")] == 100 and full[("g2", "first_touch")] == 101
    assert full[("g1", "last_touch")] == 101 and full[("g2", "last_touch")] is None

    report = batch(spark, events, output, *options, "--goals-from", WINDOW[0],
                   "--goals-to", WINDOW[1], "--backfill-history", "7 days", fmt="json")
    assert report.extra["history read"] == "7 days (events from 2024-01-25T00:00:00.000Z)"
    bounded = {(r.goal_event_id, r.model): r.impression_id for r in read_attribution_rows(output)}
    assert bounded == {**full, ("g2", "first_touch"): None}

    batch(spark, events, output, *options, "--goals-from", WINDOW[0], "--goals-to", WINDOW[1],
          fmt="json")  # all history: exact again
    assert {(r.goal_event_id, r.model): r.impression_id
            for r in read_attribution_rows(output)} == full


def _goal_events(user: str, day: str) -> list[dict]:
    """An ad click, its landing visit and a goal on ``day`` (UTC)."""
    return [
        {"event_id": f"{user}-i", "user_id": user, "event_type": "impression",
         "ts": f"{day}T10:00:00Z", "impression_id": int(user[1:]), "source_url": "/s",
         "target_url": "/land"},
        {"event_id": f"{user}-v", "user_id": user, "event_type": "visit",
         "ts": f"{day}T10:00:05Z", "url": "/land", "referer": "/s", "is_goal": False},
        {"event_id": f"{user}-g", "user_id": user, "event_type": "visit",
         "ts": f"{day}T10:01:00Z", "url": "/goal", "referer": "/land", "is_goal": True},
    ]


def _write(events_dir: Path, users: dict) -> Path:
    events_dir.mkdir(parents=True, exist_ok=True)
    for f in events_dir.iterdir():
        f.unlink()
    records = [e for user, day in users.items() for e in _goal_events(user, day)]
    (events_dir / "part-00000.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    return events_dir


def test_a_date_that_lost_its_goals_is_removed_and_an_empty_window_changes_nothing(spark,
                                                                                 tmp_path):
    output, events = tmp_path / "out", tmp_path / "events"
    days = {"u1": "2024-01-10", "u2": "2024-01-11", "u3": "2024-01-12"}
    batch(spark, _write(events, days), output, fmt="json")
    dead_letter = snapshot(tmp_path / "out-dead")
    dates = lambda: sorted(p.name for p in output.glob(f"{PARTITION_COLUMN}=*"))  # noqa: E731
    assert dates() == [f"{PARTITION_COLUMN}={d}" for d in days.values()]
    kept = snapshot(output / f"{PARTITION_COLUMN}=2024-01-12")

    # u2's goal is gone from the input: its date is removed, u1's date rewritten, u3's kept.
    report = batch(spark, _write(events, {"u1": "2024-01-10", "u3": "2024-01-12"}), output,
                   "--goals-from", "2024-01-10", "--goals-to", "2024-01-11", fmt="json")
    assert report.extra["goal dates"] == "1 replaced, 1 without goals removed"
    assert dates() == [f"{PARTITION_COLUMN}=2024-01-10", f"{PARTITION_COLUMN}=2024-01-12"]
    assert snapshot(output / f"{PARTITION_COLUMN}=2024-01-12") == kept
    frame = read_attributions(output)
    assert sorted(frame["goal_event_id"]) == ["u1-g", "u3-g"]
    assert sorted(map(str, frame[PARTITION_COLUMN])) == ["2024-01-10", "2024-01-12"]

    # A window without any goal in the input writes nothing and removes nothing.
    before = snapshot(output)
    report = batch(spark, _write(events, {"u1": "2024-01-10"}), output,
                   "--goals-from", "2024-01-12", "--goals-to", "2024-01-20", fmt="json")
    assert report.goals == 0
    assert report.extra["goal dates"] == ("no goal of the window in --events: the output is "
                                          "unchanged")
    assert snapshot(output) == before
    assert snapshot(tmp_path / "out-dead") == dead_letter  # a backfill writes no dead letter
    assert sorted(read_attributions(output)["goal_event_id"]) == ["u1-g", "u3-g"]
