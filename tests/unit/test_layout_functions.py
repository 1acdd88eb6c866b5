"""The four streaming layouts' Spark-facing functions, driven in-process as Spark drives them,
on generated streams (hypothesis): the breadth of the streaming rules at unit speed, while the
Spark tier proves the wiring.

The layouts: applyInPandasWithState keyed by hash buckets of users (the bucket state function,
the default layout; here all users in one bucket, in two, or spread over 64) or by user
(``--state-buckets 0``, the group state function), and transformWithState's compact (the
default ``--tws-state``) and declared processors. A stream is a generated event set (1 to 4
users; click-through sessions, noise, redelivered copies and conflicting copies of records, the
type included) cut into micro-batches in event-time order, some records straggling into later
ones; micro-batches without data; Spark's watermark for each; with allowed lateness, ad clicks
that arrive after the goal they lead to has fired, late but accepted; and a last micro-batch
whose watermark is past everything, as a heartbeat far ahead brings about. Proven per layout:

* nothing late: the rows are the batch oracle's (``attribute_batch``) over every record, each
  goal and model once, all ``ON_TIME`` revision 0, each in the first micro-batch whose on-time
  watermark ``W[k]`` reaches its goal;
* with late records, allowed lateness and early results: after every micro-batch the rows
  standing are the attribution table of docs/semantics.md, section 8 (the oracle over the
  records accepted so far, for the goals ``W[k]`` has reached, or all with early results), and
  at the end the folded changelog is the oracle over every record Spark accepted (those at or
  behind the previous micro-batch's watermark are dropped); per goal and model, a micro-batch
  retracts exactly the rows standing, then emits the next revision (0, 1, 2, ...); a row's
  ``emit_timing`` is the spec's for a user already in state (one new to the state cannot know
  ``W[k-1]``, so there only ``EARLY`` is checked, and that ``LATE`` is never wrong). The
  declared processor refuses to revise: its streams have records that are late and dropped;
* once the watermark is past everything, no state is left: no key in applyInPandasWithState's
  store (with revisions a bucket keeps only the watermark it saw, and no user), no state entry
  or timer in transformWithState's, and the marker rows of the layouts that count users by
  change sum to zero.

Each property also asserts that the examples exercised what it is about (late records, both
kinds of call, ...), so that it cannot pass on trivial streams. Single cases follow: a user idle
in state that follows the watermark, and a fired goal that a smaller copy turns into a click.

Where the driver stands in for Spark (docs/semantics.md, section 8, and the backends'
docstrings say what it mimics): Spark's watermark ``S[k]`` of micro-batch ``k`` follows the
latest event time of the micro-batches before it less the allowed lateness and a delay, never
goes back, and is 0 before the first; the delay is drawn per step, at times the one that puts
``W`` exactly on a record's time or leaves a record of the next micro-batch within the allowed
lateness behind it. A micro-batch without data runs only when it moves the watermark. Rows at
or behind ``S[k-1]`` are dropped before the stateful function.

* applyInPandasWithState: each key with data is called with its rows, shuffled and cut into
  frames (``spark.sql.execution.arrow.maxRecordsPerBatch``), in PySpark's own Arrow-to-pandas
  conversion, with PySpark's own ``GroupState`` (watermark ``S[k]``, no timeout set: Spark resets
  it at every call). Then, as FlatMapGroupsWithStateExec does after the data, every key whose
  timeout is below ``S[k]`` is called with ``hasTimedOut`` and one empty frame (what PySpark's
  worker passes). The state goes back to the store by the JVM's rule (removed without a timeout:
  gone; else written if updated, removed or re-timed). Returned frames go through PySpark's
  pandas-to-Arrow conversion into the output type, as its worker sends them.
* transformWithState: PySpark's ``TwsTester`` holds the state and the timers, but it sets the
  watermark and fires timers in one call, before any data. The driver therefore calls
  ``handleInputRows`` itself for every key with data (watermark ``S[k]`` in ``TimerValues``, on
  the tester's handle), then fires the timers at ``S[k]`` with ``TwsTester.setWatermark``, as
  Spark processes timers after the data.

Hypothesis runs derandomized, so every run checks the same examples.
"""
from __future__ import annotations

import datetime as dt
import json
import random
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.streaming.stateful_processor import TimerValues
from pyspark.sql.streaming.tws_tester import TwsTester

from attribution import AttributionConfig, Event, attribute_batch
from attribution.config import MODELS
from attribution.events import ms_to_datetime
from attribution.oracle import sort_key
from attribution.revisions import emit_timing
from attribution.rows import Attribution
from attribution.schema import OUTPUT_FIELDS, OUTPUT_SCHEMA
from attribution.spark.apply_in_pandas import (
    BUCKET_COLUMN,
    STATE_DDL,
    bucket_user_count,
    make_bucket_state_function,
    make_group_state_function,
)
from attribution.spark.frames import (
    INPUT_COLUMNS,
    PACKED_COLUMN,
    PACKED_KEYS,
    STATE_USERS_CHANGE,
)
from attribution.spark.transform_with_state import (
    AttributionProcessor,
    CompactAttributionProcessor,
)
from attribution.spark.types import spark_struct
from support.datasets import PAGES, SEARCH_PAGES, conflicting_copy, noise_event
from support.reference import assert_same_rows, folded_rows

