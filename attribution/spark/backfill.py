"""Backfilling a window of goal dates in a batch output after its input was corrected: which
users the correction can affect, which ``goal_date`` partitions then differ from a full run,
their rows, and the markers that keep readers off a half-replaced output.

A backfill of the UTC dates ``first`` to ``last`` (inclusive) assumes the input was corrected
for events in that window only: every event outside it is the one the output was computed
from. It leaves the output equal to a full batch run over the corrected input, goals after the
window included, and rewrites only the partitions whose rows differ from that run's; every
other partition keeps its files, byte for byte.

**Why goals after the window.** A goal's rows depend on the events at or before it, and on the
earlier goals of its user: goals are attributed in order and consume the impressions they
credit (rule 7). A goal added in February that credits a January impression leaves a March goal
that had credited it organic; a goal removed frees its impression again. Consumption carries
forward in event time without bound, so a correction of the window can change goals of any later
date, but only of the users it touches.

**The users a correction can touch** (``affected_users``) are those with

* an event of the corrected input in the window, its end rounded up to a dedup bucket boundary
  (a removed canonical impression hands its place to a later copy of its bucket, rule 3);
* a row of the output on a date of the window (a goal the correction may have removed);
* a row of the output after the window whose credited impression is before the window's end (an
  impression or visit the correction may have removed lay on its path).

Any other user has no event in the window, before or after the correction (events outside it
are unchanged), unless all of them were removed; then none was a goal, and every goal after the
window credited impressions after it. Such a goal keeps its candidates after the window, and can
only lose candidates before it, which none of the models picked (``last_touch`` the latest,
``first_touch`` the earliest, the others all): goal by goal, its rows and what it consumes stay
the same. Goals before the window see only events before it, so no row before the window
changes either.

**The dates to rewrite** (``plan``): the affected users' goals from the window's first day on are
attributed over the corrected input (their whole history, so consumption is exact) and
compared with their rows in the output; a date on which a row differs, as a multiset, is
rewritten. A rewritten date is recomputed whole from the corrected input: the affected users'
rows plus those of every other user with a goal that day, whose rows come out as they were.
Nothing of a rewritten partition is copied from the output, so a backfill that stopped half way
is completed by running it again. Dates where the comparison finds no difference keep their
files, in the window too.

**A bounded history** (``history_ms``) reads only the events from the window's first instant
minus the history, rounded down to a dedup bucket boundary (rule 3: a logical impression is
never cut in two), and on to the end of the input. The history must be at least the lookback,
so that every candidate of a goal from the window on is read. What is lost: the goals in the
history before the window are attributed without the impressions before the history's start,
and such a goal may credit another impression inside the history than the full run did; a goal
from the window on can then find that impression consumed, or free. Under ``last_touch`` (the
latest candidate) and the models that credit every candidate, such a goal consumes the same
impressions inside the history as in the full run, so their rows stay exact; ``first_touch``
(the earliest candidate) can differ, on the rewritten dates.

**Commit.** ``begin`` writes ``_BACKFILL`` (the window and the dates to rewrite) and removes
``_SUCCESS``; the dates are written with Spark's dynamic partition overwrite; ``finish`` removes
the dates to rewrite that no longer have a goal, writes ``_SUCCESS`` and removes ``_BACKFILL``.
Readers (``attribution.spark.output``) read a batch output only while ``_SUCCESS`` exists, so
they never see it half replaced. A backfill that stopped early leaves ``_BACKFILL`` for the next
run to cover (``check_target``); that run rewrites the dates it recorded as well as those it
finds, since a partition the stopped run was replacing may be missing.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from joins.durations import format_duration_ms, ms_to_iso, parse_duration_ms

from ..config import MS_PER_DAY, AttributionConfig
from ..schema import (
    OUTPUT_DEFAULTS,
    OUTPUT_FIELDS,
    OUTPUT_SCHEMA,
    PARTITION_COLUMN,
    PARTITION_SOURCE,
)
from .layout import is_flat, utc_date
from .output import BACKFILL_MARKER, DELTA_LOG_DIR, SINK_LOG_DIR, SUCCESS_MARKER
from .pipeline import attribution_batch
from .sinks import REPLACE_DATES, DeltaSink
from .sinks.delta import is_delta_table
from .storage import location
from .types import spark_struct

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_EPOCH = dt.date(1970, 1, 1)


class BackfillRefused(ValueError):
    """The output cannot be backfilled as it is; the message says why and what to do."""


@dataclass(frozen=True)
class GoalWindow:
    """The goal dates ``first`` to ``last`` (UTC, inclusive), and how much history before them
    to read (``None``: all of it)."""

    first: dt.date
    last: dt.date
    history_ms: Optional[int] = None

    @property
    def start_ms(self) -> int:
        """The window's first instant, epoch ms."""
        return (self.first - _EPOCH).days * MS_PER_DAY

    @property
    def end_ms(self) -> int:
        """The first instant after the window, epoch ms."""
        return ((self.last - _EPOCH).days + 1) * MS_PER_DAY

    def read_from_ms(self, dedup_window_ms: int) -> Optional[int]:
        """The earliest event time read (``None``: all history): the window's start minus the
        history, rounded down to a dedup bucket boundary.

        :param dedup_window_ms: the dedup window (rule 3), whose buckets are never cut.
        """
        if self.history_ms is None:
            return None
        since = self.start_ms - self.history_ms
        return since - since % dedup_window_ms

    def __str__(self) -> str:
        return f"{self.first.isoformat()} to {self.last.isoformat()}"

    def history_text(self, dedup_window_ms: int) -> str:
        """The history read, for the report: ``all`` or ``<duration> (events from <date>)``.

        :param dedup_window_ms: the dedup window (rule 3), whose buckets are never cut.
        """
        since = self.read_from_ms(dedup_window_ms)
        if since is None:
            return "all events"
        return f"{format_duration_ms(self.history_ms)} (events from {ms_to_iso(since)})"

    def holds(self, day: dt.date) -> bool:
        """True when a goal date is in the window.

        :param day: the UTC goal date.
        """
        return self.first <= day <= self.last

    def reach_end_ms(self, dedup_window_ms: int) -> int:
        """The end of the event times whose users a correction of the window can touch: the
        window's end rounded up to a dedup bucket boundary (a removed canonical impression hands
        its place to a later copy in its bucket, rule 3).

        :param dedup_window_ms: the dedup window (rule 3).
        """
        return -(-self.end_ms // dedup_window_ms) * dedup_window_ms

    def events(self, events: DataFrame, dedup_window_ms: int) -> DataFrame:
        """The valid events a backfill attributes: from ``read_from_ms`` on, to the end of the
        input (goals after the window are attributed too).

        :param events: the valid input events (a ``ts`` timestamp column).
        :param dedup_window_ms: the dedup window (rule 3), whose buckets are never cut.
        """
        since = self.read_from_ms(dedup_window_ms)
        if since is None:
            return events
        return events.filter(F.unix_millis("ts") >= F.lit(since))

    def marker(self, dates: Iterable[dt.date] = ()) -> str:
        """The text of ``_BACKFILL`` (JSON): the window and the goal dates being rewritten;
        ``from_marker`` and ``dates_of_marker`` read them back.

        :param dates: the goal dates the backfill rewrites.
        """
        return json.dumps({"goals_from": self.first.isoformat(),
                           "goals_to": self.last.isoformat(),
                           "dates": sorted(d.isoformat() for d in dates)}) + "\n"

    @classmethod
    def from_marker(cls, text: str) -> "GoalWindow":
        """The window a ``_BACKFILL`` file records.

        :param text: the file's text, as ``marker`` wrote it.
        """
        recorded = json.loads(text)
        return cls(dt.date.fromisoformat(recorded["goals_from"]),
                   dt.date.fromisoformat(recorded["goals_to"]))


def dates_of_marker(text: str) -> list[dt.date]:
    """The goal dates a ``_BACKFILL`` file records as being rewritten (none if it names none).

    :param text: the file's text, as ``GoalWindow.marker`` wrote it.
    """
    return [dt.date.fromisoformat(d) for d in json.loads(text).get("dates", [])]


def _date(text: str, option: str) -> dt.date:
    try:
        if _DATE.match(text):
            return dt.date.fromisoformat(text)
    except ValueError:
        pass
    raise ValueError(f"{option} {text!r} is not a date; write it YYYY-MM-DD (UTC), e.g. "
                     "2024-03-01")


def parse_goal_window(goals_from: Optional[str], goals_to: Optional[str],
                      history: Optional[str], lookback_ms: int) -> Optional[GoalWindow]:
    """The window of ``--goals-from``, ``--goals-to`` and ``--backfill-history`` (``None`` when
    none is given).

    :param goals_from: ``--goals-from``: the window's first UTC date, ``YYYY-MM-DD``.
    :param goals_to: ``--goals-to``: its last UTC date (inclusive).
    :param history: ``--backfill-history``: a duration of history to read before the window;
        ``None`` reads all of it.
    :param lookback_ms: the run's lookback, the shortest history allowed.
    :raises ValueError: one of them alone, a date that is not ``YYYY-MM-DD``, a window that
        ends before it starts, or a history shorter than the lookback; the message names the
        option and the values.
    """
    if goals_from is None and goals_to is None:
        if history is not None:
            raise ValueError("--backfill-history needs a window: --goals-from DATE --goals-to "
                             "DATE")
        return None
    if goals_from is None or goals_to is None:
        given, missing = (("--goals-from", "--goals-to") if goals_to is None
                          else ("--goals-to", "--goals-from"))
        raise ValueError(f"{given} needs {missing} too: a backfill window has both ends "
                         "(inclusive UTC dates)")
    first, last = _date(goals_from, "--goals-from"), _date(goals_to, "--goals-to")
    if last < first:
        raise ValueError(f"the window --goals-from {goals_from} --goals-to {goals_to} is empty: "
                         "it ends before it starts (both dates are inclusive)")
    history_ms = None
    if history is not None:
        history_ms = parse_duration_ms(history, "--backfill-history")
        if history_ms < lookback_ms:
            raise ValueError(
                f"--backfill-history {history} is shorter than --lookback "
                f"({format_duration_ms(lookback_ms)}): goals early in the window would miss "
                "impressions; give at least the lookback, or leave the option out to read all "
                "history")
    return GoalWindow(first, last, history_ms)


def check_target(output: str, window: GoalWindow) -> None:
    """Refuse an ``--output`` a backfill of ``window`` must not write (a path or any Hadoop URI,
    through ``storage``; a URI is checked once Spark runs).

    A backfill may write a new or empty directory, a finished batch output with ``goal_date``
    partitions, or one whose backfill stopped early if ``window`` covers that backfill's.

    :param output: the ``--output`` directory.
    :param window: the goal dates to backfill.
    :raises BackfillRefused: a streaming query's output, flat output (written before
        partitions), an unfinished full batch write, or an unfinished backfill of goal dates
        outside ``window``.
    """
    path = location(output)
    if not path.is_dir():
        return
    if (path / DELTA_LOG_DIR).is_dir():
        # Written by a stream, its micro-batches' commits name their query (Delta's "txn").
        if any('"txn"' in f.read_text() for f in (path / DELTA_LOG_DIR).glob_files("*.json")):
            raise BackfillRefused(
                f"--output {output} is a streaming query's Delta changelog: a backfill would "
                "replace revised rows with a batch run's. Backfill a --mode batch output, or "
                "give another --output")
        return  # a Delta table replaces the window in one commit: never half written
    if (path / SINK_LOG_DIR).is_dir():
        raise BackfillRefused(
            f"--output {output} is a streaming query's output: its {SINK_LOG_DIR} log lists the "
            "files that count, and a batch write's files would not be read. Backfill a "
            "--mode batch output, or give another --output")
    if is_flat(output):
        raise BackfillRefused(
            f"--output {output} holds part files at its top level (written without goal_date "
            "partitions, by an earlier version of the job): run a full --mode batch into it "
            "first, then backfill")
    if (path / SUCCESS_MARKER).is_file():
        return
    marker = path / BACKFILL_MARKER
    if marker.is_file():
        unfinished = GoalWindow.from_marker(marker.read_text())
        if window.first <= unfinished.first and unfinished.last <= window.last:
            return
        raise BackfillRefused(
            f"--output {output} holds an unfinished backfill of the goals {unfinished} (a run "
            f"stopped before it finished): rerun with --goals-from {unfinished.first} "
            f"--goals-to {unfinished.last} (or a window that includes it), or run a full "
            "--mode batch")
    if any(not p.name.startswith((".", "_")) for p in path.iterdir()):
        raise BackfillRefused(
            f"--output {output} holds no finished batch output (no {SUCCESS_MARKER}: a write "
            "stopped before it finished, or files of something else): run a full --mode batch "
            "first, or give another --output")


class _FileSystem:
    """The output's markers and ``goal_date`` partitions, through ``storage`` (local and remote
    outputs alike)."""

    def __init__(self, spark, output: str):
        self.root = location(output)

    def path(self, name: str) -> str:
        return str(self.root / name)

    def write(self, name: str, text: str = "") -> None:
        (self.root / name).write_text(text)

    def read(self, name: str) -> Optional[str]:
        """The text of a file, ``None`` when there is none."""
        file = self.root / name
        return file.read_text() if file.exists() else None

    def delete(self, name: str) -> None:
        (self.root / name).delete()

    def directories(self) -> list[str]:
        return [entry.name for entry in self.root.iterdir() if entry.is_dir()]

    def goal_dates(self) -> dict[dt.date, str]:
        """The ``goal_date`` directories, by date (other directories are not the job's)."""
        prefix, dates = f"{PARTITION_COLUMN}=", {}
        for name in self.directories():
            if name.startswith(prefix):
                try:
                    dates[dt.date.fromisoformat(name[len(prefix):])] = name
                except ValueError:
                    continue
        return dates


def _date_of(ts: str):
    return utc_date(F.col(ts))


def _existing_rows(spark, fs: _FileSystem, window: GoalWindow) -> Optional[DataFrame]:
    """The output's rows of the goal dates from the window's first on (``None``: it has none),
    in the output schema; columns absent from older files take their defaults."""
    paths = [fs.path(name) for day, name in sorted(fs.goal_dates().items())
             if day >= window.first]
    if not paths:
        return None
    schema = spark_struct(OUTPUT_SCHEMA)
    frame = spark.read.schema(schema).option("basePath", str(fs.root)).parquet(*paths)
    columns = []
    for field in schema.fields:
        column = F.col(field.name)
        if OUTPUT_DEFAULTS.get(field.name) is not None:
            column = F.coalesce(column, F.lit(OUTPUT_DEFAULTS[field.name]).cast(field.dataType))
        columns.append(column.alias(field.name))
    return frame.select(*columns)


def _existing_delta_rows(spark, output: str, window: GoalWindow) -> Optional[DataFrame]:
    """``_existing_rows`` of a Delta output: its current version's rows of the goal dates from
    the window's first on (``None``: no table yet), in the output schema."""
    if not is_delta_table(output):
        return None
    frame = (spark.read.format("delta").load(output)
             .filter(F.col(PARTITION_COLUMN) >= F.lit(window.first)))
    # The job wrote the table in the output schema: its columns, by name, as they are.
    return frame.select(*(f.name for f in spark_struct(OUTPUT_SCHEMA).fields))


def affected_users(events: DataFrame, existing: Optional[DataFrame], window: GoalWindow,
                   dedup_window_ms: int) -> DataFrame:
    """The users whose rows a correction of the window's input can change (module docstring),
    one ``user_id`` column, distinct.

    :param events: the corrected input's valid events.
    :param existing: the output's rows from the window's first date on (``None``: none).
    :param window: the goal dates backfilled.
    :param dedup_window_ms: the dedup window (rule 3).
    """
    ts = F.unix_millis("ts")
    users = (events.filter((ts >= F.lit(window.start_ms))
                           & (ts < F.lit(window.reach_end_ms(dedup_window_ms)))
                           & F.col("user_id").isNotNull())
             .select("user_id"))
    if existing is not None:
        in_window = F.unix_millis(PARTITION_SOURCE) < F.lit(window.end_ms)
        credited_before_end = F.unix_millis("impression_ts") < F.lit(window.end_ms)
        users = users.union(existing.filter(in_window | credited_before_end).select("user_id"))
    return users.distinct()


@dataclass(frozen=True)
class Plan:
    """What a backfill rewrites: the goal dates, and the rows it attributed to find them."""

    dates: tuple[dt.date, ...]
    affected_rows: DataFrame  # the affected users' rows from the window on, with goal_date
    window_has_events: bool  # False: nothing to go by, the wrong --events more likely


def plan(spark, events: DataFrame, output: str, window: GoalWindow,
         config: AttributionConfig, delta: bool = False) -> Plan:
    """Find the goal dates a backfill rewrites: those on which an affected user's rows, from
    the window's first date on, differ from the output's; and those an unfinished backfill
    recorded. Reads, writes nothing.

    :param spark: the session.
    :param events: the corrected input's valid events, as ``GoalWindow.events`` bounds them.
    :param output: the ``--output`` directory (local or remote).
    :param window: the goal dates backfilled.
    :param config: the attribution's settings.
    :param delta: ``output`` is a Delta table (else Parquet files).
    :returns: the dates, and the affected users' rows (checkpointed: computed once, and read
        again by ``rows``); no dates and no rows when the input has no event in the window.
    """
    fs = _FileSystem(spark, output)
    ts = F.unix_millis("ts")
    in_window = (ts >= F.lit(window.start_ms)) & (ts < F.lit(window.end_ms))
    # A full scan, not a limit: it also completes any observation the caller put on the input
    # (a limit would stop it part way, and a checkpoint below reports to no observation).
    window_events = events.agg(F.count(F.when(in_window & F.col("user_id").isNotNull(), 1)))
    if not window_events.first()[0]:
        nothing = spark.createDataFrame([], spark_struct(OUTPUT_SCHEMA))
        return Plan((), nothing.withColumn(PARTITION_COLUMN, _date_of(PARTITION_SOURCE)), False)
    existing = (_existing_delta_rows(spark, output, window) if delta
                else _existing_rows(spark, fs, window))
    # Each computed once (checkpoints): the users, to attribute and to compare; their rows, to
    # compare here and to write in ``rows``. The checkpoints also cut the lineage from the
    # output's files, which the write then replaces.
    users = affected_users(events, existing, window, config.dedup_window_ms).localCheckpoint()
    fresh = attribution_batch(events.join(users, "user_id", "left_semi"), config=config)
    fresh = (fresh.filter(F.unix_millis(PARTITION_SOURCE) >= F.lit(window.start_ms))
             .withColumn(PARTITION_COLUMN, _date_of(PARTITION_SOURCE)).localCheckpoint())
    side = fresh.withColumn("_side", F.lit(1))
    if existing is not None:
        before = (existing.join(users, "user_id", "left_semi")
                  .withColumn(PARTITION_COLUMN, _date_of(PARTITION_SOURCE))
                  .withColumn("_side", F.lit(-1)))
        side = side.unionByName(before)
    # A date differs when some row occurs a different number of times before and after.
    key = [*OUTPUT_FIELDS, PARTITION_COLUMN]
    differing = (side.groupBy(*key).agg(F.sum("_side").alias("_net"))
                 .filter(F.col("_net") != 0).select(PARTITION_COLUMN).distinct())
    dates = {r[0] for r in differing.collect()}
    marker = None if delta else fs.read(BACKFILL_MARKER)
    if marker is not None:
        dates.update(dates_of_marker(marker))
    return Plan(tuple(sorted(dates)), fresh, True)


def rows(events: DataFrame, planned: Plan, config: AttributionConfig) -> DataFrame:
    """The rows of the planned dates, as a full run over the corrected input gives them: the
    affected users' (attributed by ``plan``) and those of every other user with a goal on one
    of the dates, with a ``goal_date`` column.

    :param events: the corrected input's valid events, as ``GoalWindow.events`` bounds them.
    :param planned: the plan.
    :param config: the attribution's settings.
    """
    if not planned.dates:
        return planned.affected_rows.where(F.lit(False))
    dates = [F.lit(d) for d in planned.dates]
    mine = planned.affected_rows.filter(F.col(PARTITION_COLUMN).isin(*dates))
    goal_day = F.col("is_goal") & _date_of("ts").isin(*dates) & F.col("user_id").isNotNull()
    # Any user with a goal on a planned date who has no row there among the affected users'.
    others = (events.filter(goal_day).select("user_id")
              .join(mine.select("user_id"), "user_id", "left_anti").distinct())
    theirs = attribution_batch(events.join(others, "user_id", "left_semi"), config=config)
    theirs = (theirs.withColumn(PARTITION_COLUMN, _date_of(PARTITION_SOURCE))
              .filter(F.col(PARTITION_COLUMN).isin(*dates)))
    return mine.unionByName(theirs)


def begin(spark, output: str, window: GoalWindow, dates: Iterable[dt.date]) -> None:
    """Mark ``output`` as being backfilled: ``_BACKFILL`` first, then ``_SUCCESS`` removed.

    :param spark: the session, whose Hadoop file system writes the markers.
    :param output: the ``--output`` directory (local or remote).
    :param window: the goal dates backfilled, recorded in ``_BACKFILL``.
    :param dates: the goal dates to rewrite, recorded in ``_BACKFILL``.
    """
    fs = _FileSystem(spark, output)
    fs.write(BACKFILL_MARKER, window.marker(dates))
    fs.delete(SUCCESS_MARKER)


def finish(spark, output: str, dates: Iterable[dt.date], written: Iterable[dt.date]
           ) -> list[dt.date]:
    """Complete a backfill whose rows have been written: remove the ``goal_date`` partitions of
    the dates to rewrite that the backfill did not write (no goal there any more); then write
    ``_SUCCESS`` and remove ``_BACKFILL``.

    :param spark: the session, whose Hadoop file system lists and deletes.
    :param output: the ``--output`` directory (local or remote).
    :param dates: the goal dates to rewrite.
    :param written: the goal dates the backfill wrote.
    :returns: the dates removed.
    """
    fs = _FileSystem(spark, output)
    written, removed = set(written), []
    for day, name in sorted(fs.goal_dates().items()):
        if day in dates and day not in written:
            fs.delete(name)
            removed.append(day)
    fs.write(SUCCESS_MARKER)
    fs.delete(BACKFILL_MARKER)
    return removed


@dataclass(frozen=True)
class Outcome:
    """What a backfill did: the dates it planned, wrote and removed (none of them when the
    input has no event in the window)."""

    window: GoalWindow
    planned: tuple[dt.date, ...]
    written: tuple[dt.date, ...]
    removed: tuple[dt.date, ...]
    window_has_events: bool = True

    def report(self, dedup_window_ms: int) -> dict:
        """The lines of the job's final report.

        :param dedup_window_ms: the dedup window (for the history read).
        """
        after = sum(d > self.window.last for d in self.written)
        if not self.window_has_events:
            dates = "no event of the window in --events: the output is unchanged"
        elif not self.planned:
            dates = "none differs from a full run over --events: the output is unchanged"
        else:
            dates = (f"{len(self.written)} replaced ({after} after the window), "
                     f"{len(self.removed)} without goals removed")
        return {"backfill": f"goals {self.window}",
                "history read": self.window.history_text(dedup_window_ms),
                "goal dates": dates,
                "dead letter": "not written by a backfill"}


def run(spark, valid: DataFrame, output: str, window: GoalWindow, config: AttributionConfig,
        observation, metrics: list[Column], delta: Optional[DeltaSink] = None) -> Outcome:
    """Backfill ``window`` of ``output`` from the corrected input: plan, mark, write the
    planned dates with Spark's dynamic partition overwrite, finish (module docstring). Into a
    Delta table (``delta``): plan, then replace the planned dates in one commit, which needs
    no markers.

    :param spark: the session.
    :param valid: the corrected input's valid events (all of them: the history bound is
        applied here).
    :param output: the ``--output`` directory, a batch output with ``goal_date`` partitions
        (``check_target``), or new.
    :param window: the goal dates backfilled.
    :param config: the attribution's settings.
    :param observation: a ``pyspark.sql.Observation`` the written rows are observed with.
    :param metrics: the aggregates to observe (``pipeline.output_metrics``).
    :param delta: the sink of a Delta ``output``; ``None``: Parquet files.
    :returns: the dates planned, written and removed.
    """
    events = window.events(valid, config.dedup_window_ms)
    planned = plan(spark, events, output, window, config, delta is not None)
    dates_written = F.collect_set(PARTITION_COLUMN).alias("_dates")
    if not planned.window_has_events:
        # An input without the window more likely is the wrong --events than a correction that
        # removed every event of it: nothing is written or removed, the markers stay as they
        # are. The observation still counts (no rows).
        planned.affected_rows.where(F.lit(False)).observe(observation, *metrics,
                                                          dates_written).collect()
        return Outcome(window, (), (), (), window_has_events=False)
    written = rows(events, planned, config)
    # Each goal date's rows in one task: one file per date, as a full batch run writes them.
    written = written.repartition(PARTITION_COLUMN).observe(observation, *metrics, dates_written)
    if delta is not None:
        # One commit: Delta's replaceWhere deletes the planned dates' rows and adds the new
        # ones atomically, so readers see the window before or after, never half of it.
        if planned.dates:
            delta.write_batch(written, REPLACE_DATES, planned.dates)
        else:  # nothing to replace: no commit, only the observation's count
            written.write.format("noop").mode("overwrite").save()
        dates = tuple(sorted(observation.get["_dates"]))
        return Outcome(window, planned.dates, dates,
                       tuple(d for d in planned.dates if d not in dates))
    begin(spark, output, window, planned.dates)
    (written.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy(PARTITION_COLUMN).parquet(output))
    dates = tuple(sorted(observation.get["_dates"]))
    removed = finish(spark, output, planned.dates, dates)
    return Outcome(window, planned.dates, dates, tuple(removed))
