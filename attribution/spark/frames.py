"""Conversions between Spark's data (pandas frames, Arrow batches, Rows) and the core's events
and rows.

Inputs carry ``ts_ms`` (epoch milliseconds, computed by Spark with ``unix_millis``), so no
Python-side timestamp or time-zone conversion happens on the way in. On the way out, timestamps
are UTC-aware values. Everything here runs once per user per micro-batch or once per row, so it
works column-wise and avoids per-row pandas work, which at a million events costs more than the
attribution itself (measured with ``python -m benchmarks.streaming``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from ..config import AttributionConfig
from ..core import Attribution
from ..events import Event, ms_to_datetime
from ..schema import OUTPUT_FIELDS, OUTPUT_SCHEMA, field_kinds

# The columns the stateful operators read, in this order (``ts`` stays for Spark's watermark).
INPUT_COLUMNS = ("event_id", "user_id", "event_type", "ts", "ts_ms", "url", "referer", "is_goal",
                 "impression_id", "source_url", "target_url", "campaign", "value")
_OUTPUT_KINDS = {name: kind for name, (kind, _) in field_kinds(OUTPUT_SCHEMA).items()}
_NAT = np.datetime64("NaT", "ms")
_UTC_MS = pd.DatetimeTZDtype("ms", "UTC")


# applyInPandasWithState converts every input column to pandas once per key and micro-batch, so
# its input is few columns: the key, ``ts`` (which must stay for the event-time timeout), the
# rest of the event as one JSON object built by Spark (``PACKED_COLUMN``), and the two times the
# bucket function needs before deciding whether to parse that JSON at all: ``ts_ms``, the
# event's time, and ``goal_ms``, the same for a goal (a visit with is_goal), else null.
# The JSON uses one-letter keys: it is also what a user's not-yet-attributed events are stored
# as (see ``apply_in_pandas.encode_bucket``), so its size is state size.
PACKED_COLUMN = "event"
PACKED_KEYS = {"event_id": "i", "event_type": "t", "ts_ms": "s", "url": "u", "referer": "r",
               "is_goal": "g", "impression_id": "m", "source_url": "a", "target_url": "b",
               "campaign": "c", "value": "v"}


def _event_from_json(user_id: str, e: dict) -> Event:
    # Spark's ``to_json`` leaves null fields out, hence ``get`` (and inboxes stored before
    # campaign and value existed read as without them).
    get = e.get
    return Event(e["i"], user_id, e["t"], e["s"], get("u"), get("r"), get("g") is True, get("m"),
                 get("a"), get("b"), get("c"), get("v"))


def events_from_packed(user_id: str, frame: pd.DataFrame) -> Iterator[Event]:
    """Events from a frame whose ``PACKED_COLUMN`` holds each event as JSON.

    :param user_id: the user the frame's events belong to.
    :param frame: a frame with a ``PACKED_COLUMN``.
    """
    loads = json.loads
    for text in frame[PACKED_COLUMN].tolist():
        yield _event_from_json(user_id, loads(text))


def events_from_json_list(user_id: str, packed: str) -> list[Event]:
    """Events from packed JSON objects joined by commas (``PackedUserBatch.packed``).

    :param user_id: the user the events belong to.
    :param packed: the events' JSON objects, joined by commas.
    """
    return [_event_from_json(user_id, e) for e in json.loads(f"[{packed}]")]


@dataclass(slots=True)
class PackedUserBatch:
    """One user's events of a micro-batch, still as JSON, with the times that decide whether
    they must be parsed now."""

    packed: str              # the events' JSON objects, comma-joined, in arrival order
    min_goal_ms: Optional[int]   # the earliest goal among them, or None
    min_ts_ms: int
    max_ts_ms: int


def packed_by_user(frames: Iterable[pd.DataFrame]) -> dict[str, PackedUserBatch]:
    """Packed frames holding several users (``user_id``, ``PACKED_COLUMN``, ``ts_ms``,
    ``goal_ms``), grouped by user without parsing any JSON.

    :param frames: the packed frames of one call of the stateful function.
    """
    texts: dict[str, list[str]] = {}
    min_ts: dict[str, int] = {}
    max_ts: dict[str, int] = {}
    min_goal: dict[str, int] = {}
    for frame in frames:
        users = frame["user_id"].tolist()
        for user_id, text, ts in zip(users, frame[PACKED_COLUMN].tolist(),
                                     frame["ts_ms"].tolist()):
            held = texts.get(user_id)
            if held is None:
                texts[user_id] = [text]
                min_ts[user_id] = max_ts[user_id] = ts
            else:
                held.append(text)
                if ts > max_ts[user_id]:
                    max_ts[user_id] = ts
                elif ts < min_ts[user_id]:
                    min_ts[user_id] = ts
        goals = frame["goal_ms"]
        has_goal = goals.notna().to_numpy()
        if has_goal.any():
            for user_id, goal in zip(frame["user_id"][has_goal].tolist(),
                                     goals[has_goal].astype("int64").tolist()):
                if goal < min_goal.get(user_id, goal + 1):
                    min_goal[user_id] = goal
    return {user_id: PackedUserBatch(",".join(held), min_goal.get(user_id), min_ts[user_id],
                                     max_ts[user_id])
            for user_id, held in texts.items()}


def events_from_rows(rows: Iterable) -> Iterator[Event]:
    """Events from Spark ``Row``s with ``INPUT_COLUMNS``, in that order.

    A ``Row`` is a tuple: unpacking it by position skips the per-field name lookup of
    ``row.field``, which is most of the cost at a million rows.

    :param rows: Spark ``Row``s with ``INPUT_COLUMNS``.
    """
    for eid, uid, typ, _ts, ts_ms, url, ref, goal, iid, src, tgt, campaign, value in rows:
        yield Event(eid, uid, typ, int(ts_ms), url, ref, goal is True, iid, src, tgt, campaign,
                    value)


def _output_column(kind: str, values: tuple):
    """One output column in a form Spark's Arrow conversion takes without a detour: epoch-ms
    timestamps as UTC-aware ``datetime64[ms, UTC]`` (None becomes NaT; aware, so the session
    time zone cannot shift them), doubles as float64 (None becomes NaN, which Spark's
    conversion writes as null; a value is never NaN, validation refuses it), ints as int32,
    everything else (strings, nullable longs, trails) as Python objects."""
    if kind == "timestamp":
        return pd.array(np.array([_NAT if v is None else v for v in values],
                                 dtype="datetime64[ms]"), dtype=_UTC_MS)
    if kind == "double":
        return np.array(values, dtype="float64")
    if kind == "int":
        return np.array(values, dtype="int32")
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def on_time_watermark(spark_watermark_ms: int, config: AttributionConfig) -> int:
    """Section 8's watermark ``W`` from Spark's. The job gives Spark's watermark a delay longer
    by the allowed lateness ``L``, so that records up to ``L`` behind ``W`` reach the stateful
    function (Spark drops what is behind its own); ``W`` is Spark's plus ``L``.

    :param spark_watermark_ms: Spark's watermark, in epoch milliseconds.
    :param config: the attribution rules' parameters (its allowed lateness counts).
    """
    return spark_watermark_ms + config.allowed_lateness_ms


def spark_timer(wakeup_ms: int, config: AttributionConfig) -> int:
    """The event-time timer (transformWithState's, which fires once Spark's watermark reaches
    it) for a core's wake-up in ``W``'s terms. Spark wants a positive time; before any watermark
    (Spark's is 0 then), 1 fires at the first.

    :param wakeup_ms: the core's wake-up time in ``W``'s terms, in epoch milliseconds.
    :param config: the attribution rules' parameters (its allowed lateness counts).
    """
    return max(1, wakeup_ms - config.allowed_lateness_ms)


def spark_timeout(wakeup_ms: int, config: AttributionConfig) -> int:
    """The event-time timeout (applyInPandasWithState's, which fires once Spark's watermark
    passes it) for a core's wake-up in ``W``'s terms: one below ``spark_timer``.

    :param wakeup_ms: the core's wake-up time in ``W``'s terms, in epoch milliseconds.
    :param config: the attribution rules' parameters (its allowed lateness counts).
    """
    return max(1, spark_timer(wakeup_ms, config) - 1)


# The stateful operators whose Spark row count is not a user count (applyInPandasWithState over
# hash buckets, transformWithState's declared layout) report how many users they hold by change:
# a marker row has every output column null but this one, the change in the number of users its
# key holds. The pipeline sums it into its observed metrics and drops marker rows before the sink.
STATE_USERS_CHANGE = "state_users_change"


def users_change_frame(change: int) -> pd.DataFrame:
    """One marker row (see ``STATE_USERS_CHANGE``) as a frame with the output columns: null
    where a column may be, 0 in the int columns (``sign``, ``revision``), which may not and which
    nobody reads on a marker row (the pipeline drops them before the sink).

    :param change: the change in users held (negative when users leave).
    """
    frame = pd.DataFrame({name: _output_column(kind, (0 if kind == "int" else None,))
                          for name, kind in _OUTPUT_KINDS.items()})
    frame[STATE_USERS_CHANGE] = np.array([change], dtype="int64")
    return frame


def rows_to_frame(rows: Sequence[Attribution]) -> pd.DataFrame:
    """Attribution rows as a pandas frame in the output schema's column order.

    Built column-wise from plain numpy arrays: no per-column ``astype``/``to_datetime``, which
    cost milliseconds per call and this runs once per user per micro-batch. Spark converts the
    columns to the output schema's Arrow types itself.

    :param rows: the attribution rows.
    """
    if not rows:
        return pd.DataFrame({name: _output_column(kind, ())
                             for name, kind in _OUTPUT_KINDS.items()})
    values = list(zip(*rows))  # a row is a tuple in output-schema order
    columns = {name: _output_column(kind, column)
               for (name, kind), column in zip(_OUTPUT_KINDS.items(), values)}
    return pd.DataFrame(columns, copy=False)


# -- Arrow, for batch mode's partition-at-a-time function ------------------------------------
_EVENT_ARGS = ("event_id", "user_id", "event_type", "ts_ms", "url", "referer", "is_goal",
               "impression_id", "source_url", "target_url", "campaign", "value")


def events_from_arrow(batch) -> Iterator[Event]:
    """Events from an Arrow record batch with ``INPUT_COLUMNS`` (one ``to_pylist`` per column).

    :param batch: a ``pyarrow.RecordBatch`` with ``INPUT_COLUMNS``.
    """
    columns = [batch.column(name).to_pylist() for name in _EVENT_ARGS]
    for eid, uid, typ, ts_ms, url, ref, goal, iid, src, tgt, campaign, value in zip(*columns):
        yield Event(eid, uid, typ, ts_ms, url, ref, goal is True, iid, src, tgt, campaign, value)


def output_arrow_schema():
    """The Arrow schema Spark expects for the output struct (UTC timestamps in microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from .types import spark_struct

    return to_arrow_schema(spark_struct(OUTPUT_SCHEMA), timezone="UTC")


def rows_to_arrow(rows: Sequence[Attribution], schema):
    """Attribution rows as one Arrow record batch in ``schema`` (from ``output_arrow_schema``).

    :param rows: the attribution rows.
    :param schema: the ``pyarrow`` schema of the batch (``output_arrow_schema``).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    values = list(zip(*rows)) if rows else [()] * len(_OUTPUT_KINDS)
    arrays = []
    for kind, column, field in zip(_OUTPUT_KINDS.values(), values, schema):
        if kind == "timestamp":
            millis = pa.array(column, type=pa.int64())
            arrays.append(pc.multiply(millis, 1000).cast(field.type))
        else:
            arrays.append(pa.array(column, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def row_to_spark(row: Attribution, users_change_column: bool = False):
    """One attribution as a Spark ``Row`` (timestamps UTC-aware, so no local-zone guessing);
    with ``users_change_column``, followed by a null ``STATE_USERS_CHANGE``.

    :param row: one attribution row.
    :param users_change_column: append a null ``STATE_USERS_CHANGE`` field.
    """
    from pyspark.sql import Row

    record = row.to_record()
    record["goal_ts"] = ms_to_datetime(row.goal_ts)
    if row.impression_ts is not None:
        record["impression_ts"] = ms_to_datetime(row.impression_ts)
    if users_change_column:
        record[STATE_USERS_CHANGE] = None
    return Row(**record)


def users_change_row(change: int):
    """One marker row (see ``STATE_USERS_CHANGE``) as a Spark ``Row``.

    :param change: the change in users held (negative when users leave).
    """
    from pyspark.sql import Row

    return Row(**dict.fromkeys(OUTPUT_FIELDS), **{STATE_USERS_CHANGE: change})