# -- generated streams ----------------------------------------------------------------------------

# Event times are a base plus a few dozen milliseconds: far from Spark's first watermark (0), as
# real event times are, and close enough together for small lookbacks, dedup windows and
# lateness to matter.
BASE = 1_000_000_000_000
# The last micro-batch's watermark: past every goal, lookback, dedup bucket and lateness.
FAR = BASE + 10 ** 6
USERS = ("u1", "u2", "u3", "u4")
CAMPAIGNS = (None, None, "spring", "summer")
VALUES = (None, None, 10.0, 2.5, 0.0)
# The job's watermark delay, drawn per step: how far Spark's watermark trails the latest event
# time seen (plus the allowed lateness, which the job adds).
DELAYS = (0, 0, 1, 4)


@dataclass(frozen=True)
class MicroBatch:
    """The records that arrive in one micro-batch and Spark's watermark ``S[k]`` for it."""

    records: tuple[Event, ...]
    watermark: int


@dataclass(frozen=True)
class Stream:
    """A generated stream and how Spark happens to deliver it."""

    config: AttributionConfig
    batches: tuple[MicroBatch, ...]
    buckets: int      # applyInPandasWithState's hash buckets (the bucket layout only)
    frame_rows: int   # the most rows per frame (spark.sql.execution.arrow.maxRecordsPerBatch)
    order_seed: int   # the order of keys, and of each key's rows, in a micro-batch


def _id(draw, used: set) -> str:
    # Random ids, unrelated to time order, so that (ts, event_id) ties break both ways.
    k = draw(st.integers(0, 999).filter(lambda k: k not in used))
    used.add(k)
    return f"e{k:03d}"


@st.composite
def event_sets(draw, config: AttributionConfig) -> list[Event]:
    """Records of 1-4 users: click-through sessions (an ad clicked once or twice, then a chain
    of visits, each referred by the page before, often goals), noise, and copies: redelivered
    ones and conflicting ones (other contents, the type included) within the lookback of the
    record, so that rule 1 resolves them in a stream (docs/semantics.md, section 3)."""
    users = USERS[:draw(st.integers(1, len(USERS)))]
    used: set = set()
    events = []
    for _ in range(draw(st.integers(1, 3))):
        user = draw(st.sampled_from(users))
        ts = BASE + draw(st.integers(1, 30))
        source, page = draw(st.sampled_from(SEARCH_PAGES)), draw(st.sampled_from(PAGES))
        for _ in range(draw(st.integers(1, 2))):
            events.append(Event(_id(draw, used), user, "impression",
                                ts - draw(st.sampled_from((0, 0, 1, 4))),
                                impression_id=draw(st.integers(0, 2)), source_url=source,
                                target_url=page, campaign=draw(st.sampled_from(CAMPAIGNS))))
        referer = source
        for _ in range(draw(st.integers(1, 4))):
            ts += draw(st.integers(1, 3))
            events.append(Event(_id(draw, used), user, "visit", ts, url=page, referer=referer,
                                is_goal=draw(st.integers(0, 2)) == 0,
                                value=draw(st.sampled_from(VALUES))))
            referer, page = page, draw(st.sampled_from(PAGES))
    for _ in range(draw(st.integers(0, 6))):
        user, ts = draw(st.sampled_from(users)), BASE + draw(st.integers(1, 40))
        events.append(noise_event(draw, _id(draw, used), user, ts, CAMPAIGNS, VALUES,
                                  impression_ids=3, goal_one_in=3))
    if not events:
        return events
    copies = draw(st.lists(st.sampled_from(events), max_size=3))
    spread = min(config.lookback_ms, 6)
    copies += [draw(conflicting_copy(e, spread, CAMPAIGNS, VALUES))
               for e in draw(st.lists(st.sampled_from(events), max_size=3))]
    return events + copies


