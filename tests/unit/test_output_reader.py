"""The committed-output reader without Spark: the sink log decides which files are output.

Outputs are written with pyarrow in the layout of Spark's file sink
(``support.outputs.write_sink_output``) or batch writer (``support.outputs.write_batch_output``);
tests/spark checks the same on a real sink.
"""
from __future__ import annotations

import datetime as dt
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attribution.schema import OUTPUT_FIELDS, PARTITION_COLUMN
from attribution.spark.output import (
    BACKFILL_MARKER,
    Frontier,
    NotAttributionOutput,
    committed_files,
    is_delta_table,
    read_attribution_rows,
    read_attributions,
    read_committed_output,
    read_frontier,
)
from support.outputs import (
    attribution_record,
    output_table,
    write_batch_output,
    write_partitioned_batch_output,
    write_sink_output,
)

HOUR = 3_600_000
# Spec sections 7 and 8: the columns' values when their features are off.
FEATURES_OFF = {"impression_campaign": None, "goal_value": None, "credited_value": None,
                "sign": 1, "revision": 0, "emit_timing": "ON_TIME"}


def batches(count: int) -> list[list[dict]]:
    """``count`` micro-batches; batch ``n`` holds goals ``g<n>a`` (attributed), ``g<n>b``
    (organic)."""
    return [[attribution_record(f"g{n}a", n * HOUR, impression=n),
             attribution_record(f"g{n}b", n * HOUR + 1)] for n in range(count)]


def goals(frame) -> list[str]:
    return sorted(frame["goal_event_id"])


def test_only_files_the_log_lists_are_read(tmp_path):
    out = tmp_path / "output with space"  # the log's URIs are percent-encoded
    parts = write_sink_output(out, batches(3))
    # What a job killed during batch 3 leaves: a complete part file and a 0-byte one that no log
    # file lists, and the log's own temporary and checksum files.
    shutil.copy(parts[2], out / "part-00000-uncommitted-c000.snappy.parquet")
    (out / "part-00001-killed-c000.snappy.parquet").write_bytes(b"")
    (out / "_spark_metadata" / ".3.0f1e2d.tmp").write_text("v1\n{\"path\": \"nowhere\"}")
    (out / "_spark_metadata" / ".0.crc").write_bytes(b"\x00")

    assert committed_files(out) == parts
    frame = read_attributions(out)
    assert goals(frame) == ["g0a", "g0b", "g1a", "g1b", "g2a", "g2b"]
    with pytest.raises(pa.ArrowInvalid):  # a listing trips over the 0-byte file ...
        pq.read_table(out)
    (out / "part-00001-killed-c000.snappy.parquet").unlink()
    assert pq.read_table(out).num_rows == 8  # ... or counts batch 2 twice
    assert len(read_attributions(out)) == 6


@pytest.mark.parametrize("old_log_files", ["kept", "deleted"])
def test_a_compact_file_and_the_batches_after_it(tmp_path, old_log_files):
    parts = write_sink_output(tmp_path, batches(6), compact_interval=3)  # 2.compact, 5.compact
    log = tmp_path / "_spark_metadata"
    assert sorted(p.name for p in log.iterdir()) == ["0", "1", "2.compact", "3", "4", "5.compact"]
    (log / "5.compact").rename(log / "5")  # batch 5 as a delta: read 2.compact, 3, 4, 5
    if old_log_files == "deleted":  # as Spark's cleanup does after a compaction
        (log / "0").unlink()
        (log / "1").unlink()
    assert committed_files(tmp_path) == parts
    assert len(read_attributions(tmp_path)) == 12


def test_delete_entries_remove_a_file(tmp_path):
    parts = write_sink_output(tmp_path, batches(2))
    entry = json.loads((tmp_path / "_spark_metadata" / "0").read_text().split("\n")[1])
    (tmp_path / "_spark_metadata" / "2").write_text(
        "v1\n" + json.dumps({**entry, "action": "delete"}))
    assert committed_files(tmp_path) == parts[1:]
    assert goals(read_attributions(tmp_path)) == ["g1a", "g1b"]


def test_a_batch_output_counts_once_its_success_marker_exists(tmp_path):
    records = batches(1)[0]
    write_batch_output(tmp_path, records, success=False)
    with pytest.raises(NotAttributionOutput, match="neither a streaming file sink's "
                                                   "_spark_metadata/ log nor a batch write's "
                                                   "_SUCCESS marker"):
        read_attributions(tmp_path)
    write_batch_output(tmp_path, records)
    assert goals(read_attributions(tmp_path)) == ["g0a", "g0b"]


def test_output_without_the_added_columns_reads_with_their_defaults(tmp_path):
    write_batch_output(tmp_path / "old", batches(1)[0])
    frame = read_attributions(tmp_path / "old")
    for column, default in FEATURES_OFF.items():
        expected = [default] * 2
        values = [None if v != v else v for v in frame[column]]  # NaN -> None
        assert values == expected, column
    assert frame["impression_id"].isna().tolist() == [False, True]


