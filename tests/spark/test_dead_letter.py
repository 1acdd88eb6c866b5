"""Bad input: every kind of invalid record is dead-lettered with its reason, counted in the
progress line and the final report, and never costs a good event or moves the watermark.

The streams mix the bad records into the chapter 7 files themselves, so good and bad rows share
files and micro-batches; a bad record leaking through would add or change output rows (most of
them are goals of the chapter's user), and one dropping good rows would change them too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attribution.events import validate
from attribution.oracle import attribute_batch
from attribution.spark.files import read_events
from attribution.spark.validation import classify, read_raw_batch
from jobs.attribution_job import parse_args, run
from support import ROOT
from support.datasets import CH7_ROWS, FILE_TIME, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT

USER = "UserX"
GOOD_VISIT = {"event_id": "bad-visit", "user_id": USER, "event_type": "visit",
              "ts": "1970-01-01T12:03:50.000Z", "url": "http://xyz.com/thing/receipt",
              "referer": "http://xyz.com/thing/purchase", "is_goal": True}
GOOD_IMPRESSION = {"event_id": "bad-impression", "user_id": USER, "event_type": "impression",
                   "ts": "1970-01-01T12:03:40.000Z", "impression_id": 999,
                   "source_url": "http://search.com?q=thing", "target_url": "http://xyz.com/thing"}
HEARTBEAT = {"event_id": "bad-heartbeat", "event_type": "heartbeat",
             "ts": "1970-01-01T12:20:00.000Z"}
ONE_MB = 1 << 20


def _without(record: dict, *names: str) -> dict:
    return {k: v for k, v in record.items() if k not in names}


# (file it is injected into, raw line, expected reason). Most are goals or impressions of the
# chapter's user: leaked through, they would add or change output rows.
BAD_LINES = [
    # part 0: far-future records. Accepted, either would drag the watermark to the far future
    # and make every later event late; the year 9999 would even crash the pandas backend.
    (0, json.dumps({**HEARTBEAT, "event_id": "future-heartbeat", "ts": "2200-01-01T00:00:00Z"}),
     "ts 2200-01-01T00:00:00.000Z is more than 1 day ahead of its file's modification time"),
    (0, json.dumps({**GOOD_VISIT, "event_id": "future-goal", "ts": "9999-12-31T23:59:59.000Z"}),
     "ts 9999-12-31T23:59:59.000Z is more than 1 day ahead of its file's modification time"),
    (1, json.dumps({**GOOD_IMPRESSION, "event_id": "ancient", "ts": "1000-01-01T00:00:00Z"}),
     "ts 1000-01-01T00:00:00.000Z is outside the supported range [1677-09-22T00:00:00Z, "
     "2262-04-11T00:00:00Z)"),
    (1, "this is not JSON", "malformed JSON"),
    (1, '{"event_id": "cut-off", "user_id": "UserX", "event_type": "vis', "malformed JSON"),
    (1, json.dumps(_without(GOOD_VISIT, "user_id")), "missing user_id"),
    (1, json.dumps(_without(GOOD_VISIT, "event_id")), "missing event_id"),
    (2, json.dumps(_without(GOOD_VISIT, "event_type")), "missing event_type"),
    (2, json.dumps({**GOOD_VISIT, "ts": 5}), "ts must be an ISO-8601 string, got int"),
    (2, json.dumps({**GOOD_IMPRESSION, "impression_id": "abc"}),
     "impression_id must be an integer, got str"),
    (2, json.dumps({**GOOD_VISIT, "is_goal": "yes"}), "is_goal must be a boolean, got str"),
    (3, json.dumps({**GOOD_VISIT, "user_id": 42}), "user_id must be a string, got int"),
    (3, json.dumps({**GOOD_VISIT, "ts": None}), "missing ts"),
    (3, json.dumps({**GOOD_VISIT, "ts": "yesterday"}), "unparseable ts 'yesterday'"),
    (3, json.dumps({**GOOD_VISIT, "ts": "1970-01-01T12:03:50"}),
     "ts '1970-01-01T12:03:50' has no UTC offset"),
    (4, json.dumps({**GOOD_VISIT, "event_type": "click"}), "unknown event_type 'click'"),
    (4, json.dumps(_without(GOOD_IMPRESSION, "source_url", "target_url")),
     "impression without source_url"),
    (4, json.dumps({**GOOD_IMPRESSION, "target_url": None}), "impression without target_url"),
    (5, json.dumps(_without(GOOD_VISIT, "url")), "visit without url"),
    (5, json.dumps({**GOOD_VISIT, "url": "http://xyz.com/" + "x" * (ONE_MB - 15)}),
     f"url too long ({ONE_MB} chars > 8192)"),
    (5, json.dumps({**GOOD_IMPRESSION, "source_url": "s" * 8193}),
     "source_url too long (8193 chars > 8192)"),
    (6, "[1, 2, 3]", "record must be an object, got list"),
]
# Redelivered copies of good records (same event_id), each arriving before the watermark passes
# it: they must be deduplicated, not attributed twice.
REDELIVERED = {2: "i-123", 3: "g-signup", 6: "g-receipt"}


def _mixed_ch7(ch7_dir: Path, tmp_path: Path) -> Path:
    """The chapter 7 files with the bad lines and the redelivered copies mixed in."""
    originals = sorted(ch7_dir.glob("part-*.json"))
    by_id = {json.loads(line)["event_id"]: line for f in originals
             for line in f.read_text().splitlines()}
    src = tmp_path / "mixed-src"
    src.mkdir()
    for n, f in enumerate(originals):
        lines = f.read_text().splitlines()
        extra = [line for part, line, _ in BAD_LINES if part == n]
        if n in REDELIVERED:
            extra.append(by_id[REDELIVERED[n]])
        # Bad lines in the middle of the good ones, and a blank line, which is no record at all.
        middle = len(lines) // 2
        (src / f.name).write_text("\n".join(lines[:middle] + extra + [""] + lines[middle:]) + "\n")
    return stage_in_arrival_order(sorted(src.glob("part-*.json")), tmp_path / "events")


def _run(spark, tmp_path: Path, events: Path, *options: str):
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "checkpoint"),
                       "--dead-letter", str(tmp_path / "dead"), *PARQUET_OUTPUT, *options])
    report = run(spark, args)
    return report, _committed_rows(spark, tmp_path / "out")


def _committed_rows(spark, path: Path):
    """Output rows as (goal, impression id, trail), read through the file sink's log."""
    return sorted(((r.goal_event_id, r.impression_id, tuple(r.trail))
                   for r in spark.read.parquet(str(path)).collect()), key=str)