def _add_late_click(draw, batches: list[MicroBatch], config: AttributionConfig,
                    event_id: str) -> None:
    """Add to a micro-batch ``k`` an ad click that leads straight to a goal which has fired
    already (it arrived before ``k`` and ``W[k-1]`` has reached it), in time for its lookback
    and behind ``W[k-1]`` by less than the allowed lateness: late, accepted, and a reason to
    revise the goal's rows."""
    lateness = config.allowed_lateness_ms
    options = []
    for k in range(1, len(batches)):
        low = batches[k - 1].watermark  # S[k-1]: a click after it is accepted
        for j in range(k):
            accepted_after = batches[j - 1].watermark if j else 0
            for goal in batches[j].records:
                earliest = max(low + 1, goal.ts - config.lookback_ms)
                if (goal.is_visit and goal.is_goal and goal.referer is not None
                        and accepted_after < goal.ts <= low + lateness and earliest < goal.ts):
                    options.append((k, goal, earliest))
    if not options:
        return
    k, goal, earliest = draw(st.sampled_from(options))
    click = Event(event_id, goal.user_id, "impression", draw(st.integers(earliest, goal.ts - 1)),
                  impression_id=draw(st.integers(0, 2)), source_url=goal.referer,
                  target_url=goal.url, campaign=draw(st.sampled_from(CAMPAIGNS)))
    batches[k] = MicroBatch((*batches[k].records, click), batches[k].watermark)


@st.composite
def streams(draw, *, nothing_late: bool, revising: bool) -> Stream:
    """A stream (see the module docstring). ``nothing_late``: Spark's watermark is held below
    what is still to come, so that no record is late even for the on-time watermark ``W``
    (``S`` plus the allowed lateness). ``revising``: allowed lateness and early results may be
    drawn (with ``nothing_late``, allowed lateness only: early results revise by design)."""
    lateness = draw(st.sampled_from((5, 12, 0))) if revising else 0
    early = draw(st.booleans()) if revising and not nothing_late else False
    config = AttributionConfig(lookback_ms=draw(st.sampled_from((4, 10, 40))),
                               dedup_window_ms=draw(st.sampled_from((2, 5, 16))),
                               models=draw(st.sampled_from((("last_touch",), MODELS))),
                               half_life_ms=draw(st.sampled_from((3, 20))),
                               allowed_lateness_ms=lateness, early_results=early)
    records = draw(event_sets(config))
    # Arrival: in event-time order, cut into micro-batches; then some records (stragglers)
    # arrive one or more micro-batches after the one they belong to, behind the watermark by
    # less than the allowed lateness or by more.
    in_order = sorted(records, key=lambda e: e.ts)
    n_batches = draw(st.integers(min(2, len(in_order)) or 1, max(1, min(10, len(in_order)))))
    cuts = sorted(draw(st.lists(st.integers(0, len(in_order)), min_size=n_batches - 1,
                                max_size=n_batches - 1)))
    chunks: list[list[Event]] = [[] for _ in range(n_batches)]
    for k, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(in_order)])):
        for e in in_order[a:b]:
            # Ad clicks straggle most often, so that a click can reach the job after its goal.
            lags = (0, 1, 1, 2) if e.event_type == "impression" else (0, 0, 0, 1, 2)
            chunks[min(n_batches - 1, k + draw(st.sampled_from(lags)))].append(e)

    batches: list[MicroBatch] = []
    watermark, seen = 0, None

    def step(arrived: list[Event], arriving_next: list[Event],
             still_to_come: list[Event]) -> int:
        # Spark's rule: the latest event time of earlier micro-batches less the delay (the
        # job's plus the allowed lateness); never back. The delay is drawn per step, and is
        # at times the one that puts the on-time watermark exactly on a record that has arrived
        # (a goal fires at W = its ts), or, with allowed lateness, the one that leaves a record
        # of the next micro-batch behind the watermark by less than the allowed lateness: late,
        # and accepted. Held below what is still to come when nothing may be late: a record is
        # late for W when ts <= S[k-1] + lateness.
        if seen is None:
            return watermark
        moved = seen - lateness - draw(st.sampled_from(DELAYS))
        how = draw(st.sampled_from(("delay", "delay", "exactly", "behind")))
        targets = []
        if how == "exactly":
            targets = [e.ts - lateness for e in arrived]
        elif how == "behind" and lateness and not nothing_late:
            targets = [e.ts - draw(st.integers(1, lateness)) for e in arriving_next
                       if watermark < e.ts <= seen]
        targets = [t for t in targets if watermark < t <= seen - lateness]
        if targets:
            moved = draw(st.sampled_from(targets))
        if nothing_late and still_to_come:
            moved = min(moved, min(e.ts for e in still_to_come) - lateness - 1)
        return max(watermark, moved)

    for k, chunk in enumerate(chunks):
        if draw(st.integers(0, 3)) == 0:
            # A trigger that finds no new data: Spark runs it only if the watermark moves.
            idle = step([e for done in chunks[:k] for e in done], chunk,
                        [e for later in chunks[k:] for e in later])
            if idle > watermark:
                watermark = idle
                batches.append(MicroBatch((), watermark))
        watermark = step([e for done in chunks[:k + 1] for e in done],
                         chunks[k + 1] if k + 1 < len(chunks) else [],
                         [e for later in chunks[k + 1:] for e in later])
        if chunk or watermark > (batches[-1].watermark if batches else 0):
            batches.append(MicroBatch(tuple(chunk), watermark))
        if chunk:
            seen = max([*(e.ts for e in chunk), *([seen] if seen is not None else [])])
    if lateness and not nothing_late:
        for n in range(draw(st.integers(1, 3))):
            _add_late_click(draw, batches, config, f"late{n}")
    batches.append(MicroBatch((), FAR))  # a heartbeat far ahead moved the watermark past all
    return Stream(config, tuple(batches), buckets=draw(st.sampled_from((1, 2, 64))),
                  frame_rows=draw(st.sampled_from((1, 2, 1000))),
                  order_seed=draw(st.integers(0, 2 ** 16)))


