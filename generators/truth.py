"""The truth file: the batch oracle over a written dataset's files, on every core it is given.

``compute_truth(events_dir, fmt, config, pool, processes)`` splits the users into contiguous
ranges of their sorted ids with about as many records each and runs
``attribution.oracle.attribute_batch`` over each range: one range in this process, the others in
``pool``'s processes. Each process reads the event files back itself (the truth is what a reader
of the files must get, not what the generator meant to write) and cuts the same ranges (the cut
depends on the files only), so nothing large crosses between processes and no process waits for
another to read. Because ``oracle.sort_key`` orders rows by ``user_id`` first and the ranges are
disjoint and ascending, the ranges' rows laid end to end are already in the canonical order: no
merge sort is needed, and the rows are those one ``attribute_batch`` over all events gives.

The per-record Python work is the oracle's own (one ``Event`` per record, one
``UserAttribution`` per user); reading, splitting and the output table are columnar (Arrow). The
records are the generator's own files, so they are turned into ``Event``s field by field with
``attribution.events.parse_event``'s rules for absent fields rather than validated one by one;
the tests compare the result with the oracle over the validating reader.
"""
from __future__ import annotations

from concurrent.futures import Executor
from itertools import repeat
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from attribution.config import AttributionConfig
from attribution.core import Attribution
from attribution.events import Event
from attribution.io import data_files, read_event_records
from attribution.oracle import attribute_batch
from attribution.schema import EVENT_SCHEMA, OUTPUT_SCHEMA, arrow_schema

EVENT_ARROW_SCHEMA = arrow_schema(EVENT_SCHEMA)
OUTPUT_ARROW_SCHEMA = arrow_schema(OUTPUT_SCHEMA)
# The JSON reader parses the ISO-8601 ``...Z`` strings straight into UTC timestamps.
_JSON_SCHEMA = pa.schema([f.with_type(pa.timestamp("ms", tz="UTC")) if f.name == "ts" else f
                          for f in EVENT_ARROW_SCHEMA])
_STRING_COLUMNS = ("user_id", "event_type", "url", "referer", "source_url", "target_url")


def read_event_table(events_dir, fmt: str) -> pa.Table:
    """Every record of an event directory (files in name order, i.e. arrival order) as one Arrow
    table in the event schema, timestamps as microseconds.

    :param events_dir: the directory of ``part-NNNNN`` files.
    :param fmt: their format: ``json``, ``parquet`` or ``avro``.
    """
    tables = []
    for f in data_files(events_dir):
        if fmt == "parquet":
            # Dictionary columns come straight from the file's dictionary pages: each distinct
            # URL or user id becomes one Python string later, not one per record.
            table = pq.read_table(f, read_dictionary=list(_STRING_COLUMNS), use_threads=False)
        elif fmt == "json":
            table = pa_json.read_json(f, parse_options=pa_json.ParseOptions(
                explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="error"))
        elif fmt == "avro":
            table = pa.Table.from_pylist(list(read_event_records(f)), schema=EVENT_ARROW_SCHEMA)
        else:
            raise ValueError(f"unknown format {fmt!r}; expected json, parquet or avro")
        columns = [table.column(name).cast(field.type) if name == "ts" else table.column(name)
                   for name, field in zip(EVENT_ARROW_SCHEMA.names, EVENT_ARROW_SCHEMA)]
        tables.append(pa.table(columns, names=EVENT_ARROW_SCHEMA.names))
    if not tables:
        return EVENT_ARROW_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


def _as_list(column: pa.ChunkedArray) -> list:
    """A column as Python values; a dictionary column shares one ``str`` per distinct value."""
    if not pa.types.is_dictionary(column.type):
        return column.to_pylist()
    out: list = []
    for chunk in column.chunks:
        values = np.array(chunk.dictionary.to_pylist() + [None], dtype=object)
        indices = chunk.indices.fill_null(len(chunk.dictionary)).to_numpy(zero_copy_only=False)
        out.extend(values[indices].tolist())
    return out


def _epoch_ms(column: pa.ChunkedArray) -> list[int]:
    """Timestamps as epoch milliseconds, floored as ``attribution.events.ts_to_ms`` floors."""
    per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[column.type.unit]
    raw = column.cast(pa.int64()).to_numpy()
    if per_ms is None:
        return (raw * 1_000).tolist()
    return np.floor_divide(raw, per_ms).tolist()


def events_from_table(table: pa.Table) -> list[Event]:
    """The table's visits and impressions as ``Event``s, in table order (heartbeats dropped).

    Fields follow ``parse_event``: a visit's missing ``is_goal`` is false and its impression
    fields are ignored; an impression's visit fields are ignored.
    """
    kind = table.column("event_type").cast(pa.string())
    visit = np.asarray(pc.equal(kind, "visit").fill_null(False), dtype=bool)
    impression = np.asarray(pc.equal(kind, "impression").fill_null(False), dtype=bool)
    events = np.empty(len(visit), dtype=object)
    # One map over each kind's columns (no per-record Python frame), then both kinds put back
    # in table order, which is arrival order: the first redelivered copy must come first.
    for mask, make in ((visit, _visits), (impression, _impressions)):
        if mask.any():
            events[mask] = make(table.filter(pa.array(mask)))
    return events[visit | impression].tolist()