def _dead_letters(spark, path: Path) -> list:
    """The dead letters, after checking their layout: one ``detected_date=`` directory per UTC
    date of detection, holding the dead letters detected that day."""
    from pyspark.sql import functions as F

    assert not list(path.glob("*.parquet")) and list(path.glob("detected_date=*/*.parquet"))
    frame = spark.read.parquet(str(path))  # the session's time zone is UTC
    assert frame.filter(F.col("detected_date") != F.to_date("detected_at")).count() == 0
    return frame.collect()


def test_spark_reasons_match_the_python_validator(spark, tmp_path):
    """Spark's expression-based rules give the reason ``attribution.events.validate`` gives, for
    every JSON record both can judge; the documented differences are asserted explicitly."""
    records = [json.loads(line) for _, line, _ in BAD_LINES if line.startswith("{")
               and "cut-off" not in line]
    records += [GOOD_VISIT, GOOD_IMPRESSION, HEARTBEAT, {**HEARTBEAT, "user_id": 7, "url": 1},
                {**GOOD_VISIT, "referer": 5}, {**GOOD_VISIT, "url": ""},
                {**GOOD_VISIT, "url": {"a": 1}}, {**GOOD_IMPRESSION, "impression_id": 2.0},
                {**GOOD_IMPRESSION, "impression_id": 2.5},
                {**GOOD_IMPRESSION, "impression_id": True},
                {**GOOD_VISIT, "event_id": ""}, {**GOOD_VISIT, "is_goal": None},
                {**GOOD_VISIT, "ts": "1970-01-01T12:03:50.123456+02:00"},
                # campaign and value (spec section 7)
                {**GOOD_VISIT, "value": 12.5}, {**GOOD_VISIT, "value": 3},
                {**GOOD_VISIT, "value": -0.25, "is_goal": False}, {**GOOD_VISIT, "value": None},
                {**GOOD_VISIT, "value": "12"}, {**GOOD_VISIT, "value": True},
                {**GOOD_VISIT, "value": [1]}, {**GOOD_VISIT, "url": None, "value": "x"},
                {**GOOD_IMPRESSION, "campaign": "spring"}, {**GOOD_IMPRESSION, "campaign": 7},
                {**GOOD_IMPRESSION, "campaign": "c" * 8193},
                {**GOOD_IMPRESSION, "campaign": 7, "target_url": None},
                {**GOOD_IMPRESSION, "value": "ignored"}, {**GOOD_VISIT, "campaign": 5},
                None, "text", True, 1.5, 7, [1]]  # JSON lines that are not objects
    lines = [json.dumps(r) for r in records]
    # Numbers beyond a double's range parse as infinities, on both sides.
    for sign in ("", "-"):
        lines.append(json.dumps({**GOOD_VISIT, "event_id": f"huge{sign}"})[:-1]
                     + f', "value": {sign}1e400}}')
    # JSON has no NaN: Python's json module writes and reads one anyway, Spark does not.
    lines.append(json.dumps({**GOOD_VISIT, "event_id": "not-a-number", "value": float("nan")}))
    records = [json.loads(line) for line in lines]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "records.json").write_text("\n".join(lines) + "\n")
    rows = classify(read_raw_batch(spark, str(tmp_path / "in"), "json"), "json",
                    max_future_skew_ms=86_400_000, skew_text="1 day").collect()
    assert [r.raw_record for r in rows] == lines
    compared = 0
    for record, row in zip(records, rows):
        python_reason = validate(record)
        ts = record.get("ts") if isinstance(record, dict) else None
        if str(ts)[:4] in ("9999", "2200", "1000"):
            # Only Spark knows the file's modification time and the backends' time range.
            assert python_reason is None and row.reason.startswith("ts " + record["ts"][:4])
        elif ts == 5:
            # events.ts_to_ms takes an int as epoch ms (for in-memory events); the JSON form of
            # ts is an ISO-8601 string, and Spark's own JSON reader would read 5 as 5 *seconds*.
            assert python_reason is None
            assert row.reason == "ts must be an ISO-8601 string, got int"
        elif isinstance(record, dict) and record.get("event_id") == "not-a-number":
            assert python_reason == "value must be a finite number, got nan"
            assert row.reason == "malformed JSON"
        else:
            assert row.reason == python_reason, record
            compared += 1
    reasons = {r.reason for r in rows}
    assert {"value must be a finite number, got inf", "value must be a finite number, got -inf",
            "value must be a number, got str", "campaign must be a string, got int"} <= reasons
    assert [(r.value, r.campaign) for r in rows if r.valid and (r.value or r.campaign)] == [
        (12.5, None), (3.0, None), (-0.25, None), (None, "spring")]
    assert compared >= 45
    assert sum(r.reason is None for r in rows) == 14
    # The filters select on ``valid``, computed apart from the reason: they must agree.
    assert all(r.valid == (r.reason is None) for r in rows)


