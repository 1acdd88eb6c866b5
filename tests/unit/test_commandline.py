"""The machinery every command shares (``commandline``): exit codes, one-line errors, directory
checks and SIGINT/SIGTERM as stop requests; and the checks the jobs build on it that need no
Spark (input format, the checkpoint's record of its input, progress wording)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from attribution.spark.checkpoint import LAYOUT_FILE, CheckpointMismatch, pin_state_layout
from attribution.spark.readers import format_mismatch
from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure
from commandline.paths import check_readable_dir, check_writable_dir
from commandline.signals import StopRequests
from jobs.progress import BatchProgress, rate_text, size_text, watermark_text
from support import ROOT


def test_exit_codes_are_the_documented_ones():
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0, "FAILED": 1, "USAGE": 2, "INPUT": 3, "OUTPUT": 4, "CHECKPOINT": 5,
        "NO_VALID_INPUT": 6, "INTERRUPTED": 130, "TERMINATED": 143}
    text = exit_codes_help()
    assert text.startswith("exit codes:\n")
    assert [line.split()[0] for line in text.splitlines()[1:]] == [
        str(int(code)) for code in ExitCode]
    assert exit_codes_help(ExitCode.OUTPUT).splitlines()[1].startswith("  4    an output")


def test_a_failure_is_one_error_line_and_its_code():
    stream = io.StringIO()
    code = report_failure(Failure(ExitCode.INPUT, "the file\nis broken;  replace it"), stream)
    assert code == 3
    assert stream.getvalue() == "error: the file is broken; replace it\n"


def test_writable_directory_checks(tmp_path):
    (tmp_path / "file").write_text("")
    check_writable_dir(str(tmp_path / "new" / "deeper"), "--output", ExitCode.OUTPUT)
    check_writable_dir(str(tmp_path), "--output", ExitCode.OUTPUT)
    check_writable_dir("hdfs://namenode/out", "--output", ExitCode.OUTPUT)  # not checked
    with pytest.raises(Failure, match=r"--output .*file is a file, not a directory") as info:
        check_writable_dir(str(tmp_path / "file"), "--output", ExitCode.OUTPUT)
    assert info.value.code == ExitCode.OUTPUT
    with pytest.raises(Failure, match=r"--checkpoint .*file/cp cannot be created: .*file is a "
                                      r"file") as info:
        check_writable_dir(str(tmp_path / "file" / "cp"), "--checkpoint", ExitCode.CHECKPOINT)
    assert info.value.code == ExitCode.CHECKPOINT
    assert not (tmp_path / "new").exists()  # a check creates nothing


def test_readable_directory_checks(tmp_path):
    check_readable_dir(str(tmp_path), "--events", ExitCode.INPUT)
    (tmp_path / "file").write_text("")
    for path in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(Failure, match="is not a directory; give the directory") as info:
            check_readable_dir(str(path), "--events", ExitCode.INPUT)
        assert info.value.code == ExitCode.INPUT


def test_a_signal_is_recorded_announced_and_its_handler_restored():
    stream = io.StringIO()
    before = signal.getsignal(signal.SIGTERM)
    with StopRequests(announce="stopping soon", stream=stream) as stop:
        assert not stop.requested and stop.exit_code == ExitCode.OK
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        assert stop.exit_code == ExitCode.TERMINATED
    assert signal.getsignal(signal.SIGTERM) is before
    assert stream.getvalue() == ("SIGTERM: stopping soon (send it again to stop at once)\n")


def test_install_takes_a_replaced_handler_back_and_exit_restores_the_first():
    before = signal.getsignal(signal.SIGINT)
    with StopRequests(interrupt=True) as stop:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a SparkContext does
        stop.install()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.exit_code == ExitCode.INTERRUPTED
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_forwarded_by_the_jvm_is_a_request_and_both_ways_count_once():
    """The JVM of spark-submit hands on the signal it received (``forwarded``); a signal sent to
    the whole process group arrives both ways, which is one request, announced once."""
    stream = io.StringIO()
    with StopRequests(announce="stopping soon", stream=stream, interrupt=True) as stop:
        stop.forwarded(signal.SIGTERM)  # never raises, even with interrupt=True
        assert stop.requested and stop.exit_code == ExitCode.TERMINATED
        os.kill(os.getpid(), signal.SIGTERM)  # the same request, received by this process too
        assert stop.signal_name == "SIGTERM"
    assert stream.getvalue() == "SIGTERM: stopping soon (send it again to stop at once)\n"


@pytest.mark.parametrize("name, send", [
    ("SIGINT", "os.kill(os.getpid(), signal.SIGINT)"),
    ("SIGTERM", "stop.forwarded(signal.SIGTERM)"),  # handed on by the JVM, twice
])
def test_a_second_signal_exits_at_once(name, send):
    script = ("import os, signal, time\n"
              "from commandline.signals import StopRequests\n"
              "with StopRequests(announce='stopping') as stop:\n"
              f"    {send}\n"
              f"    {send}\n"
              "    time.sleep(30)\n"
              "print('not reached')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == (ExitCode.INTERRUPTED if name == "SIGINT"
                                 else ExitCode.TERMINATED)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{name}: stopping (send it again to stop at once)",
        f"{name} again: stopping at once; the micro-batch in flight, if any, is redone on restart"]


def test_input_of_another_format_is_named(tmp_path):
    for name in ("part-0.json", "part-1.jsonl", "_SUCCESS", ".part-2.json.crc"):
        (tmp_path / name).write_text("")
    assert format_mismatch(str(tmp_path), "json") is None
    assert format_mismatch(str(tmp_path), "parquet") == (
        f"--format parquet but {tmp_path} holds 2 .json/.jsonl files and no .parquet file; "
        "use --format json")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "part-3.parquet").write_text("")  # one file of the format is enough
    assert format_mismatch(str(tmp_path), "parquet") is None
    (tmp_path / "empty").mkdir()
    # Nothing yet: a stream waits.
    assert format_mismatch(str(tmp_path / "empty"), "parquet") is None


def test_the_checkpoint_records_its_input_and_refuses_another(tmp_path):
    checkpoint, events = tmp_path / "cp", tmp_path / "events"
    events.mkdir()
    pin = dict(backend="transformWithState", state_buckets=64, tws_state="compact")
    pin_state_layout(str(checkpoint), **pin, events=str(events), input_format="json")
    assert json.loads((checkpoint / LAYOUT_FILE).read_text()) == {
        "backend": "transformWithState", "tws_state": "compact", "models": ["last_touch"],
        "events": str(events), "format": "json"}
    # The same directory named another way is the same input.
    pin_state_layout(str(checkpoint), **pin, events=f"{events}/../events", input_format="json")
    with pytest.raises(CheckpointMismatch, match=f"was started on --events {events}; this run "
                                                 f"reads --events {tmp_path}"):
        pin_state_layout(str(checkpoint), **pin, events=str(tmp_path), input_format="json")
    with pytest.raises(CheckpointMismatch, match="started with --format json; this run asks for "
                                                 "--format parquet"):
        pin_state_layout(str(checkpoint), **pin, events=str(events), input_format="parquet")
    with pytest.raises(CheckpointMismatch, match=f"started on --events {events}; this run reads "
                                                 "--kafka-topics clicks"):
        pin_state_layout(str(checkpoint), **pin, kafka_topics="clicks", input_format="json")


def test_a_kafka_checkpoint_records_its_topics_in_any_order_and_refuses_others(tmp_path):
    checkpoint = str(tmp_path / "cp")
    pin = dict(backend="transformWithState", state_buckets=64, tws_state="compact")
    pin_state_layout(checkpoint, **pin, kafka_topics="site, ads", input_format="avro")
    assert json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text())["kafka_topics"] == "ads,site"
    pin_state_layout(checkpoint, **pin, kafka_topics="ads,site", input_format="avro")
    with pytest.raises(CheckpointMismatch, match="started on --kafka-topics ads,site; this "
                                                 "run reads --kafka-topics ads"):
        pin_state_layout(checkpoint, **pin, kafka_topics="ads", input_format="avro")


def _progress(batch_id, users_change, rows_total, watermark="1970-01-01T00:00:00.000Z"):
    """A StreamingQueryProgress as ``BatchProgress`` reads it."""
    operator = SimpleNamespace(numRowsDroppedByWatermark=0, numRowsTotal=rows_total,
                               customMetrics={"rocksdbSstFileSize": 2048})
    return SimpleNamespace(
        batchId=batch_id, numInputRows=10, inputRowsPerSecond=5.0, processedRowsPerSecond=12.5,
        durationMs={"addBatch": 700, "triggerExecution": 800}, stateOperators=[operator],
        eventTime={"watermark": watermark},
        observedMetrics={"out": {"goals_last_touch": 3, "attributed_last_touch": 2,
                                 "users_change": users_change}})


def test_the_join_jobs_progress_line_says_none_yet_before_a_watermark_as_the_attribution_job():
    from jobs.join_job import ClickJoinRun

    counts = {"batch_id": 0, "records_read": 4, "invalid": 0, "duplicates_dropped": 0,
              "dropped_by_watermark": 0, "output_rows": 0, "join_state_rows": 4,
              "join_state_rows_updated": 4, "join_state_rows_removed": 0,
              "watermark": "1970-01-01T00:00:00.000Z"}
    run = ClickJoinRun(query=None, expected=None, quiet=True)
    assert run.line(counts).endswith("removed 0), watermark none yet")
    later = {**counts, "watermark": "2024-03-01T00:03:00.000Z"}
    assert run.line(later).endswith("watermark 2024-03-01T00:03:00.000Z")


def test_users_in_state_follow_the_reported_changes_or_spark_row_count():
    stream = io.StringIO()
    by_change = BatchProgress("out", stream=stream, users_at_start=7, users_by_change=True)
    by_change.consume([_progress(0, 4, 64), _progress(1, -10, 64, "2024-03-01T00:03:00.000Z")])
    assert [b["users_in_state"] for b in by_change.history] == [11, 1]
    assert stream.getvalue().splitlines()[0] == (
        "batch 0: input 10 rows in 0.8 s (input 5 rows/s, processed 12.5 rows/s), late dropped "
        "0, goals 3 (attributed 2, organic 1), users in state 11, state size 2.0 KB, watermark "
        "none yet")
    assert stream.getvalue().splitlines()[1].endswith(
        "users in state 1, state size 2.0 KB, watermark 2024-03-01T00:03:00.000Z")
    by_rows = BatchProgress("out", quiet=True)
    by_rows.consume([_progress(0, 0, 64)])
    assert by_rows.users_in_state == 64
    unknown = BatchProgress("out", quiet=True, users_by_change=True)  # no count at start
    unknown.consume([_progress(0, 4, 64)])
    assert unknown.users_in_state is None and "users in state : n/a" in unknown.report(
        mode="stream", backend="b", output="o").render()


def test_progress_wording():
    assert watermark_text("1970-01-01T00:00:00.000Z") == watermark_text(None) == "none yet"
    assert watermark_text("2024-03-01T00:03:00.000Z") == "2024-03-01T00:03:00.000Z"
    assert [rate_text(r) for r in (None, float("nan"), 0.0, 0.1508, 12.25, 123456.7)] == [
        "n/a", "n/a", "0 rows/s", "0.151 rows/s", "12.2 rows/s", "123,457 rows/s"]
    assert [size_text(s) for s in (None, 900, 2048, 5 * 1024 ** 2, 3 * 1024 ** 4)] == [
        "n/a", "900 B", "2.0 KB", "5.0 MB", "3072.0 GB"]
