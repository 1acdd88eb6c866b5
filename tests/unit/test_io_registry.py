"""The I/O layer without Spark: one table of formats that every list derives from, the source and
sink registries, what each source finds in a checkpoint about a committed micro-batch, the Kafka
source's value decoding and option checks, and the Parquet sink's per-micro-batch files."""
from __future__ import annotations

import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attribution.schema import EVENT_FIELDS, EVENT_SCHEMA
from attribution.spark.formats import EVENT_FORMATS, FORMATS, event_format, format_of
from attribution.spark.sinks import SINKS, ParquetSink, Sink
from attribution.spark.sources import FILE_SOURCES, SOURCES, EventSource, KafkaSource, file_source
from attribution.spark.sources.kafka import decode_avro_value, offset_ranges
from support import ROOT

MS_2024 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def test_every_list_of_formats_is_the_one_table():
    import benchmarks.generator
    import generators.params
    import generators.writers
    from attribution.spark import files, readers

    assert FORMATS == tuple(EVENT_FORMATS) == ("json", "parquet", "avro")
    for module in (generators.params, generators.writers, benchmarks.generator, files, readers):
        assert module.FORMATS is FORMATS, module.__name__
    assert set(FILE_SOURCES) == set(EVENT_FORMATS)
    assert {name: EVENT_FORMATS[name].glob for name in FORMATS} == {
        "json": "*.{json,jsonl}", "parquet": "*.parquet", "avro": "*.avro"}
    assert [format_of(n) for n in ("a.json", "b.JSONL", "c.parquet", "d.avro", "README")] == [
        "json", "json", "parquet", "avro", None]