# -- what Spark hands over and takes back ---------------------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_OUTPUT_STRUCT = spark_struct(OUTPUT_SCHEMA)
_MARKED_OUTPUT_STRUCT = spark_struct(OUTPUT_SCHEMA).add(
    T.StructField(STATE_USERS_CHANGE, T.LongType()))
# The state column (``STATE_DDL``, written out: parsing DDL needs a JVM) and the columns of
# ``pipeline._packed_input``.
assert STATE_DDL == "state string"
_STATE_STRUCT = T.StructType([T.StructField("state", T.StringType())])
_PACKED_FIELDS = [T.StructField("user_id", T.StringType()), T.StructField("ts", T.TimestampType()),
                  T.StructField(PACKED_COLUMN, T.StringType()),
                  T.StructField("ts_ms", T.LongType()), T.StructField("goal_ms", T.LongType())]


def _ms(value: dt.datetime) -> int:
    return (value - _EPOCH) // dt.timedelta(milliseconds=1)


def _attribution(record: dict) -> Attribution:
    """An output record as Spark holds it (UTC timestamps, a list trail) as a core row."""
    record = dict(record)
    record["goal_ts"] = _ms(record["goal_ts"])
    if record["impression_ts"] is not None:
        record["impression_ts"] = _ms(record["impression_ts"])
    record["trail"] = tuple(record["trail"])
    return Attribution(**record)


def _split_markers(records: Iterable[dict], counts: Counter) -> tuple[list[Attribution], int]:
    """Attribution rows, and the change in users held that the marker rows report."""
    rows, change = [], 0
    for record in records:
        marker = record.pop(STATE_USERS_CHANGE, None)
        if marker is not None:
            change += marker
            counts["marker rows"] += 1
        else:
            rows.append(_attribution(record))
    return rows, change


def _packed_row(e: Event) -> dict:
    """An event as ``pipeline._packed_input`` hands it to applyInPandasWithState: the key, ``ts``,
    the event as Spark's ``to_json`` writes it (one-letter keys, nulls left out), its time and,
    for a goal, its time again."""
    fields = {"event_id": e.event_id, "event_type": e.event_type, "ts_ms": e.ts, "url": e.url,
              "referer": e.referer, "is_goal": e.is_goal if e.is_visit else None,
              "impression_id": e.impression_id, "source_url": e.source_url,
              "target_url": e.target_url, "campaign": e.campaign, "value": e.value}
    packed = json.dumps({key: fields[name] for name, key in PACKED_KEYS.items()
                         if fields[name] is not None}, separators=(",", ":"))
    return {"user_id": e.user_id, "ts": ms_to_datetime(e.ts), PACKED_COLUMN: packed,
            "ts_ms": e.ts, "goal_ms": e.ts if e.is_visit and e.is_goal else None}


def _input_row(e: Event) -> Row:
    """An event as ``pipeline._stateful_input`` hands it to transformWithState."""
    values = {**e._asdict(), "ts": ms_to_datetime(e.ts), "ts_ms": e.ts,
              "is_goal": e.is_goal if e.is_visit else None}
    return Row(**{c: values[c] for c in INPUT_COLUMNS})


# -- Spark's side of each layout ---------------------------------------------------------------

