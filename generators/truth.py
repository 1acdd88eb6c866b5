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
The truth holds every attribution model with the default half-life
(``GeneratorParams.attribution_config``); ``read_truth`` reads the rows of chosen models back, to
compare with a job run with those models. The oracle also counts, per model, the goals with two
or more candidates (``Truth.multi_candidate``), which the manifest reports.

The per-record Python work is the oracle's own (one ``Event`` per record, one
``UserAttribution`` per user); reading, splitting, grouping by user and the output table are
columnar (Arrow, numpy). The events arrive already grouped at ``oracle.attribute_users``, which is
what ``attribute_batch`` runs once it has grouped them itself. The records are the generator's own
files, so they are turned into ``Event``s field by field with ``attribution.events.parse_event``'s
rules for absent fields rather than validated one by one; the tests compare the result with the
oracle over the validating reader.
"""
from __future__ import annotations

import gc
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from attribution.config import DEFAULT_MODELS, AttributionConfig
from attribution.core import Attribution
from attribution.events import Event
from attribution.oracle import attribute_users
from attribution.schema import EVENT_SCHEMA, OUTPUT_SCHEMA
from attribution.spark.files import data_files, read_event_records
from attribution.spark.output import read_attribution_rows
from attribution.spark.types import arrow_schema

from .writers import numpy_array

EVENT_ARROW_SCHEMA = arrow_schema(EVENT_SCHEMA)
OUTPUT_ARROW_SCHEMA = arrow_schema(OUTPUT_SCHEMA)
# The JSON reader parses the ISO-8601 ``...Z`` strings straight into UTC timestamps.
_JSON_SCHEMA = pa.schema([f.with_type(pa.timestamp("ms", tz="UTC")) if f.name == "ts" else f
                          for f in EVENT_ARROW_SCHEMA])
_STRING_COLUMNS = ("user_id", "event_type", "url", "referer", "source_url", "target_url",
                   "campaign")


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
    if pa.types.is_string(column.type):  # Arrow builds the object array itself
        return column.to_numpy(zero_copy_only=False)
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


def _events(table: pa.Table) -> list[Event]:
    """The records of ``table``, all visits or impressions, as ``Event``s in table order.

    Fields follow ``parse_event``: a visit's missing ``is_goal`` is false and its impression
    fields are ignored; an impression's visit fields are ignored.
    """
    kind = _mask(table.column("event_type"), "visit")
    ids, users = _objects(table.column("event_id")), _objects(table.column("user_id"))
    ts = _epoch_ms(table.column("ts"))
    events = np.empty(table.num_rows, dtype=object)
    # One map per kind over that kind's values (no per-record Python frame), then both kinds
    # put back in table order (``fromiter``: an event is a tuple, which numpy would otherwise
    # take for a row of a 2-d array).
    count = int(kind.sum())
    if count:
        goals = np.asarray(table.column("is_goal").fill_null(False), dtype=bool)
        events[kind] = np.fromiter(map(
            Event, ids[kind].tolist(), users[kind].tolist(), repeat("visit", count),
            ts[kind].tolist(), _objects(table.column("url"))[kind].tolist(),
            _objects(table.column("referer"))[kind].tolist(), goals[kind].tolist(),
            repeat(None, count), repeat(None, count), repeat(None, count), repeat(None, count),
            _objects(table.column("value"))[kind].tolist()), dtype=object, count=count)
    impression, count = ~kind, table.num_rows - count
    if count:
        events[impression] = np.fromiter(map(
            Event, ids[impression].tolist(), users[impression].tolist(),
            repeat("impression", count), ts[impression].tolist(), repeat(None, count),
            repeat(None, count), repeat(False, count),
            _objects(table.column("impression_id"))[impression].tolist(),
            _objects(table.column("source_url"))[impression].tolist(),
            _objects(table.column("target_url"))[impression].tolist(),
            _objects(table.column("campaign"))[impression].tolist()), dtype=object, count=count)
    return events.tolist()


def _attributable(table: pa.Table) -> np.ndarray:
    """Which records are visits or impressions (the oracle ignores heartbeats)."""
    kind = table.column("event_type")
    return _mask(kind, "visit") | _mask(kind, "impression")


def events_by_user(table: pa.Table, part: int = 0,
                   parts: int = 1) -> list[tuple[str, list[Event]]]:
    """The visits and impressions of range ``part`` of ``parts`` ranges of users of ``table``
    (``split_by_user``'s ranges) as ``Event``s grouped by user, for ``oracle.attribute_users``:
    users in ascending ``user_id`` order, each user's events in table order, which is arrival
    order (so the first redelivered copy comes first).

    :param table: event records in arrival order.
    :param part: which range, from 0; a range past the last (fewer users than ranges) is empty.
    :param parts: how many ranges the users are cut into.
    """
    names, rank = _user_ranks(table)
    bounds = _user_bounds(rank, len(names), parts)
    if part + 1 >= len(bounds):
        return []
    low, high = int(bounds[part]), int(bounds[part + 1])
    rows = np.nonzero(_attributable(table) & (rank >= low) & (rank < high))[0]
    rows = rows[np.argsort(rank[rows], kind="stable")]
    # One take of the range's records, already grouped: no filtered copy of the whole table.
    events = _events(table.take(numpy_array(rows, pa.int64())))
    ends = np.cumsum(np.bincount(rank[rows] - low, minlength=high - low)).tolist()
    return [(names[low + k], events[start:end])
            for k, (start, end) in enumerate(zip([0] + ends, ends)) if end > start]


def _user_ranks(table: pa.Table) -> tuple[list[str], np.ndarray]:
    """The distinct user ids in Python's order (the order ``oracle.sort_key`` puts rows in),
    and each record's rank among them (-1: no user)."""
    column = table.column("user_id")
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    if not column.num_chunks:
        return [], np.empty(0, dtype=np.int64)
    column = column.unify_dictionaries()  # one dictionary for every file
    dictionary = column.chunk(0).dictionary
    # Arrow sorts strings by their UTF-8 bytes, which is Python's order of code points.
    order = pc.sort_indices(dictionary).to_numpy()
    rank_of = np.full(len(dictionary) + 1, -1, dtype=np.int64)  # the last entry: no user
    rank_of[order] = np.arange(len(dictionary))
    return dictionary.take(order).to_pylist(), np.concatenate([
        rank_of[chunk.indices.fill_null(len(dictionary)).to_numpy()] for chunk in column.chunks])


def rows_to_table(rows: Sequence[Attribution]) -> pa.Table:
    """Attribution rows as an Arrow table in the output schema, column by column.

    The same table as ``attribution.spark.files.attributions_to_arrow`` (a test holds them
    equal), without building one dict and two datetimes per row.

    :param rows: the attribution rows, in the order the table keeps.
    """
    # A row is a tuple of the schema's fields in order (``Attribution``): zip transposes them.
    by_field = list(zip(*rows)) if rows else [()] * len(OUTPUT_ARROW_SCHEMA)
    columns = []
    for field, values in zip(OUTPUT_ARROW_SCHEMA, by_field):
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
    alive: a third of the time ``events_by_user`` takes. Nothing here makes cycles that need
    collecting meanwhile, and the collector is back on afterwards (as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class Truth:
    """The oracle's rows as an output table, and per configured model how many goals had two
    or more candidates under it (``attribute_batch``'s ``multi_candidate``)."""

    table: pa.Table
    multi_candidate: dict[str, int]


def attribute_table(table: pa.Table, config: AttributionConfig, part: int = 0,
                    parts: int = 1) -> Truth:
    """The oracle's rows for the users of range ``part`` of ``parts`` (``events_by_user``) of
    ``table``, as an output table. This is what each process runs over its range of users.

    :param table: event records in arrival order (as read back from the files).
    :param config: the attribution rules' parameters and models.
    :param part: which range of users, from 0.
    :param parts: how many ranges the users are cut into.
    """
    counts = dict.fromkeys(config.models, 0)
    with _no_cyclic_gc():
        rows = attribute_users(events_by_user(table, part, parts), config, counts)
        return Truth(rows_to_table(rows), counts)


def split_by_user(table: pa.Table, parts: int) -> list[pa.Table]:
    """Cut ``table`` into ``parts`` tables by ranges of sorted ``user_id`` (heartbeats, which
    have none, dropped), each range holding about the same number of records; each keeps the
    records' order.

    :param table: event records in arrival order.
    :param parts: how many ranges (at least 1); fewer come back when there are fewer users.
    """
    names, row_rank = _user_ranks(table)
    bounds = _user_bounds(row_rank, len(names), parts)
    return [table.filter(numpy_array((row_rank >= lo) & (row_rank < hi), pa.bool_()))
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def _user_bounds(rank: np.ndarray, users: int, parts: int) -> np.ndarray:
    """Where ``parts`` ranges of user ranks start and end (``bounds[k]`` to ``bounds[k + 1]``),
    each range holding about the same number of records; fewer ranges when there are fewer
    users, none without users.

    :param rank: each record's user rank (-1: no user), from ``_user_ranks``.
    :param users: how many users there are.
    :param parts: how many ranges are wanted (at least 1).
    """
    if not users:
        return np.zeros(1, dtype=np.int64)
    per_user = np.bincount(rank[rank >= 0], minlength=users)
    # A range ends where its share of the records is reached; users are never split.
    cumulative = np.cumsum(per_user)
    cuts = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, parts) / parts, side="left")
    return np.unique(np.concatenate([[0], np.minimum(cuts + 1, users), [users]]))


def truth_share(events_dir, fmt: str, config: AttributionConfig, part: int = 0,
                parts: int = 1) -> Truth:
    """The truth rows of range ``part`` of ``parts`` ranges of users (``split_by_user``) of the
    files under ``events_dir``, read back here. This is what each process runs.

    :param events_dir: the written event files.
    :param fmt: their format.
    :param config: the attribution rules' parameters (lookback, dedup window).
    :param part: which range, from 0.
    :param parts: how many ranges the users are cut into.
    """
    return attribute_table(read_event_table(events_dir, fmt), config, part, parts)


def compute_truth(events_dir, fmt: str, config: AttributionConfig,
                  pool: Optional[Executor] = None, processes: int = 1) -> Truth:
    """The truth over the files under ``events_dir``: every goal's attribution rows under each
    model of ``config``, in ``oracle.sort_key`` order, and the goals with two or more
    candidates per model.

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
    shares = [truth_share(events_dir, fmt, config, 0, parts)] + [f.result() for f in futures]
    return Truth(pa.concat_tables([t.table for t in shares]),
                 {m: sum(t.multi_candidate[m] for t in shares) for m in config.models})


def write_truth(table: pa.Table, path: Path) -> None:
    """Write the truth table as one Parquet file (as
    ``attribution.spark.files.write_attributions`` does).

    :param table: the truth rows in the output schema (``rows_to_table``).
    :param path: the file to write; its directory is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_truth(path, models: Sequence[str] = DEFAULT_MODELS) -> list[Attribution]:
    """The rows of ``models`` in a truth file, in its order: what a job run with ``--models``
    set to them must produce.

    :param path: the truth file (``DIR/truth/attributions.parquet``).
    :param models: the models to keep; by default the job's default models.
    """
    return [r for r in read_attribution_rows(path) if r.model in models]
