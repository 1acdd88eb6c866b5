"""The late-record output: the records Spark dropped as late, found again from the checkpoint
and written once, with the watermark they were judged against; the same through ``file://``
URIs (Hadoop's file system, the code path of ``hdfs://`` and ``s3a://``) as on local paths.

The chapter 7 files made late (watermark delay 1 minute, one file per micro-batch) run once on
local paths and once through URIs without an allowed lateness, and each property of those runs
is a subtest of one test; the run with 30 seconds allowed goes through URIs.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from attribution.spark.checkpoint import LAYOUT_FILE
from attribution.spark.late_records import audit, read_late_records
from commandline.exits import ExitCode
from shared_runs import ch7_made_late, late_table, named
from support import ROOT
from support.commands import command_environment, error_line

LATE_IDS = ["i-456", "i-789", "v-signup", "v-thing"]


def test_without_allowed_lateness_four_records_are_dropped_and_written_alike_through_file_uris(
        spark, tmp_path, ch7_dir, capsys, subtests):
    """Without an allowed lateness the chapter 7 files made late drop four records: the goals
    fire organic, and the job writes exactly the four to the late-record output, as an audit of
    the checkpoint (into another directory) finds them again, once. With file:// URIs for the
    checkpoint, the output and the late records: the same changelog and late records as with
    local paths, the report's count is Spark's dropped-row count, and a restart with another
    --allowed-lateness, --models or bucket count exits 5, checked before the run when Spark runs
    already (in this process) and once it has started when it does not (a new process)."""
    from jobs import attribution_job

    local, remote = tmp_path / "local", tmp_path / "remote"
    report, changelog, net, late = ch7_made_late(spark, local, ch7_dir)
    with subtests.test(msg="each goal once, organic, on time"):
        assert changelog == Counter([("g-signup", None, 1, 0, "ON_TIME"),
                                     ("g-receipt", None, 1, 0, "ON_TIME")])
    with subtests.test(msg="no attributed row"):
        assert net == set()
    with subtests.test(msg="the four dropped records are written, and counted"):
        assert late == LATE_IDS and report.late_rows == 4

    # The audit of the run's checkpoint, into a directory of its own.
    late_dir = tmp_path / "audited"
    written, accepted = audit(spark, str(local / "cp"), str(late_dir), "json", 86_400_000,
                              "1 day", 0)
    table = read_late_records(str(late_dir)).to_pylist()
    by_id = {json.loads(r["raw_record"])["event_id"]: r for r in table}
    with subtests.test(msg="the audit finds exactly the dropped records"):
        assert sorted(json.loads(r["raw_record"])["event_id"] for r in table) == LATE_IDS
    with subtests.test(msg="the audit's count is Spark's, and nothing is accepted late"):
        assert written == report.late_rows == 4 and accepted == 0
    with subtests.test(msg="each judged against the watermark when it arrived: 12:02:45"):
        assert {r["watermark"].strftime("%H:%M:%S") for r in table} == {"12:02:45"}
    with subtests.test(msg="the micro-batches they arrived in"):
        assert {r["batch_id"] for r in table} == {2, 3}
    with subtests.test(msg="without an allowed lateness the reason's two watermarks are one"):
        assert {(r["reason"], r["allowed_lateness_ms"]) for r in table} == {
            ("ts at or behind 1970-01-01T12:02:45.000Z: the watermark when it arrived, "
             "1970-01-01T12:02:45.000Z, minus the allowed lateness (0 ms)", 0)}
    with subtests.test(msg="each names its source file"):
        assert by_id["i-456"]["source_file"].endswith("part-00002.json")
    with subtests.test(msg="audited once: a second pass writes nothing more"):
        assert audit(spark, str(local / "cp"), str(late_dir), "json", 86_400_000, "1 day",
                     0) == (0, 0)
        assert len(read_late_records(str(late_dir))) == 4

    # The same run through file:// URIs.
    uri_report, uri_changelog, _, _ = ch7_made_late(spark, remote, ch7_dir, uri=True)
    with subtests.test(msg="through URIs: the changelog of local paths"):
        assert uri_changelog == changelog
    with subtests.test(msg="through URIs: the late records of local paths"):
        assert late_table(remote / "out-late") == late_table(local / "out-late")
        assert len(late_table(remote / "out-late")) == 4
    with subtests.test(msg="through URIs: the report's late count is Spark's dropped rows"):
        assert uri_report.late_rows == report.late_rows == 4  # Spark's dropped-row count
    with subtests.test(msg="through URIs: the report names the late records' URI"):
        assert uri_report.extra["late records"] == f"4 in file://{remote}/out-late"

    checkpoint = named(remote / "cp", True)
    layout = (remote / "cp" / LAYOUT_FILE).read_text()
    common = ["--events", str(remote / "in"), "--output", named(remote / "out", True),
              "--checkpoint", checkpoint, "--watermark-delay", "1 minute",
              "--max-files-per-trigger", "1", "--quiet", "--log-file", str(tmp_path / "log")]
    for options, was, asked in [
            (["--allowed-lateness", "5 minutes"], "--allowed-lateness '0 ms'",
             "--allowed-lateness '5 min'"),
            (["--state-buckets", "16"], "--state-buckets 64", "--state-buckets 16")]:
        with subtests.test(msg="a URI checkpoint refuses another option, Spark running",
                           options=options):
            assert attribution_job.main([*common, *options]) == ExitCode.CHECKPOINT, options
            line = error_line(capsys.readouterr().err)
            assert line.startswith(f"error: checkpoint {checkpoint} was started with {was}; "
                                   f"this run asks for {asked}."), line
    result = subprocess.run(
        [sys.executable, ROOT / "jobs" / "attribution_job.py", *common, "--models", "all"],
        cwd=tmp_path, capture_output=True, text=True, env=command_environment(), timeout=300)
    with subtests.test(msg="a URI checkpoint refuses other --models once Spark has started"):
        line = error_line(result.stderr)
        assert result.returncode == ExitCode.CHECKPOINT, result.stderr
        assert line.startswith(f"error: checkpoint {checkpoint} was started with --models "
                               "last_touch; this run asks for --models "), line
    with subtests.test(msg="the refusals leave the URI checkpoint's layout file"):
        assert (remote / "cp" / LAYOUT_FILE).read_text() == layout


def test_a_late_record_beyond_the_allowed_lateness_names_both_watermarks(spark, tmp_path,
                                                                        ch7_dir):
    """With 30 seconds allowed, Spark's watermark trails the on-time one (12:02:45 once the
    first file is read) by 30 seconds: the records of files 2 and 3 at or behind 12:02:15 are
    dropped and written, each with the on-time watermark, the lateness and the threshold in
    its reason; v-thing (12:02:30) is late but within the lateness, so used and not written.
    The checkpoint and the outputs are given as file:// URIs: the lateness's audit reads them
    through Hadoop's file system, as the run without a lateness above does."""
    report, _, _, _ = ch7_made_late(spark, tmp_path, ch7_dir, "--allowed-lateness",
                                    "30 seconds", uri=True)
    table = read_late_records(str(tmp_path / "out-late")).to_pylist()
    by_id = {json.loads(r["raw_record"])["event_id"]: r for r in table}
    assert sorted(by_id) == ["i-456", "i-789", "v-signup"] and len(table) == 3
    assert report.late_rows == 3 and report.extra["late accepted"] == 1
    assert report.extra["late records"] == f"3 in file://{tmp_path}/out-late"
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
