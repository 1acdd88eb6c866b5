"""Conversions between Spark's data (pandas frames, Rows) and the core's events and rows.

The stateful operators receive ``ts_ms`` (epoch milliseconds, computed by Spark with
``unix_millis``) next to ``ts``, so no Python-side timestamp or time-zone conversion happens on
the way in. On the way out, timestamps are built as UTC-aware values.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Iterable, Iterator, Sequence

import pandas as pd

from ..core import Attribution
from ..events import Event, ms_to_datetime
from ..schema import OUTPUT_FIELDS, OUTPUT_SCHEMA, pandas_dtypes

# The columns the stateful operators read, in this order (``ts`` stays for Spark's watermark).
INPUT_COLUMNS = ("event_id", "user_id", "event_type", "ts", "ts_ms", "url", "referer", "is_goal",
                 "impression_id", "source_url", "target_url")
_OUTPUT_DTYPES = pandas_dtypes(OUTPUT_SCHEMA)


def _long_or_none(value) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def _make_events(ids, users, types, ts, urls, referers, goals, impression_ids, sources, targets
                 ) -> Iterator[Event]:
    for eid, uid, typ, t, url, ref, goal, iid, src, tgt in zip(
            ids, users, types, ts, urls, referers, goals, impression_ids, sources, targets):
        yield Event(eid, uid, typ, int(t), url, ref, goal is True, _long_or_none(iid), src, tgt)


def events_from_frame(df: pd.DataFrame) -> Iterator[Event]:
    """Events from a pandas frame with ``INPUT_COLUMNS`` (column-wise, no per-row pandas work)."""
    return _make_events(*(df[c].tolist() for c in ("event_id", "user_id", "event_type", "ts_ms",
                                                   "url", "referer", "is_goal", "impression_id",
                                                   "source_url", "target_url")))


def events_from_rows(rows: Iterable) -> Iterator[Event]:
    """Events from Spark ``Row``s with ``INPUT_COLUMNS``."""
    for r in rows:
        yield Event(r.event_id, r.user_id, r.event_type, int(r.ts_ms), r.url, r.referer,
                    r.is_goal is True, r.impression_id, r.source_url, r.target_url)


def rows_to_frame(rows: Sequence[Attribution]) -> pd.DataFrame:
    """Attribution rows as a pandas frame with the output schema's dtypes."""
    columns = {name: [getattr(r, name) for r in rows] for name in OUTPUT_FIELDS}
    columns["trail"] = [list(t) for t in columns["trail"]]
    frame = pd.DataFrame(columns)
    for name in ("goal_ts", "impression_ts"):
        frame[name] = pd.to_datetime(frame[name], unit="ms", utc=True)
    return frame.astype({k: v for k, v in _OUTPUT_DTYPES.items()
                         if k not in ("goal_ts", "impression_ts")})


def empty_output_frame() -> pd.DataFrame:
    return rows_to_frame([])


def row_to_spark(row: Attribution):
    """One attribution as a Spark ``Row`` (timestamps UTC-aware, so no local-zone guessing)."""
    from pyspark.sql import Row

    record = row.to_record()
    record["goal_ts"] = ms_to_datetime(row.goal_ts)
    if row.impression_ts is not None:
        record["impression_ts"] = ms_to_datetime(row.impression_ts)
    return Row(**record)