def test_added_columns_are_read_as_written_and_files_without_them_get_defaults(tmp_path):
    new = [attribution_record("g9", 9 * HOUR, impression=9, impression_campaign="spring",
                              goal_value=20.0, credited_value=20.0, sign=-1, revision=2,
                              emit_timing="LATE")]
    parts = write_sink_output(tmp_path, [batches(1)[0], new])
    assert pq.read_schema(parts[0]).names != pq.read_schema(parts[1]).names
    frame = read_attributions(tmp_path).set_index("goal_event_id")
    assert frame.loc["g9", ["impression_campaign", "goal_value", "credited_value", "sign",
                            "revision", "emit_timing"]].tolist() == ["spring", 20.0, 20.0, -1, 2,
                                                                     "LATE"]
    assert frame.loc["g0a", ["sign", "revision", "emit_timing"]].tolist() == [1, 0, "ON_TIME"]


def test_a_log_without_batches_is_an_output_without_rows(tmp_path):
    (tmp_path / "_spark_metadata").mkdir()
    frame = read_attributions(tmp_path)
    assert frame.empty and {"goal_event_id", "credit", "sign"} <= set(frame.columns)


def test_rows_of_a_truth_file_and_of_an_output_directory_are_core_rows(tmp_path):
    write_batch_output(tmp_path / "out", batches(1)[0])
    part = next((tmp_path / "out").glob("part-*"))
    rows = read_attribution_rows(tmp_path / "out")
    assert rows == read_attribution_rows(part)
    assert [(r.goal_event_id, r.impression_id, r.goal_ts, r.trail) for r in rows] == [
        ("g0a", 0, 0, ("/landing",)), ("g0b", None, 1, ())]


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("empty", "holds no committed Spark output"),
    ("events", "holds no committed Spark output"),
    ("foreign", "is not attribution output: it lacks the columns user_id, goal_event_id"),
    ("not parquet", "is not a readable Parquet file"),
    ("version", "unsupported file sink log version 'v2'; expected 'v1'"),
    ("gap", "no log file for batch 1 \\(latest batch 2\\)"),
    ("lost file", "committed file .* is missing"),
])
def test_what_is_not_attribution_output_is_refused(tmp_path, case, message):
    out = tmp_path / "out"
    if case == "empty":
        out.mkdir()
    elif case == "events":
        out.mkdir()
        (out / "part-0.json").write_text('{"event_id": "e1"}\n')
    elif case == "foreign":
        out.mkdir()
        pq.write_table(pa.table({"raw_record": ["{}"], "reason": ["bad"]}), out / "part-0.parquet")
        (out / "_SUCCESS").write_text("")
    elif case == "not parquet":
        out.mkdir()
        (out / "part-0.parquet").write_text("not parquet")
        (out / "_SUCCESS").write_text("")
    elif case == "version":
        write_sink_output(out, batches(1))
        (out / "_spark_metadata" / "0").write_text("v2\n")
    elif case == "gap":
        write_sink_output(out, batches(3))
        (out / "_spark_metadata" / "1").unlink()
    elif case == "lost file":
        write_sink_output(out, batches(2))[1].unlink()
    with pytest.raises(NotAttributionOutput, match=message):
        read_attributions(out)


DAY = 24 * HOUR
# Goals either side of UTC midnights, one before 1970: each belongs to the date it falls on.
DATED_GOALS = {"g-first-ms": (0, dt.date(1970, 1, 1)), "g-last-ms": (DAY - 1, dt.date(1970, 1, 1)),
               "g-next-day": (DAY, dt.date(1970, 1, 2)),
               "g-before-1970": (-1, dt.date(1969, 12, 31))}


def dated_records() -> list[dict]:
    return [attribution_record(goal, ms, impression=n)
            for n, (goal, (ms, _)) in enumerate(DATED_GOALS.items())]


def goal_dates(frame) -> dict:
    return dict(zip(frame["goal_event_id"], frame[PARTITION_COLUMN]))


def test_goal_date_is_the_utc_date_of_goal_ts_last_in_every_layout(tmp_path):
    expected = {goal: day for goal, (_, day) in DATED_GOALS.items()}
    write_batch_output(tmp_path / "flat", dated_records())
    write_partitioned_batch_output(tmp_path / "partitioned", dated_records())
    flat_part = next((tmp_path / "flat").glob("part-*"))
    for source in (tmp_path / "flat", tmp_path / "partitioned", flat_part):
        frame = read_attributions(source)
        assert list(frame.columns) == [*OUTPUT_FIELDS, PARTITION_COLUMN], source
        assert goal_dates(frame) == expected, source
    # The directories the rows sit in are named by the same date.
    for part in committed_files(tmp_path / "partitioned"):
        days = set(read_attributions(part)[PARTITION_COLUMN])
        assert part.parent.name == f"{PARTITION_COLUMN}={days.pop().isoformat()}" and not days
    empty = tmp_path / "empty"
    (empty / "_spark_metadata").mkdir(parents=True)
    assert list(read_attributions(empty).columns) == [*OUTPUT_FIELDS, PARTITION_COLUMN]