def _visits(table: pa.Table) -> list[Event]:
    count = table.num_rows
    return list(map(Event, _as_list(table.column("event_id")), _as_list(table.column("user_id")),
                    repeat("visit", count), _epoch_ms(table.column("ts")),
                    _as_list(table.column("url")), _as_list(table.column("referer")),
                    table.column("is_goal").fill_null(False).to_pylist()))


def _impressions(table: pa.Table) -> list[Event]:
    count = table.num_rows
    return list(map(Event, _as_list(table.column("event_id")), _as_list(table.column("user_id")),
                    repeat("impression", count), _epoch_ms(table.column("ts")),
                    repeat(None, count), repeat(None, count), repeat(False, count),
                    table.column("impression_id").to_pylist(),
                    _as_list(table.column("source_url")), _as_list(table.column("target_url"))))


def rows_to_table(rows: Sequence[Attribution]) -> pa.Table:
    """Attribution rows as an Arrow table in the output schema, column by column.

    The same table as ``attribution.io.attributions_to_arrow`` (a test holds them equal),
    without building one dict and two datetimes per row.
    """
    columns = []
    for field in OUTPUT_ARROW_SCHEMA:
        values = [getattr(r, field.name) for r in rows]
        if pa.types.is_timestamp(field.type):
            ms = pa.array(values, type=pa.int64())
            columns.append(pc.multiply(ms, 1_000).cast(field.type))
        else:
            columns.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(columns, schema=OUTPUT_ARROW_SCHEMA)


def attribute_table(table: pa.Table, config: AttributionConfig) -> pa.Table:
    """The oracle's rows for the events of ``table`` (whole users only), as an output table.

    This is what each process runs over its range of users.
    """
    return rows_to_table(attribute_batch(events_from_table(table), config))


def split_by_user(table: pa.Table, parts: int) -> list[pa.Table]:
    """Cut ``table`` into ``parts`` tables by ranges of sorted ``user_id`` (heartbeats, which have
    none, dropped), each range holding about the same number of records; each keeps the
    records' order.

    :param table: event records in arrival order.
    :param parts: how many ranges (at least 1); fewer come back when there are fewer users.
    """
    users = pc.dictionary_encode(table.column("user_id").cast(pa.string())).combine_chunks()
    names = users.dictionary.to_pylist()
    index = users.indices.fill_null(0).to_numpy()
    valid = np.asarray(users.is_valid(), dtype=bool)
    if not names:
        return []
    # Python's order of the ids, which is the order oracle.sort_key puts rows in.
    rank = np.empty(len(names), dtype=np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    row_rank = np.where(valid, rank[np.where(valid, index, 0)], -1)
    per_user = np.bincount(row_rank[valid], minlength=len(names))
    # A range ends where its share of the records is reached; users are never split.
    cumulative = np.cumsum(per_user)
    cuts = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, parts) / parts, side="left")
    bounds = np.unique(np.concatenate([[0], np.minimum(cuts + 1, len(names)), [len(names)]]))
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out.append(table.filter(pa.array((row_rank >= lo) & (row_rank < hi))))
    return out


def truth_share(events_dir, fmt: str, config: AttributionConfig, part: int = 0,
                parts: int = 1) -> pa.Table:
    """The truth rows of range ``part`` of ``parts`` ranges of users (``split_by_user``) of the
    files under ``events_dir``, read back here. This is what each process runs.

    :param events_dir: the written event files.
    :param fmt: their format.
    :param config: the attribution rules' parameters (lookback, dedup window).
    :param part: which range, from 0.
    :param parts: how many ranges the users are cut into.
    """
    shares = split_by_user(read_event_table(events_dir, fmt), parts)
    if part >= len(shares):  # fewer users than ranges
        return OUTPUT_ARROW_SCHEMA.empty_table()
    return attribute_table(shares[part], config)


def compute_truth(events_dir, fmt: str, config: AttributionConfig,
                  pool: Optional[Executor] = None, processes: int = 1) -> pa.Table:
    """The truth over the files under ``events_dir``: every goal's attribution row, in
    ``oracle.sort_key`` order.

    :param events_dir: the written event files.
    :param fmt: their format.
    :param config: the attribution rules' parameters (lookback, dedup window).
    :param pool: processes for the other ranges of users; ``None`` computes everything here.
    :param processes: how many ranges to cut, this process included (1 without ``pool``).
    """
    parts = processes if pool is not None else 1
    # The pool starts on the other ranges at once; this process takes the first meanwhile.
    futures = [pool.submit(truth_share, events_dir, fmt, config, k, parts)
               for k in range(1, parts)]
    first = truth_share(events_dir, fmt, config, 0, parts)
    return pa.concat_tables([first] + [f.result() for f in futures])


def write_truth(table: pa.Table, path: Path) -> None:
    """Write the truth table as one Parquet file (as ``attribution.io.write_attributions`` does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