class ApplyInPandasWithState:
    """One applyInPandasWithState operator with an event-time timeout: its state store and the
    calls Spark makes per micro-batch (see the module docstring).

    :param function: the stateful function.
    :param key_of: the grouping key of a user.
    :param bucketed: the input has ``BUCKET_COLUMN`` and the output ``STATE_USERS_CHANGE``.
    """

    def __init__(self, function: Callable, key_of: Callable[[str], tuple], bucketed: bool):
        self.function, self.key_of = function, key_of
        fields = [*_PACKED_FIELDS, *([T.StructField(BUCKET_COLUMN, T.LongType())]
                                     if bucketed else [])]
        self.input_schema = to_arrow_schema(T.StructType(fields), timezone="UTC")
        self.columns = [f.name for f in fields]
        self.output_struct = _MARKED_OUTPUT_STRUCT if bucketed else _OUTPUT_STRUCT
        self.bucketed = bucketed
        # key -> (state row or None, timeout timestamp or NO_TIMESTAMP), as the JVM keeps it.
        self.store: dict[tuple, tuple[Optional[tuple], int]] = {}

    def micro_batch(self, records: list[Event], watermark: int, rng: random.Random,
                    frame_rows: int, counts: Counter) -> tuple[list[Attribution], int]:
        by_key: dict[tuple, list[dict]] = defaultdict(list)
        for e in records:
            row = _packed_row(e)
            key = self.key_of(e.user_id)
            if self.bucketed:
                row[BUCKET_COLUMN] = key[0]
            by_key[key].append(row)
        rows, change = [], 0
        keys = list(by_key)
        rng.shuffle(keys)
        for key in keys:
            mine = by_key[key]
            rng.shuffle(mine)
            frames = [self._frame(mine[k:k + frame_rows]) for k in range(0, len(mine), frame_rows)]
            counts["keys given several frames"] += len(frames) > 1
            counts["buckets of several users"] += len({r["user_id"] for r in mine}) > 1
            out, moved = self._call(key, frames, watermark, timed_out=False, counts=counts)
            counts["rows from data calls"] += len(out)
            rows += out
            change += moved
        # After the data, every key whose timeout is below the watermark, with no rows.
        for key in [k for k, (_, timeout) in self.store.items()
                    if timeout != GroupState.NO_TIMESTAMP and timeout < watermark]:
            empty = pd.DataFrame(columns=self.columns)
            out, moved = self._call(key, [empty], watermark, timed_out=True, counts=counts)
            counts["rows from timeouts"] += len(out)
            rows += out
            change += moved
        return rows, change

    def _frame(self, rows: list[dict]) -> pd.DataFrame:
        batch = pa.RecordBatch.from_pylist(rows, schema=self.input_schema)
        return pd.concat(ArrowBatchTransformer.to_pandas(batch, timezone="UTC"), axis=1)

    def _call(self, key: tuple, frames: list[pd.DataFrame], watermark: int, timed_out: bool,
              counts: Counter) -> tuple[list[Attribution], int]:
        value, old_timeout = self.store.get(key, (None, GroupState.NO_TIMESTAMP))
        state = GroupState(optionalValue=value, batchProcessingTimeMs=0,
                           eventTimeWatermarkMs=watermark,
                           timeoutConf=GroupStateTimeout.EventTimeTimeout,
                           hasTimedOut=timed_out, watermarkPresent=True,
                           defined=value is not None, updated=False, removed=False,
                           timeoutTimestamp=GroupState.NO_TIMESTAMP, keyAsUnsafe=b"",
                           valueSchema=_STATE_STRUCT)
        records = []
        for frame in self.function(key, iter(frames), state):
            # PySpark's worker refuses a frame of the wrong width, then converts it.
            assert isinstance(frame, pd.DataFrame)
            assert len(frame.columns) == len(self.output_struct.fields), list(frame.columns)
            records += PandasToArrowConversion.convert(
                frame, self.output_struct, timezone="UTC", safecheck=True, arrow_cast=True,
                assign_cols_by_name=True).to_pylist()
        # What the JVM does with the state the worker sends back.
        sent = json.loads(state.json())
        timeout = sent["timeoutTimestamp"]
        if sent["removed"] and timeout == GroupState.NO_TIMESTAMP:
            if key in self.store:
                counts["keys removed"] += 1
            self.store.pop(key, None)
        elif sent["updated"] or sent["removed"] or timeout != old_timeout:
            self.store[key] = (state.getOption if sent["defined"] else None, timeout)
        return _split_markers(records, counts)

    def holds(self) -> set:
        """The keys with anything in state."""
        return set(self.store)


class TransformWithState:
    """One transformWithState operator in event-time mode around ``processor`` (see the module
    docstring): PySpark's ``TwsTester`` holds the state and timers.

    :param processor: the stateful processor.
    :param marked: the output has ``STATE_USERS_CHANGE``.
    """

    def __init__(self, processor, marked: bool):
        self.processor = processor
        self.tester = TwsTester(processor, timeMode="EventTime",
                                eventTimeExtractor=lambda row: row.ts_ms)
        self.fields = [*OUTPUT_FIELDS, *([STATE_USERS_CHANGE] if marked else [])]
        self.fired_at = 0   # the watermark timers last fired at (the tester's)
        self.users: set = set()
        self.key_of = lambda user_id: user_id

    def micro_batch(self, records: list[Event], watermark: int, rng: random.Random,
                    frame_rows: int, counts: Counter) -> tuple[list[Attribution], int]:
        handle = self.tester.handle
        handle.setWatermark(watermark)  # the watermark a timer registered now is judged by
        by_key: dict[str, list[Row]] = defaultdict(list)
        for e in records:
            by_key[e.user_id].append(_input_row(e))
        self.users.update(by_key)
        out = []
        keys = list(by_key)
        rng.shuffle(keys)
        for key in keys:
            rng.shuffle(by_key[key])
            handle.setGroupingKey(key)
            emitted = list(self.processor.handleInputRows((key,), iter(by_key[key]),
                                                          TimerValues(0, watermark)))
            counts["rows from data calls"] += len(emitted)
            out += emitted
        if watermark > self.fired_at:  # after the data: every timer at or below the watermark
            fired = self.tester.setWatermark(watermark)
            self.fired_at = watermark
            counts["rows from timers"] += len(fired)
            out += fired
        records_out = []
        for row in out:
            record = row.asDict()
            assert list(record) == self.fields, list(record)
            records_out.append(record)
        return _split_markers(records_out, counts)

    def holds(self) -> set:
        """The users with a state entry or a timer."""
        handle, held = self.tester.handle, set()
        for user in self.users:
            if any(self.tester.peekValueState(name, user) is not None
                   for name in handle.value_states) or any(
                    self.tester.peekListState(name, user) for name in handle.list_states):
                held.add(user)
            handle.setGroupingKey(user)
            if list(handle.listTimers()):
                held.add(user)
        return held