def test_a_partitioned_streaming_output_is_read_through_its_log(tmp_path):
    parts = write_sink_output(tmp_path, [[r] for r in dated_records()], partitioned=True)
    assert len({p.parent for p in parts}) == 3 and all(p.parent != tmp_path for p in parts)
    # A killed micro-batch's leftovers inside a partition directory are not output.
    shutil.copy(parts[0], parts[0].parent / "part-00000-uncommitted-c000.snappy.parquet")
    (parts[1].parent / "part-00001-killed-c000.snappy.parquet").write_bytes(b"")
    assert committed_files(tmp_path) == parts
    assert sorted(read_attributions(tmp_path)["goal_event_id"]) == sorted(DATED_GOALS)


def test_a_partitioned_batch_output_counts_its_partitions_only_with_success(tmp_path):
    parts = write_partitioned_batch_output(tmp_path, dated_records())
    # A write in progress: a task's files under _temporary, a dynamic overwrite's staging
    # directory; neither is output.
    for hidden in ("_temporary/0/goal_date=1970-01-03", ".spark-staging-0f1e/goal_date=1970-01-01"):
        shutil.copytree(parts[0].parent, tmp_path / hidden)
    assert committed_files(tmp_path) == parts
    assert sorted(read_attributions(tmp_path)["goal_event_id"]) == sorted(DATED_GOALS)
    (tmp_path / "_SUCCESS").unlink()
    with pytest.raises(NotAttributionOutput, match="neither a streaming file sink's"):
        read_attributions(tmp_path)


def test_an_output_being_backfilled_is_refused_until_its_success_marker_is_back(tmp_path):
    write_partitioned_batch_output(tmp_path, dated_records())
    (tmp_path / "_SUCCESS").unlink()
    (tmp_path / BACKFILL_MARKER).write_text('{"goals_from": "1970-01-01", "goals_to": '
                                            '"1970-01-02"}\n')
    with pytest.raises(NotAttributionOutput, match="is being backfilled, or a backfill of it "
                                                   "stopped before it finished .*1970-01-02"):
        read_attributions(tmp_path)
    (tmp_path / "_SUCCESS").write_text("")  # what the backfill writes once it has finished
    assert len(read_attributions(tmp_path)) == len(DATED_GOALS)


def test_parquet_output_has_no_version_and_publishes_no_frontier(tmp_path):
    write_sink_output(tmp_path / "out", batches(2))
    output = read_committed_output(tmp_path / "out")
    assert (output.format, output.version, output.frontier) == ("parquet", None, None)
    assert output.final_through_ms is None and len(output.rows) == 4
    with pytest.raises(NotAttributionOutput, match="only Delta output publishes"):
        read_frontier(tmp_path / "out")
    with pytest.raises(NotAttributionOutput, match="has no versions to choose from"):
        read_attributions(tmp_path / "out", version=0)


def test_a_delta_table_reads_by_version_with_its_frontier(tmp_path):
    from deltalake import CommitProperties, write_deltalake

    from attribution.finality import frontier_metadata

    table = tmp_path / "delta"
    for n, records in enumerate(batches(3)):
        arrow = output_table(records)
        metadata = None if n == 2 else CommitProperties(custom_metadata={
            "userMetadata": frontier_metadata(n, (n + 1) * HOUR, HOUR)})
        write_deltalake(str(table), arrow, mode="append", commit_properties=metadata)
    assert is_delta_table(table)
    with pytest.raises(NotAttributionOutput, match="is a Delta table"):
        committed_files(table)
    # Version 2 carries no frontier: version 1's is in force.
    latest = read_committed_output(table)
    assert latest.version == 2 and len(latest.rows) == 6
    assert latest.frontier == Frontier(version=1, batch_id=1, watermark_ms=2 * HOUR,
                                       allowed_lateness_ms=HOUR, final_through_ms=HOUR)
    first = read_committed_output(table, version=0)
    assert sorted(first.rows["goal_event_id"]) == ["g0a", "g0b"]
    assert first.frontier.batch_id == 0 and first.final_through_ms == 0
    assert read_frontier(table, 1).watermark_ms == 2 * HOUR
    # The same shape as Parquet output: columns, defaults, goal_date last.
    assert list(latest.rows.columns) == [*OUTPUT_FIELDS, PARTITION_COLUMN]
    assert sorted(r.goal_event_id for r in read_attribution_rows(table)) == sorted(
        r["goal_event_id"] for batch in batches(3) for r in batch)