def test_bad_records_are_dead_lettered_and_good_data_is_untouched(spark, tmp_path, ch7_dir,
                                                                  capsys):
    """With the pandas backend, which a year-9999 event would even crash. (The control below
    runs the same input through transformWithState.)"""
    events = _mixed_ch7(ch7_dir, tmp_path)
    report, rows = _run(spark, tmp_path, events, "--backend", "applyInPandasWithState",
                        "--max-files-per-trigger", "1", "--watermark-delay", "3 minutes")

    # Good data: exactly the chapter's two rows, as the oracle gives over the valid records
    # (redelivered copies included), with nothing late.
    assert set(rows) == CH7_ROWS and len(rows) == 2
    oracle = attribute_batch(read_events(ch7_dir))
    assert sorted(rows, key=str) == sorted(((r.goal_event_id, r.impression_id, r.trail)
                                           for r in oracle), key=str)
    assert report.late_rows == 0 and report.goals == 2 and report.attributed == 2

    # Bad data: every bad line once, verbatim, with its reason and source file.
    dead = _dead_letters(spark, tmp_path / "dead")
    assert sorted(r.raw_record for r in dead) == sorted(line for _, line, _ in BAD_LINES)
    expected = {line: (part, reason) for part, line, reason in BAD_LINES}
    for row in dead:
        part, reason = expected[row.raw_record]
        assert row.reason.startswith(reason), (row.reason, reason)
        assert row.source_file.endswith(f"part-{part:05d}.json")
        assert row.detected_at is not None

    # Counted: in the final report and, per micro-batch, in the progress lines.
    assert report.extra["invalid"] == len(BAD_LINES)
    assert "invalid        : %d" % len(BAD_LINES) in report.render()
    per_batch = [b["invalid"] for b in report.history]
    assert per_batch[:7] == [sum(p == n for p, _, _ in BAD_LINES) for n in range(7)]
    progress = capsys.readouterr().err
    assert "batch 0: input 7 rows" in progress and "invalid 2 (dead-lettered)" in progress
    assert "batch 1: input 7 rows" in progress and "invalid 5 (dead-lettered)" in progress


