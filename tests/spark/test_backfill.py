"""Backfills in batch mode: after ``--goals-from``/``--goals-to`` over input corrected on those
dates, the output holds a full batch run's rows over the corrected input, goals after the window
included, and only the ``goal_date`` partitions whose rows changed were rewritten: every other
partition's files are as they were, byte for byte and untouched.
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
# The generated months' goals mostly credit an impression of their own day; one, in February,
# credits a January impression: a correction of January then reaches past its window.
JANUARY = ("2024-01-01", "2024-01-31")
# The batch output's commit marker (and its checksum): a backfill removes and writes it again.
MARKERS = {"_SUCCESS", "._SUCCESS.crc"}


@pytest.fixture(scope="module")
def months(tmp_path_factory):
    """Four months of generated events (January to April 2024)."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    root = tmp_path_factory.mktemp("months")
    dataset = generate(GeneratorParams(users=60, seed=3, files=4, format="parquet",
                                       span="100 days", total_span="120 days"),
                       root / "data", truth=False, plot=False)
    return dataset.events_dir


def batch(spark, events: Path, output: Path, *options: str, fmt: str = "parquet"):
    args = parse_args(["--events", str(events), "--format", fmt, "--mode", "batch",
                       "--output", str(output), "--output-format", "parquet",
                       "--dead-letter", str(output) + "-dead",
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


def rows_by_date(output: Path) -> dict:
    """The committed rows of an output, sorted, by goal date (ISO text)."""
    by_date: dict = {}
    for row in sorted(read_attribution_rows(output), key=sort_key):
        by_date.setdefault(_day(row.goal_ts), []).append(row)
    return by_date


def check_exact_and_minimal(before: dict, after: dict, old_rows: dict, output: Path,
                            corrected_full: Path) -> set[str]:
    """Assert what a backfill promises: the output's rows are those of a full run over the
    corrected input, and a date's files are rewritten exactly when its rows changed (the others
    keep their bytes and modification times). Returns the rewritten dates."""
    new_rows = rows_by_date(output)
    assert new_rows == rows_by_date(corrected_full)
    changed = {day for day in old_rows.keys() | new_rows.keys()
               if old_rows.get(day) != new_rows.get(day)}
    for day in old_rows.keys() | new_rows.keys():
        directory = f"{PARTITION_COLUMN}={day}"
        old = {f: v for f, v in before.items() if partition_of(f) == directory}
        new = {f: v for f, v in after.items() if partition_of(f) == directory}
        if day in changed:
            assert not old.keys() & new.keys(), day  # rewritten (or removed)
        else:
            assert new == old, day
    assert (output / "_SUCCESS").is_file() and BACKFILL_MARKER not in after
    return changed


def _correct(events: Path, corrected: Path, old_rows: dict, window: tuple[str, str]) -> int:
    """A correction of the ``window`` dates of a Parquet input: the goals of a third of the
    users removed, and, for up to five goals after the window credited under ``last_touch``
    with an impression before its end, a goal added in the window a second after that
    impression (or after the window's start), on its path (its target and source as url and
    referer), which can take the impression from the later goal. Returns how many were
    added."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    corrected.mkdir()
    schema = None
    for file in sorted(events.glob("*.parquet")):
        table = pq.read_table(file)
        schema = table.schema
        day = pc.strftime(table["ts"], format="%Y-%m-%d")
        last_digit = pc.utf8_slice_codeunits(table["user_id"], -1)
        dropped = pc.and_(pc.and_(pc.greater_equal(day, window[0]),
                                  pc.less_equal(day, window[1])),
                          pc.and_(pc.fill_null(table["is_goal"], False),
                                  pc.is_in(last_digit, value_set=pa.array(["0", "3", "6", "9"]))))
        pq.write_table(table.filter(pc.invert(pc.fill_null(dropped, False))),
                       corrected / file.name)
    taken = [r for day, rows in sorted(old_rows.items()) if day > window[1]
             for r in rows if r.model == "last_touch" and r.impression_ts is not None
             and _day(r.impression_ts) <= window[1]][:5]
    start_ms = int(dt.datetime.fromisoformat(window[0] + "T00:00:00+00:00").timestamp() * 1000)
    added = [{"event_id": f"added-goal-{n}", "user_id": r.user_id, "event_type": "visit",
              "ts": dt.datetime.fromtimestamp(max(r.impression_ts, start_ms) / 1000 + 1,
                                              dt.timezone.utc),
              "url": r.impression_target_url, "referer": r.impression_source_url,
              "is_goal": True} for n, r in enumerate(taken)]
    pq.write_table(pa.Table.from_pylist(added, schema=schema), corrected / "added.parquet")
    return len(added)


def _day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).date().isoformat()


def test_a_backfill_of_a_corrected_month_gives_the_full_runs_rows_and_rewrites_only_changes(
        spark, tmp_path, months):
    output, corrected = tmp_path / "out", tmp_path / "corrected"
    batch(spark, months, output, "--models", "all")
    old_rows, before = rows_by_date(output), snapshot(output)
    assert {day[:7] for day in old_rows} == {"2024-01", "2024-02", "2024-03", "2024-04"}
    assert _correct(months, corrected, old_rows, JANUARY) > 0
    batch(spark, corrected, tmp_path / "full", "--models", "all")

    report = batch(spark, corrected, output, "--models", "all",
                   "--goals-from", JANUARY[0], "--goals-to", JANUARY[1])
    changed = check_exact_and_minimal(before, snapshot(output), old_rows, output,
                                      tmp_path / "full")
    # The added goals take impressions that later goals had: dates after the window change
    # too, and most dates keep their files.
    after_window = {day for day in changed if day > JANUARY[1]}
    assert after_window and len(changed) < len(old_rows) // 2
    removed = {day for day in changed if day not in rows_by_date(output)}
    assert report.extra["goal dates"] == (f"{len(changed) - len(removed)} replaced "
                                          f"({len(after_window)} after the window), "
                                          f"{len(removed)} without goals removed")
    assert report.extra["history read"] == "all events"
    assert report.extra["dead letter"] == "not written by a backfill"
    assert {r.model for day in changed for r in old_rows.get(day, [])} == set(MODELS)

    # Backfilling again over the same input finds nothing to change.
    before = snapshot(output)
    report = batch(spark, corrected, output, "--models", "all",
                   "--goals-from", JANUARY[0], "--goals-to", JANUARY[1])
    assert report.extra["goal dates"] == ("none differs from a full run over --events: the "
                                          "output is unchanged")
    assert snapshot(output) == before


# The case of docs/attribution-job.md: impression i (February 10) leads to goal g2 (March 5);
# the corrected input adds goal g1 (February 20) on the same path, which takes i, so that g2 is
# organic. Users v (goal on March 5 too), w (March 10), x (February 15) and y (January 20) are
# not touched by the correction.
def _path(user: str, tag: str, day: str, impression_id: int, goal_url: str) -> list[dict]:
    """An ad click, its landing visit and a goal on ``day`` (UTC)."""
    return [
        {"event_id": f"{tag}-i", "user_id": user, "event_type": "impression",
         "ts": f"{day}T10:00:00Z", "impression_id": impression_id, "source_url": "/s",
         "target_url": "/land"},
        {"event_id": f"{tag}-v", "user_id": user, "event_type": "visit",
         "ts": f"{day}T10:00:05Z", "url": "/land", "referer": "/s", "is_goal": False},
        {"event_id": f"{tag}-g", "user_id": user, "event_type": "visit",
         "ts": f"{day}T10:01:00Z", "url": goal_url, "referer": "/land", "is_goal": True},
    ]


def _goal(user: str, event_id: str, ts: str, url: str) -> dict:
    return {"event_id": event_id, "user_id": user, "event_type": "visit", "ts": ts, "url": url,
            "referer": "/land", "is_goal": True}


FEBRUARY = (_path("u", "u", "2024-02-10", 1, "/signup")[:2]
            + [_goal("u", "g2", "2024-03-05T09:00:00Z", "/buy")]
            + _path("v", "v", "2024-03-05", 2, "/buy") + _path("w", "w", "2024-03-10", 3, "/buy")
            + _path("x", "x", "2024-02-15", 4, "/buy") + _path("y", "y", "2024-01-20", 5, "/buy"))
FEBRUARY_CORRECTED = FEBRUARY + [_goal("u", "g1", "2024-02-20T09:00:00Z", "/signup")]


def _write_events(directory: Path, records: list[dict]) -> Path:
    directory.mkdir()
    (directory / "part-00000.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def test_the_february_case_credits_no_impression_twice(spark, tmp_path):
    """A backfill of February that adds g1 rewrites February 20 (g1 takes i) and March 5 (g2 is
    organic now; v's row there is the same), and no other date's files."""
    options = ["--models", "last_touch,linear"]
    output = tmp_path / "out"
    batch(spark, _write_events(tmp_path / "events", FEBRUARY), output, *options, fmt="json")
    old_rows, before = rows_by_date(output), snapshot(output)
    g2 = [r for r in old_rows["2024-03-05"] if r.goal_event_id == "g2"]
    assert {(r.model, r.impression_id) for r in g2} == {("last_touch", 1), ("linear", 1)}
    corrected = _write_events(tmp_path / "corrected", FEBRUARY_CORRECTED)
    batch(spark, corrected, tmp_path / "full", *options, fmt="json")

    report = batch(spark, corrected, output, *options, "--goals-from", "2024-02-01",
                   "--goals-to", "2024-02-29", fmt="json")
    changed = check_exact_and_minimal(before, snapshot(output), old_rows, output,
                                      tmp_path / "full")
    assert changed == {"2024-02-20", "2024-03-05"}
    assert report.extra["goal dates"] == ("2 replaced (1 after the window), 0 without goals "
                                          "removed")
    rows = read_attribution_rows(output)
    credited = [(r.model, r.user_id, r.impression_id) for r in rows
                if r.impression_id is not None]
    assert len(credited) == len(set(credited)) == 10  # i once per model, and v, w, x, y's
    assert {(r.goal_event_id, r.model): r.impression_id for r in rows if r.user_id == "u"} == {
        ("g1", "last_touch"): 1, ("g1", "linear"): 1, ("g2", "last_touch"): None,
        ("g2", "linear"): None}
    assert report.goals == 3  # the goals of the dates written: g1, and g2 and v's on March 5


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
    kept = {day: snapshot(output / f"{PARTITION_COLUMN}={day}")
            for day in ("2024-01-10", "2024-01-12")}

    # u2's goal is gone from the input: its date is removed; u1's rows in the window are the
    # same, so its date keeps its files, as u3's after the window does.
    report = batch(spark, _write(events, {"u1": "2024-01-10", "u3": "2024-01-12"}), output,
                   "--goals-from", "2024-01-10", "--goals-to", "2024-01-11", fmt="json")
    assert report.extra["goal dates"] == ("0 replaced (0 after the window), 1 without goals "
                                          "removed")
    assert dates() == [f"{PARTITION_COLUMN}=2024-01-10", f"{PARTITION_COLUMN}=2024-01-12"]
    assert {day: snapshot(output / f"{PARTITION_COLUMN}={day}") for day in kept} == kept
    frame = read_attributions(output)
    assert sorted(frame["goal_event_id"]) == ["u1-g", "u3-g"]
    assert sorted(map(str, frame[PARTITION_COLUMN])) == ["2024-01-10", "2024-01-12"]

    # A window without any goal in the input writes nothing and removes nothing.
    before = snapshot(output)
    report = batch(spark, _write(events, {"u1": "2024-01-10"}), output,
                   "--goals-from", "2024-01-12", "--goals-to", "2024-01-20", fmt="json")
    assert report.goals == 0
    assert report.extra["goal dates"] == ("no event of the window in --events: the output is "
                                          "unchanged")
    assert snapshot(output) == before
    assert snapshot(tmp_path / "out-dead") == dead_letter  # a backfill writes no dead letter
    assert sorted(read_attributions(output)["goal_event_id"]) == ["u1-g", "u3-g"]


# User q's only February events, impression k and its landing visit, are removed by the
# correction; q's March 7 goal had credited k. Only that row tells a backfill that q is touched.
# Users x (February 15) and w (March 10) are not touched.
REMOVED = (_path("q", "q", "2024-02-10", 7, "/signup")[:2]
           + [_goal("q", "q2", "2024-03-07T09:00:00Z", "/buy")]
           + _path("x", "x", "2024-02-15", 4, "/buy") + _path("w", "w", "2024-03-10", 3, "/buy"))
REMOVED_CORRECTED = [e for e in REMOVED if e["user_id"] != "q" or e["event_id"] == "q2"]


def test_a_removal_reaches_later_goals_and_a_stopped_backfill_is_completed_by_a_rerun(
        spark, tmp_path):
    """The correction removes every February event of q: q is found through its March row (its
    credited impression lies in the window). Then a backfill stopped while replacing March 7
    (its partition gone, ``_BACKFILL`` naming it): the rerun, though it no longer sees q's row,
    rewrites the date ``_BACKFILL`` names, from the input."""
    import shutil

    from attribution.spark import backfill

    output, stopped = tmp_path / "out", tmp_path / "stopped"
    batch(spark, _write_events(tmp_path / "events", REMOVED), output, fmt="json")
    shutil.copytree(output, stopped)
    corrected = _write_events(tmp_path / "corrected", REMOVED_CORRECTED)
    batch(spark, corrected, tmp_path / "full", fmt="json")
    old_rows, window = rows_by_date(output), ("--goals-from", "2024-02-01",
                                              "--goals-to", "2024-02-29")
    assert [r.impression_id for r in old_rows["2024-03-07"]] == [7]

    before = snapshot(output)
    report = batch(spark, corrected, output, *window, fmt="json")
    assert check_exact_and_minimal(before, snapshot(output), old_rows, output,
                                   tmp_path / "full") == {"2024-03-07"}
    assert report.extra["goal dates"] == ("1 replaced (1 after the window), 0 without goals "
                                          "removed")

    february = backfill.GoalWindow(dt.date(2024, 2, 1), dt.date(2024, 2, 29))
    backfill.begin(spark, str(stopped), february, [dt.date(2024, 3, 7)])
    shutil.rmtree(stopped / f"{PARTITION_COLUMN}=2024-03-07")
    kept = {f: v for f, v in snapshot(stopped).items() if BACKFILL_MARKER not in f}
    report = batch(spark, corrected, stopped, *window, fmt="json")
    assert rows_by_date(stopped) == rows_by_date(tmp_path / "full")
    after = snapshot(stopped)
    assert {f: v for f, v in after.items() if not f.startswith(f"{PARTITION_COLUMN}=2024-03-07")
            } == kept
    assert (stopped / "_SUCCESS").is_file() and not (stopped / BACKFILL_MARKER).exists()
