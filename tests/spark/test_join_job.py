"""jobs/join_job.py end to end: its output (Parquet; in the spark-submit run its default, a Delta
table) equals an independent join of the input files.

Two inputs. A hand-made click stream (impressions, the visits they cause after various delays,
visits from other referers, other users), written in event-time order, one file per micro-batch,
then a heartbeat a day later that pushes the watermark past every bound. And a dataset of the
project's generator with 2% redelivered records and a few invalid records mixed in. Nothing is
late in either, so the streaming join must equal the plain-Python (or pandas) join below, row for
row, for every strategy: redelivered records must not repeat a row, invalid ones must reach the
dead letter with their reason.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from attribution.config import MS_PER_DAY, MS_PER_MINUTE, parse_duration_ms
from attribution.events import Event, ms_to_iso, ts_to_ms
from attribution.spark.files import read_events, write_events
from joins.testing import FAST_STATE_CONF, session_conf
from support import ROOT
from support.commands import SPARK_CODEGEN_DEFAULTS, spark_submit_jar_options
from support.datasets import FILE_TIME, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT

JOB = ROOT / "jobs" / "join_job.py"
BASE_MS = ts_to_ms("2024-03-01T08:00:00Z")
SOURCES = [f"http://search.example/?q={w}" for w in ("shoes", "hats", "bags")]
TARGETS = [f"http://shop.example/{w}" for w in ("shoes", "hats", "bags", "socks")]
WINDOW, MAX_DELAY = "1 hour", "30 minutes"
STRATEGIES = ("state-key", "state-value", "mixed")

# The output schema, written out here rather than taken from the job: output column -> the
# event field it holds. user_id is the impression's, or an unmatched visit's.
IMPRESSION_COLUMNS = {"impression_id": "impression_id", "impression_event_id": "event_id",
                      "impression_ts": "ts", "impression_source_url": "source_url",
                      "impression_target_url": "target_url"}
VISIT_COLUMNS = {"visit_event_id": "event_id", "visit_ts": "ts", "visit_url": "url",
                 "visit_referer": "referer", "visit_is_goal": "is_goal"}
OUTPUT_COLUMNS = ["user_id", *IMPRESSION_COLUMNS, *VISIT_COLUMNS]


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


def _columns(event, columns: dict) -> dict:
    """An event's output columns (all null without an event)."""
    record = event.to_record() if event is not None else {}
    return {name: record.get(field) for name, field in columns.items()}


def _row(i, v) -> dict:
    user = i.user_id if i is not None else v.user_id
    return {"user_id": user, **_columns(i, IMPRESSION_COLUMNS), **_columns(v, VISIT_COLUMNS)}


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
    if how == "left_semi":
        rows = [{"user_id": i.user_id, **_columns(i, IMPRESSION_COLUMNS)}
                for i in {i.event_id: i for i, _ in pairs}.values()]
    else:
        rows = [_row(i, v) for i, v in pairs]
        matched_i = {i.event_id for i, _ in pairs}
        matched_v = {v.event_id for _, v in pairs}
        if how in ("left_outer", "full_outer"):
            rows += [_row(i, None) for i in impressions if i.event_id not in matched_i]
        if how in ("right_outer", "full_outer"):
            rows += [_row(None, v) for v in visits if v.event_id not in matched_v]
    return Counter(tuple(sorted(r.items())) for r in rows)


def output_rows(spark, output: Path) -> list[dict]:
    """The rows the job's file sink committed (read through its log), times in epoch ms."""
    from pyspark.sql import functions as F

    delta = (output / "_delta_log").is_dir()  # a new output's format: Delta
    frame = (spark.read.format("delta").load(str(output)) if delta
             else spark.read.parquet(str(output)))
    for name in ("impression_ts", "visit_ts"):
        if name in frame.columns:
            frame = frame.withColumn(name, F.unix_millis(name))
    return [r.asDict() for r in frame.collect()]


def read_output(spark, output: Path) -> Counter:
    return Counter(tuple(sorted(r.items())) for r in output_rows(spark, output))


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
        "--metrics", str(metrics), "--quiet", *PARQUET_OUTPUT])
    join_job.write_metrics(join_job.run(spark, args), args)
    return read_output(spark, tmp_path / "out"), json.loads(metrics.read_text())


CASES = [
    ("state-key", "inner", "json"),
    ("state-value", "inner", "json"),
    ("mixed", "inner", "json"),
    ("state-value", "left_outer", "parquet"),
    ("state-key", "full_outer", "json"),
    ("mixed", "left_semi", "parquet"),
]


