"""The late-record output: the records Spark dropped as late, found again from the checkpoint
and written once, with the watermark they were judged against."""
from __future__ import annotations

import json

from attribution.spark.late_records import audit, read_late_records
from jobs.attribution_job import parse_args, run
from support import PARQUET_OUTPUT, stage_in_arrival_order

MINUTE_DELAY = ["--watermark-delay", "1 minute", "--max-files-per-trigger", "1"]


def _run(spark, tmp_path, events, *options):
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), "--quiet", *PARQUET_OUTPUT,
                       *options])
    return run(spark, args)


def test_the_ch7_files_made_late_drop_four_records_and_the_audit_finds_exactly_them(
        spark, tmp_path, ch7_dir):
    events = stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "in")
    report = _run(spark, tmp_path, events, *MINUTE_DELAY)
    late_dir = tmp_path / "late"
    written, accepted = audit(spark, str(tmp_path / "cp"), str(late_dir), "json", 86_400_000,
                              "1 day", 0)
    table = read_late_records(str(late_dir)).to_pylist()
    ids = sorted(json.loads(r["raw_record"])["event_id"] for r in table)
    assert ids == ["i-456", "i-789", "v-signup", "v-thing"]
    assert written == report.late_rows == 4 and accepted == 0
    by_id = {json.loads(r["raw_record"])["event_id"]: r for r in table}
    # Each was judged against the watermark in force when it arrived: 12:02:45.
    assert {r["watermark"].strftime("%H:%M:%S") for r in table} == {"12:02:45"}
    assert {r["batch_id"] for r in table} == {2, 3}
    # Without an allowed lateness the two watermarks of the reason are one.
    assert {(r["reason"], r["allowed_lateness_ms"]) for r in table} == {
        ("ts at or behind 1970-01-01T12:02:45.000Z: the watermark when it arrived, "
         "1970-01-01T12:02:45.000Z, minus the allowed lateness (0 ms)", 0)}
    assert by_id["i-456"]["source_file"].endswith("part-00002.json")
    # Audited once: a second pass writes nothing more.
    assert audit(spark, str(tmp_path / "cp"), str(late_dir), "json", 86_400_000, "1 day",
                 0) == (0, 0)
    assert len(read_late_records(str(late_dir))) == 4


def test_a_late_record_beyond_the_allowed_lateness_names_both_watermarks(spark, tmp_path,
                                                                        ch7_dir):
    """With 30 seconds allowed, Spark's watermark trails the on-time one (12:02:45 once the
    first file is read) by 30 seconds: the records of files 2 and 3 at or behind 12:02:15 are
    dropped and written, each with the on-time watermark, the lateness and the threshold in
    its reason; v-thing (12:02:30) is late but within the lateness, so used and not written."""
    events = stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), tmp_path / "in")
    report = _run(spark, tmp_path, events, *MINUTE_DELAY, "--allowed-lateness", "30 seconds")
    table = read_late_records(str(tmp_path / "out-late")).to_pylist()
    by_id = {json.loads(r["raw_record"])["event_id"]: r for r in table}
    assert sorted(by_id) == ["i-456", "i-789", "v-signup"] and len(table) == 3
    assert report.late_rows == 3 and report.extra["late accepted"] == 1
    for event_id, r in by_id.items():
        assert r["reason"] == ("ts at or behind 1970-01-01T12:02:15.000Z: the watermark when it "
                               "arrived, 1970-01-01T12:02:45.000Z, minus the allowed lateness "
                               "(30000 ms)"), event_id
        assert r["allowed_lateness_ms"] == 30_000, event_id
        assert r["watermark"].strftime("%H:%M:%S") == "12:02:45", event_id
        # The threshold the reason names is really at or past the record's own time.
        ts = json.loads(r["raw_record"])["ts"]
        assert ts[11:19] <= "12:02:15", (event_id, ts)
    assert {by_id["i-456"]["batch_id"], by_id["v-signup"]["batch_id"]} == {2}
    assert by_id["i-789"]["batch_id"] == 3