def test_the_generators_format_list_costs_no_pyspark():
    code = ("import sys, generators.params, attribution.spark.formats; "
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout.strip() == "False"


def test_an_unknown_format_is_refused_naming_the_valid_ones():
    for call in (lambda: event_format("orc"), lambda: file_source("orc", "/data")):
        with pytest.raises(ValueError, match="'orc'; expected one of json, parquet, avro"):
            call()
    with pytest.raises(ValueError, match="Kafka values are one of json, avro"):
        KafkaSource("127.0.0.1:9092", "events", fmt="parquet")


def test_the_registries_build_each_source_and_sink():
    source = SOURCES["files"]("parquet", "/data/events", 3)
    assert isinstance(source, EventSource) and source.format.name == "parquet"
    assert (source.directory, source.max_files_per_trigger) == ("/data/events", 3)
    assert source.origin_columns == ("source_file",)
    kafka = SOURCES["kafka"]("h1:9092,h2:9092", "clicks, views", fmt="avro")
    assert kafka.topics == ("clicks", "views") and kafka.format.name == "avro"
    assert kafka.origin_columns == ("source_topic", "source_partition", "source_offset")
    assert isinstance(SINKS["parquet"]("/out"), Sink)


def test_a_file_source_checks_its_directory_before_spark_starts(tmp_path):
    assert file_source("json", str(tmp_path / "missing")).check() == (
        f"--events {tmp_path / 'missing'} is not a directory")
    (tmp_path / "part-0.parquet").write_bytes(b"")
    assert file_source("json", str(tmp_path)).check() == (
        f"--format json but {tmp_path} holds 1 .parquet file and no .json/.jsonl file; "
        "use --format parquet")
    assert file_source("parquet", str(tmp_path)).check() is None


def test_kafka_options_are_checked_before_spark_starts():
    def problem(**kwargs):
        settings = {"bootstrap_servers": "127.0.0.1:9092", "topics": "events", **kwargs}
        return KafkaSource(**settings).check()

    assert problem() is None
    assert problem(bootstrap_servers=" ") == (
        "--kafka-bootstrap-servers is empty; give HOST:PORT[,...]")
    assert problem(topics=" , ") == "--kafka-topics names no topic; give T1[,T2,...]"
    assert problem(starting_offsets="newest") == (
        "--kafka-starting-offsets 'newest' is not one of earliest, latest")
    assert problem(max_offsets_per_trigger=0) == (
        "--max-offsets-per-trigger must be at least 1, got 0")


# -- what a committed micro-batch read, from the checkpoint alone -------------------------------

def _log(path: Path, *lines: str, prefix: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prefix + "v1\n" + "\n".join(lines))


def _offsets(checkpoint: Path, batch_id: int, source_offset) -> None:
    metadata = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": MS_2024})
    line = "-" if source_offset is None else json.dumps(source_offset)
    _log(checkpoint / "offsets" / str(batch_id), metadata, line)


def test_a_file_source_finds_its_files_in_the_file_source_log_even_after_compaction(tmp_path):
    cp = tmp_path / "cp"
    entry = lambda name, b: json.dumps({"path": f"file://{tmp_path}/in/{name}",  # noqa: E731
                                        "timestamp": 1, "batchId": b, "action": "add"})
    # Entries 0 and 1 survive only in the compact file 2; entry 3 has its own file.
    _log(cp / "sources" / "0" / "2.compact", entry("a.json", 0), entry("b.json", 1),
         entry("c.json", 2))
    _log(cp / "sources" / "0" / "3", entry("d%20e.json", 3))
    for batch_id, log_offset in enumerate([0, 1, 1, 3]):
        _offsets(cp, batch_id, {"logOffset": log_offset})
    source = file_source("json")
    assert source.committed_input(cp, 0) == [f"{tmp_path}/in/a.json"]
    assert source.committed_input(cp, 1) == [f"{tmp_path}/in/b.json"]
    assert source.committed_input(cp, 2) is None  # same offset: only timers fired
    assert source.committed_input(cp, 3) == [f"{tmp_path}/in/d e.json"]


def test_an_avro_source_finds_its_files_in_its_offsets(tmp_path):
    cp = tmp_path / "cp"
    _offsets(cp, 0, {"upto": [5, "/in/b.avro"], "files": ["/in/a.avro", "/in/b.avro"]})
    _offsets(cp, 1, {"upto": [5, "/in/b.avro"], "files": ["/in/a.avro", "/in/b.avro"]})
    assert file_source("avro").committed_input(cp, 0) == ["/in/a.avro", "/in/b.avro"]
    assert file_source("avro").committed_input(cp, 1) is None


def test_a_kafka_source_finds_offset_ranges_from_its_initial_offsets_on(tmp_path):
    cp = tmp_path / "cp"
    # The connector writes its initial offsets behind a zero byte.
    _log(cp / "sources" / "0" / "0", json.dumps({"events": {"0": 4, "1": 0}}), prefix="\x00")
    _offsets(cp, 0, {"events": {"0": 10, "1": 0}})
    _offsets(cp, 1, {"events": {"0": 10, "1": 0}})
    _offsets(cp, 2, {"events": {"0": 12, "1": 3, "2": 5}})  # partition 2 is new
    source = KafkaSource("127.0.0.1:9092", "events")
    assert source.committed_input(cp, 0) == [("events", 0, 4, 10)]
    assert source.committed_input(cp, 1) is None
    assert source.committed_input(cp, 2) == [("events", 0, 10, 12), ("events", 1, 0, 3),
                                             ("events", 2, -2, 5)]
    assert offset_ranges(None, {"t": {"10": 1, "9": 2}}) == [("t", 9, -2, 2), ("t", 10, -2, 1)]


# -- the Kafka source's Avro values -------------------------------------------------------------

def _avro_value(record: dict) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, EVENT_SCHEMA, record)
    return buffer.getvalue()


def test_an_avro_value_is_one_event_or_a_reason():
    event = {"event_id": "v1", "user_id": "u", "event_type": "visit", "ts": MS_2024,
             "url": "http://x", "is_goal": True, "value": 2.5}
    record, error = decode_avro_value(_avro_value(event))
    assert error is None and record["event_id"] == "v1" and record["value"] == 2.5
    assert record["ts"] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert set(record) == set(EVENT_FIELDS)
    assert decode_avro_value(None) == (None, "record without a value")
    assert decode_avro_value(_avro_value(event) + b"\x00\x01") == (
        None, "undecodable Avro value (2 bytes left after the event)")
    record, error = decode_avro_value(b"\xff\xff\xff")
    assert record is None and error.startswith("undecodable Avro value (")