def _bucket_of(buckets: int) -> Callable[[str], tuple]:
    return lambda user_id: (zlib.crc32(user_id.encode()) % buckets,)


LAYOUTS = {
    "buckets": lambda s: ApplyInPandasWithState(make_bucket_state_function(s.config),
                                                _bucket_of(s.buckets), bucketed=True),
    "per-user": lambda s: ApplyInPandasWithState(make_group_state_function(s.config),
                                                 lambda user_id: (user_id,), bucketed=False),
    "compact": lambda s: TransformWithState(CompactAttributionProcessor(s.config), marked=False),
    "declared": lambda s: TransformWithState(AttributionProcessor(s.config), marked=True),
}
REVISING_LAYOUTS = ("buckets", "per-user", "compact")  # the declared layout refuses to revise


@dataclass
class Run:
    """What a stream gave: the rows of each micro-batch, the records Spark accepted in each,
    the keys in state before each, the net change in users the marker rows report, the
    operator, and what happened how often."""

    emitted: list[list[Attribution]]
    accepted: list[list[Event]]
    held_before: list[set]
    users_change: int
    operator: object
    counts: Counter


def drive(layout: str, stream: Stream) -> Run:
    """Run ``stream`` through ``layout``'s function as Spark would (the module docstring)."""
    operator = LAYOUTS[layout](stream)
    rng = random.Random(stream.order_seed)
    counts: Counter = Counter()
    emitted, accepted, held_before, users_change, previous = [], [], [], 0, 0
    lateness = stream.config.allowed_lateness_ms
    for k, batch in enumerate(stream.batches):
        # Spark drops what is at or behind the previous micro-batch's watermark.
        kept = [e for e in batch.records if e.ts > previous]
        counts["records dropped"] += len(batch.records) - len(kept)
        counts["late records accepted"] += sum(e.ts <= previous + lateness for e in kept)
        counts["micro-batches without data"] += not batch.records and k + 1 < len(stream.batches)
        accepted.append(kept)
        held_before.append(operator.holds())
        rows, change = operator.micro_batch(kept, batch.watermark, rng, stream.frame_rows, counts)
        emitted.append(rows)
        users_change += change
        previous = batch.watermark
    return Run(emitted, accepted, held_before, users_change, operator, counts)


def on_time_watermarks(stream: Stream) -> list[int]:
    """``W[k]``: Spark's watermark plus the allowed lateness (``frames.on_time_watermark``)."""
    return [b.watermark + stream.config.allowed_lateness_ms for b in stream.batches]


# -- the properties ------------------------------------------------------------------------------