def test_without_the_future_skew_rule_one_record_would_make_everything_late(spark, tmp_path,
                                                                          ch7_dir):
    """The control for the test above: with a skew of ~27,000 years the year-2200 heartbeat is
    accepted, the watermark jumps there after the first file, and every later event is late.
    (The year-9999 goal is still rejected, by the supported-range rule.)"""
    events = _mixed_ch7(ch7_dir, tmp_path)
    report, rows = _run(spark, tmp_path, events, "--max-files-per-trigger", "1",
                        "--backend", "transformWithState",
                        "--watermark-delay", "3 minutes", "--max-future-skew", "10000000 days")
    # Both goals of the first file fire organic: every impression arrived "late".
    assert set(rows) == {("g-signup", None, ()), ("g-receipt", None, ())}
    assert report.late_rows >= 7
    assert report.extra["invalid"] == len(BAD_LINES) - 1
    reasons = {r.reason for r in _dead_letters(spark, tmp_path / "dead")}
    assert any(r.startswith("ts 9999-12-31T23:59:59.000Z is outside the supported range")
               for r in reasons)


def test_batch_mode_dead_letters_the_same_records_and_a_clean_run_replaces_them_with_none(
        spark, tmp_path, ch7_dir, subtests):
    """A batch run over the mixed files gives the chapter's two rows and dead-letters the same
    records as a stream, with the same reasons. A batch run over clean input then skips the
    dead-letter scan but still overwrites ``--dead-letter``: what the run over bad input wrote
    there is gone, and the directory is a finished batch output holding no row."""
    from attribution.spark.output import SUCCESS_MARKER

    report, rows = _run(spark, tmp_path, _mixed_ch7(ch7_dir, tmp_path), "--mode", "batch")
    with subtests.test(msg="bad input: the chapter's two rows"):
        assert set(rows) == CH7_ROWS and len(rows) == 2
    with subtests.test(msg="bad input: every bad line counted"):
        assert report.extra["invalid"] == len(BAD_LINES)
    with subtests.test(msg="bad input: every bad line dead-lettered once, with its reason"):
        dead = _dead_letters(spark, tmp_path / "dead")
        assert sorted((r.raw_record, r.reason[:20]) for r in dead) == sorted(
            (line, reason[:20]) for _, line, reason in BAD_LINES)
        assert len(dead) == len(BAD_LINES)

    report, rows = _run(spark, tmp_path, ch7_dir, "--mode", "batch")
    with subtests.test(msg="clean input: the chapter's two rows, nothing invalid"):
        assert set(rows) == CH7_ROWS and report.extra["invalid"] == 0
    dead = tmp_path / "dead"
    with subtests.test(msg="clean input: the dead letter is a finished output without rows"):
        assert (dead / SUCCESS_MARKER).is_file()
        assert not [p for p in dead.rglob("*.parquet")
                    if spark.read.parquet(str(p)).count() > 0]


