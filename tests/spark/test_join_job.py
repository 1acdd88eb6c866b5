"""jobs/join_job.py end to end: its Parquet output equals an independent join of the input files.

The input is a generated click stream (impressions, the visits they cause after various delays,
visits from other referers, other users), written in event-time order, one file per micro-batch,
then a heartbeat a day later that pushes the watermark past every bound. Nothing is late, so the
streaming join must equal the plain-Python join below, row for row, for every strategy.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from attribution.config import MS_PER_DAY, MS_PER_MINUTE, parse_duration_ms
from attribution.events import Event, ms_to_iso, ts_to_ms
from attribution.schema import EVENT_FIELDS
from attribution.spark.files import data_files, read_events, write_events
from joins.testing import FAST_STATE_CONF, session_conf
from support import FILE_TIME, ROOT

JOB = ROOT / "jobs" / "join_job.py"
BASE_MS = ts_to_ms("2024-03-01T08:00:00Z")
SOURCES = [f"http://search.example/?q={w}" for w in ("shoes", "hats", "bags")]
TARGETS = [f"http://shop.example/{w}" for w in ("shoes", "hats", "bags", "socks")]
WINDOW, MAX_DELAY = "1 hour", "30 minutes"


@pytest.fixture(scope="module", autouse=True)
def _fast_state_store(spark):
    with session_conf(spark, FAST_STATE_CONF):
        yield


def generate_clicks(seed: int = 11, users: int = 5, impressions_per_user: int = 7) -> list[Event]:
    """Impressions and visits over three hours, with clicks inside and outside every bound."""
    rnd = random.Random(seed)
    ids = itertools.count()
    events = []

    def visit(user, ts, url, referer):
        events.append(Event(f"v{next(ids)}", user, "visit", ts, url=url, referer=referer,
                            is_goal=rnd.random() < 0.2))

    for u in range(users):
        user = f"user-{u}"
        for _ in range(impressions_per_user):
            ts = BASE_MS + rnd.randrange(180 * MS_PER_MINUTE)
            source, target = rnd.choice(SOURCES), rnd.choice(TARGETS)
            events.append(Event(f"i{next(ids)}", user, "impression", ts, impression_id=next(ids),
                                source_url=source, target_url=target))
            # A click within, at, or beyond 30 minutes, or (clock skew) before the impression.
            delay = rnd.choice([0, rnd.randrange(1, 29 * MS_PER_MINUTE), 30 * MS_PER_MINUTE,
                                rnd.randrange(31 * MS_PER_MINUTE, 90 * MS_PER_MINUTE),
                                -rnd.randrange(1, 10 * MS_PER_MINUTE)])
            visit(user, ts + delay, target, source)
            if rnd.random() < 0.3:  # a second click on the same ad
                visit(user, ts + rnd.randrange(20 * MS_PER_MINUTE), target, source)
            if rnd.random() < 0.3:  # the landing page reached from elsewhere: no match
                visit(user, ts + rnd.randrange(20 * MS_PER_MINUTE), target, "http://other.example/")
            if rnd.random() < 0.3:  # another user clicking the same kind of ad: no match
                visit(f"user-{u + users}", ts + rnd.randrange(20 * MS_PER_MINUTE), target, source)
        visit(user, BASE_MS + rnd.randrange(180 * MS_PER_MINUTE), rnd.choice(TARGETS), None)
    return sorted(events, key=lambda e: (e.ts, e.event_id))


def heartbeat_ms(events: list[Event]) -> int:
    return events[-1].ts + MS_PER_DAY


def write_input(events: list[Event], directory: Path, fmt: str, files: int = 4) -> None:
    """Events in time order over ``files`` files, then a heartbeat one day after the last.

    Spark's file source reads new files in modification-time order (millisecond resolution), not
    by name, so each file gets its own modification time, one second after the previous one.
    """
    directory.mkdir(parents=True)
    size = -(-len(events) // files)
    chunks = [events[n * size:(n + 1) * size] for n in range(files)]
    chunks.append([Event("hb", None, "heartbeat", heartbeat_ms(events))])
    first_mtime = FILE_TIME
    for n, chunk in enumerate(chunks):
        path = directory / f"part-{n:05d}.{fmt}"
        write_events(chunk, path, fmt)
        os.utime(path, (first_mtime + n, first_mtime + n))


def _prefixed(event: Event, prefix: str) -> dict:
    return {prefix + k: v for k, v in event.to_record().items()}


def independent_join(events: list[Event], strategy: str, how: str) -> Counter:
    """The click-through join computed directly over the events, as a multiset of output rows."""
    window_ms, max_delay_ms = parse_duration_ms(WINDOW), parse_duration_ms(MAX_DELAY)
    impressions = [e for e in events if e.is_impression]
    visits = [e for e in events if e.is_visit]

    def in_time(i: Event, v: Event) -> bool:
        same_window = i.ts // window_ms == v.ts // window_ms
        in_range = i.ts <= v.ts <= i.ts + max_delay_ms
        return {"state-key": same_window, "state-value": in_range,
                "mixed": same_window and in_range}[strategy]

    pairs = [(i, v) for i in impressions for v in visits
             if (i.user_id, i.target_url, i.source_url) == (v.user_id, v.url, v.referer)
             and in_time(i, v)]
    null_impression = {f"impression_{k}": None for k in EVENT_FIELDS}
    null_visit = {f"visit_{k}": None for k in EVENT_FIELDS}
    if how == "left_semi":
        rows = [_prefixed(i, "impression_") for i in {i.event_id: i for i, _ in pairs}.values()]
    else:
        rows = [{**_prefixed(i, "impression_"), **_prefixed(v, "visit_")} for i, v in pairs]
        matched_i = {i.event_id for i, _ in pairs}
        matched_v = {v.event_id for _, v in pairs}
        if how in ("left_outer", "full_outer"):
            rows += [{**_prefixed(i, "impression_"), **null_visit}
                     for i in impressions if i.event_id not in matched_i]
        if how in ("right_outer", "full_outer"):
            rows += [{**null_impression, **_prefixed(v, "visit_")}
                     for v in visits if v.event_id not in matched_v]
    return Counter(tuple(sorted(r.items())) for r in rows)


def read_output(output: Path) -> Counter:
    rows = []
    for f in data_files(output):
        for r in pq.read_table(f).to_pylist():
            for k in ("impression_ts", "visit_ts"):
                if r.get(k) is not None:
                    r[k] = ts_to_ms(r[k])
            rows.append(tuple(sorted(r.items())))
    return Counter(rows)


@pytest.fixture(scope="module")
def clicks() -> list[Event]:
    return generate_clicks()


def _run_job(spark, tmp_path, events, fmt, strategy, how):
    from jobs import join_job

    events_dir = tmp_path / "events"
    write_input(events, events_dir, fmt)
    assert read_events(events_dir)[:-1] == events  # what the job reads is what we generated
    metrics = tmp_path / "metrics.json"
    args = join_job.parse_args([
        "--events", str(events_dir), "--format", fmt, "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "ckpt"), "--max-files-per-trigger", "1",
        "--strategy", strategy, "--how", how, "--window", WINDOW, "--max-delay", MAX_DELAY,
        "--metrics", str(metrics), "--quiet"])
    join_job.write_metrics(join_job.run(spark, args), args)
    return read_output(tmp_path / "out"), json.loads(metrics.read_text())


CASES = [
    ("state-key", "inner", "json"),
    ("state-value", "inner", "json"),
    ("mixed", "inner", "json"),
    pytest.param("state-value", "left_outer", "parquet", marks=pytest.mark.slow),
    pytest.param("state-key", "full_outer", "json", marks=pytest.mark.slow),
    pytest.param("mixed", "left_semi", "parquet", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("strategy,how,fmt", CASES)
def test_job_output_equals_an_independent_join(spark, tmp_path, clicks, strategy, how, fmt):
    expected = independent_join(clicks, strategy, how)
    actual, metrics = _run_job(spark, tmp_path, clicks, fmt, strategy, how)

    assert sum(expected.values()) > 10  # the data really exercises the join
    assert actual == expected
    assert metrics["totals"]["dropped_by_watermark"] == 0  # nothing was late
    assert metrics["totals"]["batches"] >= 5  # one micro-batch per input file
    assert metrics["totals"]["output_rows"] == sum(expected.values())  # observed rows written
    detected = {"state-key": "state-key", "mixed": "state-key", "state-value": "state-value"}[strategy]
    assert metrics["detected"]["impression"]["strategy"] == detected
    assert metrics["detected"]["visit"]["strategy"] == detected
    assert metrics["matches_expected"] is True and metrics["mismatches"] == []
    # The heartbeat advanced both sides: W = min over the sides = heartbeat - 10 minutes.
    assert metrics["batches"][-1]["watermark"] == ms_to_iso(heartbeat_ms(clicks) - 10 * MS_PER_MINUTE)


def test_strategies_really_differ_on_this_data(clicks):
    """Guard against a dataset where all strategies agree (the comparison would prove less)."""
    key, value, mixed = (independent_join(clicks, s, "inner") for s in ("state-key", "state-value", "mixed"))
    assert key != value and mixed != key and mixed != value
    assert mixed == key & value


def test_help_runs_as_a_script_and_shows_defaults():
    out = subprocess.run([sys.executable, str(JOB), "--help"], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps to the terminal width
    for expected in ("--strategy", "state-key", "(default: state-value)", "(default: 30 minutes)",
                     "(default: 1 hour)", "(default: 10 minutes)", "--impression-watermark-delay",
                     "--metrics FILE.json"):
        assert expected in text


@pytest.mark.parametrize("argv,message", [
    (["--events", "/no/such/dir"], "is not a directory"),
    (["--events", ".", "--window", "an hour"], "not a duration"),
    (["--events", ".", "--strategy", "fastest"], "invalid choice"),
    (["--events", ".", "--how", "left_anti"], "invalid choice"),
])
def test_bad_arguments_get_a_clear_error(capsys, argv, message):
    from jobs import join_job

    with pytest.raises(SystemExit) as exit_info:
        join_job.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_spark_submit_run_writes_metrics_and_equal_output(tmp_path, clicks):
    events_dir = tmp_path / "events"
    write_input(clicks, events_dir, "json")
    metrics = tmp_path / "m.json"
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run(
        [str(spark_submit), "--master", "local[2]", str(JOB), "--events", str(events_dir),
         "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt"),
         "--max-files-per-trigger", "2", "--shuffle-partitions", "1", "--strategy", "mixed",
         "--impression-watermark-delay", "5 minutes", "--metrics", str(metrics)],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_output(tmp_path / "out") == independent_join(clicks, "mixed", "inner")
    # spark-submit's PythonRunner merges the driver's stderr into its stdout.
    logs = out.stdout + out.stderr
    assert "batch 0: read" in logs  # per-batch progress
    assert "matches the operator's promise" in logs  # final report
    recorded = json.loads(metrics.read_text())
    assert recorded["watermark_delay"] == {"impression": "5 minutes", "visit": "10 minutes"}
    # Both sides saw the heartbeat: the impression side alone would give heartbeat - 5 minutes,
    # an impression side stuck at its last impression would give far less.
    assert recorded["batches"][-1]["watermark"] == ms_to_iso(heartbeat_ms(clicks) - 10 * MS_PER_MINUTE)
    assert recorded["matches_expected"] is True
    assert [b["batch_id"] for b in recorded["batches"]] == list(range(len(recorded["batches"])))
