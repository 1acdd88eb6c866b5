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

import gc
from concurrent.futures import Executor
from contextlib import contextmanager
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
from attribution.oracle import attribute_batch
from attribution.schema import EVENT_SCHEMA, OUTPUT_SCHEMA
from attribution.spark.files import data_files, read_event_records
from attribution.spark.types import arrow_schema

from .writers import numpy_array

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


def _objects(column: pa.ChunkedArray) -> np.ndarray:
    """A column as a numpy object array; a dictionary column shares one ``str`` per distinct
    value (so a URL is one object however many records carry it)."""
    if not pa.types.is_dictionary(column.type):
        return np.array(column.to_pylist() + [None], dtype=object)[:-1]  # never 2-d
    parts = []
    for chunk in column.chunks:
        values = np.array(chunk.dictionary.to_pylist() + [None], dtype=object)
        parts.append(values[chunk.indices.fill_null(len(chunk.dictionary)).to_numpy()])
    return np.concatenate(parts) if parts else np.empty(0, dtype=object)


def _epoch_ms(column: pa.ChunkedArray) -> np.ndarray:
    """Timestamps as epoch milliseconds, floored as ``attribution.events.ts_to_ms`` floors."""
    per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[column.type.unit]
    raw = column.cast(pa.int64()).to_numpy()
    return raw * 1_000 if per_ms is None else np.floor_divide(raw, per_ms)


def _mask(column: pa.ChunkedArray, value: str) -> np.ndarray:
    return np.asarray(pc.equal(column.cast(pa.string()), value).fill_null(False), dtype=bool)


def events_from_table(table: pa.Table) -> list[Event]:
    """The table's visits and impressions as ``Event``s, in table order (heartbeats dropped).

    Fields follow ``parse_event``: a visit's missing ``is_goal`` is false and its impression
    fields are ignored; an impression's visit fields are ignored.
    """
    visit = _mask(table.column("event_type"), "visit")
    impression = _mask(table.column("event_type"), "impression")
    ids, users = _objects(table.column("event_id")), _objects(table.column("user_id"))
    ts = _epoch_ms(table.column("ts"))
    events = np.empty(len(visit), dtype=object)
    # One map per kind over that kind's values (no per-record Python frame), then both kinds
    # put back in table order, which is arrival order: the first redelivered copy comes first.
    if visit.any():
        count = int(visit.sum())
        goals = np.asarray(table.column("is_goal").fill_null(False), dtype=bool)
        events[visit] = list(map(
            Event, ids[visit].tolist(), users[visit].tolist(), repeat("visit", count),
            ts[visit].tolist(), _objects(table.column("url"))[visit].tolist(),
            _objects(table.column("referer"))[visit].tolist(), goals[visit].tolist()))
    if impression.any():
        count = int(impression.sum())
        events[impression] = list(map(
            Event, ids[impression].tolist(), users[impression].tolist(),
            repeat("impression", count), ts[impression].tolist(), repeat(None, count),
            repeat(None, count), repeat(False, count),
            _objects(table.column("impression_id"))[impression].tolist(),
            _objects(table.column("source_url"))[impression].tolist(),
            _objects(table.column("target_url"))[impression].tolist()))
    return events[visit | impression].tolist()


def rows_to_table(rows: Sequence[Attribution]) -> pa.Table:
    """Attribution rows as an Arrow table in the output schema, column by column.

    The same table as ``attribution.spark.files.attributions_to_arrow`` (a test holds them equal),
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


@contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector. Building a million small objects (events, then the
    oracle's state) sets it off every few hundred allocations to scan objects that all stay
    alive: a third of the time ``events_from_table`` takes. Nothing here makes cycles that need
    collecting meanwhile, and the collector is back on afterwards (as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def attribute_table(table: pa.Table, config: AttributionConfig) -> pa.Table:
    """The oracle's rows for the events of ``table`` (whole users only), as an output table.

    This is what each process runs over its range of users.
    """
    with _no_cyclic_gc():
        return rows_to_table(attribute_batch(events_from_table(table), config))


def split_by_user(table: pa.Table, parts: int) -> list[pa.Table]:
    """Cut ``table`` into ``parts`` tables by ranges of sorted ``user_id`` (heartbeats, which have
    none, dropped), each range holding about the same number of records; each keeps the
    records' order.

    :param table: event records in arrival order.
    :param parts: how many ranges (at least 1); fewer come back when there are fewer users.
    """
    column = table.column("user_id")
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    chunks = [(chunk.dictionary.to_pylist(), chunk.indices) for chunk in column.chunks]
    names = sorted({name for values, _ in chunks for name in values if name is not None})
    if not names:
        return []
    # Python's order of the ids, which is the order oracle.sort_key puts rows in; -1: no user.
    rank_of = {name: n for n, name in enumerate(names)}
    row_rank = np.concatenate([
        np.array([rank_of.get(v, -1) for v in values] + [-1], dtype=np.int64)[
            indices.fill_null(len(values)).to_numpy()]
        for values, indices in chunks])
    per_user = np.bincount(row_rank[row_rank >= 0], minlength=len(names))
    # A range ends where its share of the records is reached; users are never split.
    cumulative = np.cumsum(per_user)
    cuts = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, parts) / parts, side="left")
    bounds = np.unique(np.concatenate([[0], np.minimum(cuts + 1, len(names)), [len(names)]]))
    return [table.filter(numpy_array((row_rank >= lo) & (row_rank < hi), pa.bool_()))
            for lo, hi in zip(bounds[:-1], bounds[1:])]


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
    table = read_event_table(events_dir, fmt)
    if parts == 1:
        return attribute_table(table, config)
    shares = split_by_user(table, parts)
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
    """Write the truth table as one Parquet file (as ``attribution.spark.files.write_attributions``
    does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