def test_parquet_rows_get_the_same_rules(spark, tmp_path, ch7_dir):
    """Parquet is typed by its writer, so malformed lines and wrong types cannot occur; missing
    fields, unknown event types, over-long strings and far-future times can, and are rejected."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attribution.events import ms_to_datetime, ts_to_ms
    from attribution.schema import EVENT_SCHEMA
    from attribution.spark.files import read_event_records
    from attribution.spark.types import arrow_schema

    good = [{**r, "ts": ms_to_datetime(ts_to_ms(r["ts"]))}
            for r in read_event_records(ch7_dir) if r["event_type"] != "heartbeat"]
    bad = [({**good[0], "event_id": "p-no-user", "user_id": None}, "missing user_id"),
           ({**good[0], "event_id": "p-click", "event_type": "click"},
            "unknown event_type 'click'"),
           ({**good[0], "event_id": "p-long", "url": "u" * 10_000},
            "url too long (10000 chars > 8192)"),
           ({**good[0], "event_id": "p-nourl", "url": None}, "visit without url"),
           ({**good[0], "event_id": "p-future",
             "ts": ms_to_datetime(ts_to_ms("9000-01-01T00:00:00Z"))}, "ts 9000-01-01T00:00"),
           ({**good[0], "event_id": "p-nots", "ts": None}, "missing ts"),
           ({**good[0], "event_id": "p-nan", "value": float("nan")},
            "value must be a finite number, got nan"),
           ({**good[0], "event_id": "p-inf", "value": float("inf")},
            "value must be a finite number, got inf"),
           ({**good[0], "event_id": "p-minus-inf", "value": float("-inf")},
            "value must be a finite number, got -inf"),
           ({**good[0], "event_id": "p-long-campaign", "event_type": "impression",
             "impression_id": 5, "source_url": "s", "target_url": "t", "campaign": "c" * 9000},
            "campaign too long (9000 chars > 8192)")]
    good += [{**good[0], "event_id": "p-value", "value": 12.5},
             {**good[0], "event_id": "p-campaign", "event_type": "impression", "impression_id": 6,
              "source_url": "s", "target_url": "t", "campaign": "spring"}]
    schema = arrow_schema(EVENT_SCHEMA)
    relaxed = pa.schema([f.with_nullable(True) for f in schema])  # to write the invalid rows
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(good + [r for r, _ in bad], schema=relaxed),
                   tmp_path / "in" / "part-00000.parquet")
    rows = classify(read_raw_batch(spark, str(tmp_path / "in"), "parquet"), "parquet",
                    max_future_skew_ms=86_400_000, skew_text="1 day").collect()
    reasons = {r.event_id: r.reason for r in rows}
    for record, reason in bad:
        assert reasons[record["event_id"]].startswith(reason)
        if "ts" not in reason:  # the Python validator gives the same reason
            assert validate(record) == reasons[record["event_id"]]
    assert all(reasons[r["event_id"]] is None for r in good)
    assert all(r.valid == (r.reason is None) for r in rows)
    # The dead letter's raw record is the row as JSON; valid rows are never rendered.
    raw = {r.event_id: r.raw_record for r in rows}
    assert all(json.loads(raw[r["event_id"]])["event_id"] == r["event_id"] for r, _ in bad)
    assert all(raw[r["event_id"]] is None for r in good)


def test_help_documents_the_new_options():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--dead-letter" in out and "--max-future-skew" in out
    assert "(default: 1 day)" in out and "<output>-dead-letter" in out
    result = subprocess.run([sys.executable, str(ROOT / "jobs" / "attribution_job.py"),
                             "--events", str(ROOT), "--max-future-skew", "soon"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "not a duration" in result.stderr


@pytest.mark.parametrize("mode", ["stream", "batch"])
def test_a_wrong_typed_parquet_file_is_dead_lettered_and_the_rest_attributed(spark, tmp_path,
                                                                              ch7_dir, capsys,
                                                                              mode):
    """A Parquet file whose column types contradict the event schema has no row Spark can
    decode. Its rows go to the dead letter with Spark's reason, one warning line names it, and
    the job goes on: the output is the oracle's over the other files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attribution.spark.files import write_events
    from jobs.attribution_job import main

    src = tmp_path / "src"
    src.mkdir()
    parts = sorted(ch7_dir.glob("part-*.json"))
    for part in parts:
        write_events(read_events(part), src / part.name.replace(".json", ".parquet"), "parquet")
    events = stage_in_arrival_order(sorted(src.glob("*.parquet")), tmp_path / "events")
    broken = events / "part-00001.parquet"  # impression 123, with a string impression_id
    good_table = pq.read_table(broken)
    mtime = broken.stat().st_mtime
    bad_table = good_table.set_column(good_table.schema.get_field_index("impression_id"),
                                      "impression_id", pa.array(["one-two-three"]))
    pq.write_table(bad_table, broken)
    os.utime(broken, (mtime, mtime))

    options = (["--mode", "batch"] if mode == "batch"
               else ["--max-files-per-trigger", "1", "--watermark-delay", "3 minutes"])
    argv = ["--events", str(events), "--format", "parquet", "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "checkpoint"), "--dead-letter", str(tmp_path / "dead"),
            "--quiet", *PARQUET_OUTPUT, *options]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning: ")]
    assert len(warnings) == 1
    assert "part-00001.parquet cannot be read as events" in warnings[0]
    assert "impression_id" in warnings[0] and "dead letter" in warnings[0]

    expected = attribute_batch([e for part in parts if part.name != "part-00001.json"
                                for e in read_events(part)])
    assert _committed_rows(spark, tmp_path / "out") == sorted(
        ((r.goal_event_id, r.impression_id, r.trail) for r in expected), key=str)
    dead = _dead_letters(spark, tmp_path / "dead")
    assert [json.loads(r.raw_record)["impression_id"] for r in dead] == ["one-two-three"]
    assert "impression_id" in dead[0].reason and dead[0].reason.startswith(
        "input file cannot be read as events: ")
    assert dead[0].source_file.endswith("part-00001.parquet")