@pytest.mark.parametrize("strategy,how,fmt", CASES)
def test_job_output_equals_an_independent_join(spark, tmp_path, clicks, strategy, how, fmt):
    expected = independent_join(clicks, strategy, how)
    actual, metrics = _run_job(spark, tmp_path, clicks, fmt, strategy, how)

    assert sum(expected.values()) > 10  # the data really exercises the join
    assert actual == expected
    assert metrics["totals"]["dropped_by_watermark"] == 0  # nothing was late
    assert metrics["totals"]["batches"] >= 5  # one micro-batch per input file
    assert metrics["totals"]["records_read"] == len(clicks) + 1  # each record once, heartbeat too
    assert metrics["totals"]["invalid"] == metrics["totals"]["duplicates_dropped"] == 0
    assert metrics["totals"]["output_rows"] == sum(expected.values())  # observed rows written
    detected = {"state-key": "state-key", "mixed": "state-key",
                "state-value": "state-value"}[strategy]
    assert metrics["detected"]["impression"]["strategy"] == detected
    assert metrics["detected"]["visit"]["strategy"] == detected
    assert metrics["matches_expected"] is True and metrics["mismatches"] == []
    # The heartbeat advanced both sides: W = min over the sides = heartbeat - 10 minutes.
    assert metrics["batches"][-1]["watermark"] == ms_to_iso(
        heartbeat_ms(clicks) - 10 * MS_PER_MINUTE)


def test_strategies_really_differ_on_this_data(clicks):
    """Guard against a dataset where all strategies agree (the comparison would prove less)."""
    key, value, mixed = (independent_join(clicks, s, "inner")
                         for s in ("state-key", "state-value", "mixed"))
    assert key != value and mixed != key and mixed != value
    assert mixed == key & value


