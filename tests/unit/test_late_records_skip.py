"""When the late-record audit may skip a micro-batch without reading its records again: Spark
dropped nothing and nothing is accepted late, or a Parquet file's ``ts`` column shows every
record past the watermark plus the allowed lateness."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attribution.spark.late_records import _nothing_late, dropped_by_batch

MINUTE = 60_000
T = 1_700_000_000_000  # the watermark a micro-batch is judged by, epoch ms


def _parquet(path, values, type_=pa.timestamp("us", tz="UTC")):
    pq.write_table(pa.table({"event_id": [f"e{i}" for i in range(len(values))],
                             "ts": pa.array(values, type=type_)}), path)
    return str(path)


def _us(ms):
    return None if ms is None else ms * 1000


@pytest.mark.parametrize("lateness", [0, 5 * MINUTE])
def test_a_parquet_file_proves_itself_on_time_only_when_every_ts_is_past_the_edge(tmp_path,
                                                                                   lateness):
    edge = T + lateness   # records at or behind it are dropped or accepted late
    past = _parquet(tmp_path / "past.parquet", [_us(edge + 1), _us(edge + MINUTE), None])
    at_edge = _parquet(tmp_path / "edge.parquet", [_us(edge + MINUTE), _us(edge)])
    # 999 microseconds past the edge is the edge itself in milliseconds, as Spark truncates.
    within_a_ms = _parquet(tmp_path / "sub.parquet", [_us(edge) + 999])
    assert _nothing_late([past], "parquet", T, lateness, dropped=None)
    assert not _nothing_late([at_edge], "parquet", T, lateness, dropped=None)
    assert not _nothing_late([within_a_ms], "parquet", T, lateness, dropped=None)
    assert not _nothing_late([past, at_edge], "parquet", T, lateness, dropped=None)


def test_other_timestamp_units_and_naive_timestamps_compare_in_utc_milliseconds(tmp_path):
    ns = _parquet(tmp_path / "ns.parquet", [(T + 1) * 1_000_000], pa.timestamp("ns", tz="UTC"))
    naive = _parquet(tmp_path / "naive.parquet", [_us(T)], pa.timestamp("us"))
    assert _nothing_late([ns], "parquet", T, 0, dropped=None)
    assert not _nothing_late([naive], "parquet", T, 0, dropped=None)


def test_files_that_cannot_prove_it_are_read_again(tmp_path):
    text_ts = _parquet(tmp_path / "text.parquet", ["2030-01-01T00:00:00Z"], pa.string())
    no_ts = tmp_path / "no-ts.parquet"
    pq.write_table(pa.table({"event_id": ["e"]}), no_ts)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    for files in ([text_ts], [str(no_ts)], [str(broken)], ["s3a://bucket/part-0.parquet"]):
        assert not _nothing_late(files, "parquet", T, 0, dropped=None)
    # JSON lines and Avro have no column to read alone.
    assert not _nothing_late([str(tmp_path / "part-0.json")], "json", T, 0, dropped=None)


def test_sparks_count_of_dropped_rows_suffices_only_without_allowed_lateness(tmp_path):
    files = [str(tmp_path / "part-0.json")]
    assert _nothing_late(files, "json", T, 0, dropped=0)
    assert not _nothing_late(files, "json", T, 0, dropped=3)
    # With an allowed lateness, records Spark kept may still be late (accepted): not provable.
    assert not _nothing_late(files, "json", T, 5 * MINUTE, dropped=0)
    # A micro-batch whose progress this run has not seen (None) is read again.
    assert not _nothing_late(files, "json", T, 0, dropped=None)


def _progress(batch_id, dropped, ran=True):
    durations = {"addBatch": 5, "triggerExecution": 9} if ran else {"triggerExecution": 1}
    return SimpleNamespace(batchId=batch_id, durationMs=durations,
                           stateOperators=[SimpleNamespace(numRowsDroppedByWatermark=dropped)])


def test_only_micro_batches_that_ran_report_their_dropped_rows():
    # After micro-batch 1, an idle trigger reports progress under id 2 with nothing dropped;
    # until micro-batch 2's own update arrives, its count is unknown, not 0.
    updates = [_progress(0, 0), _progress(1, 4), _progress(2, 0, ran=False)]
    assert dropped_by_batch(updates) == {0: 0, 1: 4}
    assert dropped_by_batch([*updates, _progress(2, 7)]) == {0: 0, 1: 4, 2: 7}


def test_an_idle_trigger_is_told_apart_in_both_forms_of_a_progress_update():
    from attribution.spark.query_progress import micro_batch_ran

    ran, idle = _progress(3, 0), _progress(3, 0, ran=False)
    assert micro_batch_ran(ran) and not micro_batch_ran(idle)
    assert micro_batch_ran({"batchId": 3, "durationMs": ran.durationMs})
    assert not micro_batch_ran({"batchId": 3, "durationMs": idle.durationMs})
    assert not micro_batch_ran({"batchId": 3})