# -- sinks ---------------------------------------------------------------------------------------

def test_the_parquet_sink_writes_one_file_per_micro_batch_and_a_rewrite_replaces_it(tmp_path):
    sink = ParquetSink(str(tmp_path / "late"), ("detected_date", "detected_at"))
    detected = dt.datetime(2024, 1, 2, 3, 4, tzinfo=dt.timezone.utc)
    sink.write_micro_batch(7, pa.table({"n": [1, 2]}), detected)
    sink.write_micro_batch(7, pa.table({"n": [3]}), detected)
    written = sorted(p.relative_to(tmp_path) for p in (tmp_path / "late").rglob("*"))
    assert [str(p) for p in written] == ["late/detected_date=2024-01-02",
                                         "late/detected_date=2024-01-02/batch-00000007.parquet"]
    assert pq.read_table(tmp_path / written[1]).column("n").to_pylist() == [3]
    with pytest.raises(ValueError, match="written by date"):
        ParquetSink(str(tmp_path / "flat")).write_micro_batch(1, pa.table({"n": [1]}), detected)


def test_a_sink_without_driver_side_records_says_so():
    class StreamOnly(Sink):
        def start_stream(self, rows, checkpoint, trigger, query_name):
            raise AssertionError("not called")

        def write_batch(self, rows, replace="all"):
            raise AssertionError("not called")

    with pytest.raises(NotImplementedError, match="StreamOnly takes no driver-side records"):
        StreamOnly().write_micro_batch(0, pa.table({}), dt.datetime.now(dt.timezone.utc))


# -- the late-record audit when a source no longer holds a committed micro-batch ---------------

class _RetentionGone(type(file_source("json"))):
    """JSON files whose committed micro-batch 1 is gone, as a Kafka range after retention."""

    def __init__(self, failure: Exception):
        super().__init__()
        self.failure = failure

    def read_committed(self, spark, part):
        raise self.failure

    lost_input = KafkaSource.lost_input


def test_a_micro_batch_whose_input_is_gone_is_reported_not_audited_never_silently(tmp_path):
    from attribution.spark.late_records import audit, read_late_records, unaudited_batches

    cp, late = tmp_path / "cp", tmp_path / "late"
    _log(cp / "sources" / "0" / "0", json.dumps({"path": "file:///in/a.json", "batchId": 0}))
    _offsets(cp, 0, {"logOffset": 0})
    _log(cp / "commits" / "0", "{}")
    gone = RuntimeError("Job aborted: [KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE] Some data "
                        "may have been lost because they are not available in Kafka any more")
    assert audit(None, str(cp), str(late), _RetentionGone(gone), 86_400_000, "1 day", 0) == (0, 0)
    assert unaudited_batches(str(late)) == {0: (
        "the broker no longer holds its records (KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE: "
        "retention or a deleted topic removed them)")}
    assert len(read_late_records(str(late))) == 0
    # Marked: a second audit does not try again; any other failure is not the source's to hide.
    assert audit(None, str(cp), str(late), _RetentionGone(gone), 86_400_000, "1 day", 0) == (0, 0)
    with pytest.raises(RuntimeError, match="disk on fire"):
        audit(None, str(cp), str(tmp_path / "late2"), _RetentionGone(RuntimeError("disk on fire")),
              86_400_000, "1 day", 0)
    assert unaudited_batches(str(tmp_path / "late2")) == {}


def test_a_batch_write_names_what_it_can_replace():
    with pytest.raises(ValueError, match="replace must be one of all, dates, got 'some'"):
        ParquetSink("/out").write_batch(None, replace="some")