def test_help_runs_as_a_script_and_shows_defaults():
    out = subprocess.run([sys.executable, str(JOB), "--help"], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps to the terminal width
    for expected in ("--strategy", "state-key", "(default: state-value)", "(default: 30 minutes)",
                     "(default: 1 hour)", "(default: 10 minutes)", "--impression-watermark-delay",
                     "--metrics FILE.json", "--dead-letter DIR", "(default: <output>-dead-letter)",
                     "deduplicated by event_id"):
        assert expected in text
    # The output schema, one line per column with its type.
    for column, kind in (("user_id", "string"), ("impression_id", "long"),
                         ("impression_ts", "timestamp"), ("visit_is_goal", "boolean")):
        assert re.search(rf"\b{column} +{kind} ", out.stdout), column
    assert all(column in text for column in OUTPUT_COLUMNS)


@pytest.mark.parametrize("argv,message", [
    (["--events", ".", "--window", "an hour"], "not a duration"),
    (["--events", ".", "--strategy", "fastest"], "invalid choice"),
    (["--events", ".", "--how", "left_anti"], "invalid choice"),
    (["--events", ".", "--max-future-skew", "soon"], "not a duration"),
])
def test_bad_arguments_get_a_clear_error(capsys, argv, message):
    from jobs import join_job

    with pytest.raises(SystemExit) as exit_info:
        join_job.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# The second tier: make test runs the join job under spark-submit in
# tests/system/test_spark_submit.py (SIGINT, its report and exit code).
@pytest.mark.slow
def test_spark_submit_run_writes_metrics_and_equal_output(spark, tmp_path, clicks):
    events_dir = tmp_path / "events"
    write_input(clicks, events_dir, "json")
    metrics = tmp_path / "m.json"
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run(
        [str(spark_submit), "--master", "local[2]", *spark_submit_jar_options(),
         *SPARK_CODEGEN_DEFAULTS, str(JOB),
         "--events", str(events_dir),
         "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt"),
         "--max-files-per-trigger", "2", "--shuffle-partitions", "1", "--strategy", "mixed",
         "--impression-watermark-delay", "5 minutes", "--metrics", str(metrics)],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_output(spark, tmp_path / "out") == independent_join(clicks, "mixed", "inner")
    # spark-submit's PythonRunner merges the driver's stderr into its stdout.
    logs = out.stdout + out.stderr
    assert "batch 0: read" in logs  # per-batch progress
    assert "matches the operator's promise" in logs  # final report
    recorded = json.loads(metrics.read_text())
    assert recorded["watermark_delay"] == {"impression": "5 minutes", "visit": "10 minutes"}
    # Both sides saw the heartbeat: the impression side alone would give heartbeat - 5 minutes,
    # an impression side stuck at its last impression would give far less.
    assert recorded["batches"][-1]["watermark"] == ms_to_iso(
        heartbeat_ms(clicks) - 10 * MS_PER_MINUTE)
    assert recorded["matches_expected"] is True
    assert [b["batch_id"] for b in recorded["batches"]] == list(range(len(recorded["batches"])))


# -- generated data with redelivered and invalid records ----------------------------------------

# Invalid records, each a copy of a real record under a new event_id with one thing wrong,
# injected into the second input file: event_id -> (the change, the expected dead-letter reason).
INVALID = {
    "bad-ts": ({"ts": "yesterday"}, "unparseable ts 'yesterday'"),
    "no-user": ({"user_id": None}, "missing user_id"),
    "click": ({"event_type": "click"}, "unknown event_type 'click'"),
}


@pytest.fixture(scope="module")
def redelivered(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A generated dataset with 2% redelivery and the ``INVALID`` records: its event directory,
    and the generated (valid) records as read from the files, copies included."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    root = tmp_path_factory.mktemp("redelivered")
    params = GeneratorParams(users=30, seed=1, files=4, heartbeat=True, redelivery_rate=0.02,
                             watermark_delay="10 minutes")
    dataset = generate(params, root, truth=False, plot=False)
    assert dataset.manifest["disorder"]["no_late_events"] is True
    files = sorted(dataset.events_dir.glob("part-*.json"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]

    target = files[1]
    visit = next(json.loads(line) for line in target.read_text().splitlines()
                 if json.loads(line)["event_type"] == "visit")
    bad = [json.dumps({**visit, "event_id": event_id, **change})
           for event_id, (change, _) in INVALID.items()]
    times = target.stat()
    lines = target.read_text().splitlines()
    target.write_text("\n".join(lines[:5] + bad + lines[5:]) + "\n")
    # The file stream reads files in modification-time order: keep the generator's.
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
    return dataset.events_dir, records


def pandas_click_join(records: list[dict], strategy: str, deduplicate: bool = True) -> Counter:
    """The click-through join of the records in pandas, as a multiset of output rows."""
    frame = pd.DataFrame(records)
    if deduplicate:
        frame = frame.drop_duplicates("event_id")
    frame["ms"] = ((pd.to_datetime(frame["ts"], utc=True, format="ISO8601")
                    - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1))
    impressions = frame[frame["event_type"] == "impression"]
    visits = frame[frame["event_type"] == "visit"]
    pairs = impressions.merge(visits, left_on=["user_id", "target_url", "source_url"],
                              right_on=["user_id", "url", "referer"], suffixes=("_i", "_v"))
    hour, max_delay = 3_600_000, 1_800_000
    same_window = pairs["ms_i"] // hour == pairs["ms_v"] // hour
    in_range = (pairs["ms_i"] <= pairs["ms_v"]) & (pairs["ms_v"] <= pairs["ms_i"] + max_delay)
    keep = {"state-key": same_window, "state-value": in_range,
            "mixed": same_window & in_range}[strategy]
    rows = [{"user_id": p.user_id, "impression_id": int(p.impression_id_i),
             "impression_event_id": p.event_id_i, "impression_ts": int(p.ms_i),
             "impression_source_url": p.source_url_i, "impression_target_url": p.target_url_i,
             "visit_event_id": p.event_id_v, "visit_ts": int(p.ms_v), "visit_url": p.url_v,
             "visit_referer": p.referer_v, "visit_is_goal": bool(p.is_goal_v)}
            for p in pairs[keep].itertuples()]
    return Counter(tuple(sorted(r.items())) for r in rows)


def test_the_generated_data_exercises_redelivery(redelivered):
    """Guard: joined without deduplication, this data repeats (impression, visit) pairs, and the
    strategies disagree on it, so the test below proves something for each."""
    _, records = redelivered
    for strategy in STRATEGIES:
        deduplicated = pandas_click_join(records, strategy)
        assert sum(deduplicated.values()) > 50 and max(deduplicated.values()) == 1
        assert pandas_click_join(records, strategy, deduplicate=False) != deduplicated
    assert pandas_click_join(records, "state-key") != pandas_click_join(records, "state-value")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redelivered_records_join_once_and_invalid_ones_are_dead_lettered(
        spark, tmp_path, redelivered, strategy):
    from jobs.join_job import parse_args, run, write_metrics

    events_dir, records = redelivered
    args = parse_args(["--events", str(events_dir), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "ckpt"), "--dead-letter",
                       str(tmp_path / "dead"), "--metrics", str(tmp_path / "metrics.json"),
                       "--max-files-per-trigger", "1", "--strategy", strategy, "--quiet",
                       *PARQUET_OUTPUT])
    write_metrics(run(spark, args), args)

    rows = output_rows(spark, tmp_path / "out")
    assert rows and all(sorted(r) == sorted(OUTPUT_COLUMNS) for r in rows)
    pairs = Counter((r["impression_event_id"], r["visit_event_id"]) for r in rows)
    assert max(pairs.values()) == 1  # no (impression, visit) pair twice
    assert all(value is not None for r in rows for value in r.values())  # no null column
    expected = pandas_click_join(records, strategy)
    assert read_output(spark, tmp_path / "out") == expected

    dead = {json.loads(r.raw_record)["event_id"]: r.reason
            for r in spark.read.parquet(str(tmp_path / "dead")).collect()}
    assert dead == {event_id: reason for event_id, (_, reason) in INVALID.items()}

    metrics = json.loads((tmp_path / "metrics.json").read_text())
    totals = metrics["totals"]
    copies = sum(1 for r in records if r["event_type"] != "heartbeat") - len(
        {r["event_id"] for r in records if r["event_type"] != "heartbeat"})
    assert copies >= 5
    assert totals["records_read"] == len(records) + len(INVALID)  # each record once
    assert totals["invalid"] == len(INVALID)
    assert totals["duplicates_dropped"] == copies
    assert totals["dropped_by_watermark"] == 0
    assert totals["output_rows"] == sum(expected.values())
    assert metrics["matches_expected"] is True
    # Readable: rules in words, times as ISO text; Spark's plan (expression ids, epoch numbers)
    # only under "spark_plan".
    assert "#" in metrics["spark_plan"]["join_node"]
    readable = json.dumps({k: v for k, v in metrics.items() if k != "spark_plan"})
    assert not re.search(r"#\d|\d{10}", readable)
    impression_rule = metrics["promised"]["impression"]["rule"]
    if strategy == "state-value":
        assert impression_rule.endswith("its impression_ts is at or below the watermark "
                                        "minus 30 min and 1 ms")
    else:
        assert impression_rule.endswith("the end of its 1 hour window "
                                        "(impression_join_window.end) is at or below the watermark")
    detected = metrics["detected"]["impression"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", detected["threshold"])
    assert detected["rule"].endswith(detected["threshold"])


# -- Avro input --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def same_seed(tmp_path_factory) -> dict:
    """One seed of the generator written as Avro and as Parquet (2% redelivered records)."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    root = tmp_path_factory.mktemp("join-avro-vs-parquet")
    out = {}
    for fmt in ("avro", "parquet"):
        params = GeneratorParams(users=30, seed=7, files=4, heartbeat=True, format=fmt,
                                 redelivery_rate=0.02, watermark_delay="10 minutes")
        out[fmt] = generate(params, root / fmt, truth=False, plot=False)
        assert out[fmt].manifest["disorder"]["no_late_events"] is True
    return out


# The second tier: make test reads Avro input in the attribution job on both backends
# (tests/spark/test_avro_input.py) and into Parquet under SIGKILL (crash run C).
@pytest.mark.slow
def test_avro_input_joins_to_the_rows_of_parquet_input_of_the_same_seed(spark, tmp_path,
                                                                         same_seed):
    """The join job reads the generator's Avro files through the project's Avro source: the
    same records as its Parquet files of the seed, so the same joined rows, which are the
    independent join of those records."""
    from jobs.join_job import parse_args, run, write_metrics

    inputs = {fmt: stage_in_arrival_order(result.event_files, tmp_path / f"in-{fmt}")
              for fmt, result in same_seed.items()}
    events = {fmt: read_events(directory) for fmt, directory in inputs.items()}
    assert events["avro"] == events["parquet"]  # one dataset, in two formats
    assert {f.suffix for f in inputs["avro"].iterdir()} == {".avro"}
    rows, totals = {}, {}
    for fmt, directory in inputs.items():
        args = parse_args(["--events", str(directory), "--format", fmt,
                           "--output", str(tmp_path / f"out-{fmt}"),
                           "--checkpoint", str(tmp_path / f"ckpt-{fmt}"),
                           "--dead-letter", str(tmp_path / f"dead-{fmt}"),
                           "--metrics", str(tmp_path / f"metrics-{fmt}.json"),
                           "--max-files-per-trigger", "1", "--quiet", *PARQUET_OUTPUT])
        write_metrics(run(spark, args), args)
        rows[fmt] = read_output(spark, tmp_path / f"out-{fmt}")
        totals[fmt] = json.loads((tmp_path / f"metrics-{fmt}.json").read_text())["totals"]
    records = [{**e.to_record(), "ts": ms_to_iso(e.ts)} for e in events["parquet"]]
    expected = pandas_click_join(records, "state-value")
    assert sum(expected.values()) > 20  # the data really exercises the join
    assert rows["avro"] == rows["parquet"] == expected
    assert totals["avro"] == totals["parquet"]
    assert totals["avro"]["records_read"] == len(records)
    assert totals["avro"]["invalid"] == totals["avro"]["dropped_by_watermark"] == 0
    assert totals["avro"]["duplicates_dropped"] > 0  # redelivered copies, joined once