@pytest.mark.parametrize("mode", ["stream", "batch"])
def test_records_at_the_future_skew_edge_land_in_exactly_one_place(spark, tmp_path, mode):
    """--max-future-skew is judged against the file's modification time, which the main query,
    the dead-letter query and every rerun see alike: goals seconds either side of the edge are
    each an output row or a dead letter, never both and never neither."""
    from attribution.events import ms_to_iso

    written_s = FILE_TIME
    edge_ms = written_s * 1000 + 86_400_000  # --max-future-skew 1 day
    offsets_s = (-3, -2, -1, 0, 1, 2, 3)
    goals = [{"event_id": f"g{k:+d}", "user_id": f"u{k:+d}", "event_type": "visit",
              "ts": ms_to_iso(edge_ms + 1000 * k), "url": "/buy", "is_goal": True}
             for k in offsets_s]
    heartbeat = {"event_id": "hb", "event_type": "heartbeat", "ts": ms_to_iso(edge_ms + 10_000)}
    events = tmp_path / "in"
    events.mkdir()
    (events / "part-00000.json").write_text("\n".join(json.dumps(g) for g in goals) + "\n")
    (events / "part-00001.json").write_text(json.dumps(heartbeat) + "\n")
    os.utime(events / "part-00000.json", (written_s, written_s))
    os.utime(events / "part-00001.json", (written_s + 20, written_s + 20))  # the heartbeat fits
    options = ["--mode", "batch"] if mode == "batch" else ["--max-files-per-trigger", "1"]
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       *PARQUET_OUTPUT,
                       "--checkpoint", str(tmp_path / "cp"), "--dead-letter", str(tmp_path / "dl"),
                       "--watermark-delay", "0 seconds", "--max-future-skew", "1 day",
                       "--quiet", *options])
    run(spark, args)
    emitted = [r.goal_event_id for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    dead = [json.loads(r.raw_record)["event_id"] for r in _dead_letters(spark, tmp_path / "dl")]
    assert sorted(emitted) == sorted(f"g{k:+d}" for k in offsets_s if k <= 0)
    assert sorted(dead) == sorted(f"g{k:+d}" for k in offsets_s if k > 0)