SETTINGS = settings(max_examples=50, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(data=st.data())
def _rows_equal_the_batch_result(layout: str, seen: Counter, data) -> None:
    stream = data.draw(streams(nothing_late=True, revising=layout in REVISING_LAYOUTS),
                       label="stream")
    run = drive(layout, stream)
    assert run.counts["records dropped"] == 0 and run.counts["late records accepted"] == 0, \
        "the stream must make nothing late"
    rows = [r for batch in run.emitted for r in batch]
    assert all((r.sign, r.revision, r.emit_timing) == (1, 0, "ON_TIME") for r in rows), \
        "nothing late: no revision, no retraction"
    everything = [e for batch in run.accepted for e in batch]
    assert sorted(rows, key=sort_key) == attribute_batch(everything, stream.config), \
        "the rows are not the batch oracle's"
    watermarks = on_time_watermarks(stream)
    for k, batch in enumerate(run.emitted):
        for r in batch:
            assert r.goal_ts <= watermarks[k] and (k == 0 or r.goal_ts > watermarks[k - 1]), \
                f"goal {r.goal_event_id} emitted in micro-batch {k}, not when W first reached it"
    seen.update(run.counts)
    seen["rows"] += len(rows)


def _assert_changelog_of_the_table(run: Run, stream: Stream, seen: Counter) -> None:
    """Micro-batch by micro-batch, per goal and model: a retraction of exactly the rows
    standing (if any), then the rows of the next revision (if any), so revisions count 0, 1,
    2, ...; a row's ``emit_timing`` is the spec's (``revisions.emit_timing`` of ``W[k-1]`` and
    ``W[k]``) when its key was in state before the micro-batch, else at least ``EARLY`` exactly
    when its goal is ahead of ``W[k]``, and never a wrong ``LATE``. After each micro-batch the
    rows standing are the attribution table of docs/semantics.md, section 8: the oracle over
    the records accepted so far, for the goals ``W[k]`` has reached (every goal with early
    results)."""
    watermarks = on_time_watermarks(stream)
    standing: dict[tuple, Counter] = {}
    revision: dict[tuple, int] = {}
    accepted: list[Event] = []
    for k, rows in enumerate(run.emitted):
        by_goal: dict[tuple, list[Attribution]] = defaultdict(list)
        for r in rows:
            by_goal[(r.user_id, r.goal_event_id, r.model)].append(r)
            if r.sign == 1:  # a retraction repeats the timing its row was emitted with
                if run.operator.key_of(r.user_id) in run.held_before[k]:
                    assert r.emit_timing == emit_timing(
                        r.goal_ts, watermarks[k - 1] if k else None, watermarks[k]), r
                else:
                    # Spark tells a stateful function only W[k]: a key new to the state does
                    # not know W[k-1], and may call a goal behind it ON_TIME.
                    assert (r.emit_timing == "EARLY") == (r.goal_ts > watermarks[k]), r
                    assert r.emit_timing != "LATE" or (k and r.goal_ts <= watermarks[k - 1]), r
        for goal, entries in by_goal.items():
            retracted = [r for r in entries if r.sign == -1]
            added = [r for r in entries if r.sign == 1]
            assert entries == retracted + added, f"{goal} in micro-batch {k}: {entries}"
            held = standing.get(goal, Counter())
            if retracted:
                assert Counter(r._replace(sign=1) for r in retracted) == held, \
                    f"{goal} in micro-batch {k}: the retractions are not the rows standing"
            else:
                assert not held, f"{goal} in micro-batch {k}: emitted again without a retraction"
            if added:
                expected = revision.get(goal, -1) + 1
                assert {r.revision for r in added} == {expected}, \
                    f"{goal} in micro-batch {k}: revision {[r.revision for r in added]}, " \
                    f"not {expected}"
                revision[goal] = expected
            standing[goal] = Counter(added)
            seen["retractions"] += len(retracted)
            seen["EARLY rows"] += sum(r.emit_timing == "EARLY" for r in added)
            seen["LATE revisions"] += sum(r.emit_timing == "LATE" and r.revision > 0
                                          for r in added)
        accepted += run.accepted[k]
        table = [r for r in attribute_batch(accepted, stream.config)
                 if stream.config.early_results or r.goal_ts <= watermarks[k]]
        rows_standing = [r._replace(revision=0, emit_timing="ON_TIME")
                         for held in standing.values() for r in held.elements()]
        assert_same_rows(sorted(rows_standing, key=sort_key), table,
                         f"the rows standing after micro-batch {k} and the attribution table")


@SETTINGS
@given(data=st.data())
def _changelog_folds_to_the_oracle(layout: str, seen: Counter, data) -> None:
    stream = data.draw(streams(nothing_late=False, revising=layout in REVISING_LAYOUTS),
                       label="stream")
    run = drive(layout, stream)
    _assert_changelog_of_the_table(run, stream, seen)
    changelog = [r for batch in run.emitted for r in batch]
    everything = [e for batch in run.accepted for e in batch]
    assert_same_rows(folded_rows(changelog) if changelog else [],
                     attribute_batch(everything, stream.config),
                     "the folded changelog and the oracle over the accepted records")
    seen.update(run.counts)


def assert_no_state_left(layout: str, run: Run, config: AttributionConfig) -> None:
    """Nothing in state (with revisions a bucket keeps the watermark it saw, by which it judges
    lateness, and no user), and the marker rows sum to no user held."""
    held = run.operator.holds()
    if layout == "buckets" and config.revising:
        store = run.operator.store
        assert all(store[key][0] is not None and bucket_user_count(store[key][0][0]) == 0
                   for key in held), {k: store[k] for k in held}
    else:
        assert not held, f"state left after the watermark passed everything: {held}"
    assert run.users_change == 0, "the marker rows do not sum to the users held: none"


@SETTINGS
@given(data=st.data())
def _state_is_empty_at_the_end(layout: str, seen: Counter, data) -> None:
    stream = data.draw(streams(nothing_late=False, revising=layout in REVISING_LAYOUTS),
                       label="stream")
    run = drive(layout, stream)
    assert_no_state_left(layout, run, stream.config)
    seen.update(run.counts)
    seen["keys held before the last micro-batch"] += len(run.held_before[-1])


def _assert_exercised(seen: Counter, situations: Iterable[str]) -> None:
    unexercised = [s for s in situations if seen[s] == 0]
    assert not unexercised, f"the generated streams never exercised: {unexercised} ({seen})"


def _call_kinds(layout: str) -> tuple[str, ...]:
    """The counts that show both kinds of call: with data, and by a timeout or timer."""
    if layout in ("buckets", "per-user"):
        return ("rows from data calls", "rows from timeouts", "keys given several frames",
                *(("buckets of several users",) if layout == "buckets" else ()))
    return ("rows from data calls", "rows from timers")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_with_nothing_late_the_rows_are_the_batch_result_each_goal_once_when_due(layout):
    """Nothing late: the rows are the batch oracle's, each goal and model once, ON_TIME, in
    the micro-batch whose watermark first reaches the goal."""
    seen: Counter = Counter()
    _rows_equal_the_batch_result(layout, seen)
    _assert_exercised(seen, ("rows", "micro-batches without data", *_call_kinds(layout)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_with_late_records_the_changelog_folds_to_the_oracle_over_the_accepted_ones(layout):
    """Late records (dropped, or accepted within the allowed lateness) and early results: the
    changelog is consistent, each micro-batch leaves the spec's attribution table standing,
    and it folds to the oracle over the records Spark accepted."""
    seen: Counter = Counter()
    _changelog_folds_to_the_oracle(layout, seen)
    revised = ("late records accepted", "retractions", "EARLY rows", "LATE revisions")
    _assert_exercised(seen, ("records dropped", *_call_kinds(layout),
                             *(revised if layout in REVISING_LAYOUTS else ())))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_once_the_watermark_has_passed_everything_no_state_is_left(layout):
    """Once the watermark is past everything, the layout's state holds no user and no timer."""
    seen: Counter = Counter()
    _state_is_empty_at_the_end(layout, seen)
    _assert_exercised(seen, ("keys held before the last micro-batch", "records dropped",
                             *(("keys removed",) if layout == "per-user" else ()),
                             *(("marker rows",) if layout in ("buckets", "declared") else ())))


# -- single cases ---------------------------------------------------------------------------------

def _stream(config: AttributionConfig, *batches: tuple[tuple[Event, ...], int]) -> Stream:
    return Stream(config, (*(MicroBatch(records, watermark) for records, watermark in batches),
                           MicroBatch((), FAR)), buckets=1, frame_rows=1000, order_seed=0)


@pytest.mark.parametrize("layout", REVISING_LAYOUTS)
def test_a_user_in_state_follows_the_watermark_so_its_late_goal_is_late(layout):
    """A user idle in state still learns each move of the watermark: its goal arriving behind
    ``W[k-1]`` (within the allowed lateness) is ``LATE``."""
    config = AttributionConfig(lookback_ms=40, dedup_window_ms=5, allowed_lateness_ms=5)
    visit = Event("v", "u1", "visit", BASE + 1, url="/a", referer="s1")
    goal = Event("g", "u1", "visit", BASE, url="/b", referer="/x", is_goal=True)
    # W: 5, then BASE + 1 (Spark's watermark, BASE - 4, trails the visit by the lateness),
    # and the goal arrives behind it.
    stream = _stream(config, ((visit,), 0), ((), BASE - 4), ((goal,), BASE - 4))
    run = drive(layout, stream)
    assert [[(r.goal_event_id, r.sign, r.revision, r.emit_timing) for r in rows]
            for rows in run.emitted] == [[], [], [("g", 1, 0, "LATE")], []]


@pytest.mark.parametrize("layout", REVISING_LAYOUTS)
def test_a_fired_goal_that_a_smaller_copy_turns_into_a_click_is_retracted(layout):
    """Rule 1 with revisions: a goal fired and still revisable, then a smaller copy of its
    record that is an impression arrives, late but accepted: the goal's rows are retracted and
    nothing replaces them; no state is left."""
    config = AttributionConfig(lookback_ms=4, dedup_window_ms=2, allowed_lateness_ms=3)
    goal = Event("e1", "u1", "visit", BASE + 2, url="a", referer="s1", is_goal=True)
    click = Event("e1", "u1", "impression", BASE + 2, impression_id=0, source_url="s1",
                  target_url="a")
    stream = _stream(config, ((goal,), 0), ((), BASE - 1), ((click,), BASE - 1))
    run = drive(layout, stream)
    assert [[(r.goal_event_id, r.sign, r.revision) for r in rows] for rows in run.emitted] == [
        [], [("e1", 1, 0)], [("e1", -1, 0)], []]
    assert_no_state_left(layout, run, config)
