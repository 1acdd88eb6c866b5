"""Backfilling a window of goal dates in a batch output: which events to read, which rows to
keep, which partitions to replace, and the markers that keep readers off a half-replaced output.

A backfill attributes the goals of the UTC dates ``first`` to ``last`` (inclusive) and replaces
only their ``goal_date`` partitions, with Spark's dynamic partition overwrite: every other
partition keeps its files, byte for byte.

**What is read.** A goal's rows depend on events at or before it only (every rule looks back in
event time from the goal), but on all of them: goals are attributed in order and consume the
impressions they credit (rule 7), so a goal's candidates depend on every earlier goal of its
user. By default a backfill therefore reads every event before the end of the window's last day,
and its rows are those of a full batch run.

**A bounded history** (``history_ms``) reads only the events from the window's first instant
minus the history, rounded down to a dedup bucket boundary (rule 3: a logical impression is
never cut in two). The history must be at least the lookback, so that every candidate of a goal
in the window is read. What is lost: the goals in the history before the window are attributed
without the impressions before the history's start, and such a goal may credit another
impression inside the history than the full run did; a goal in the window can then find that
impression consumed, or free. Under ``last_touch`` (the latest candidate) and the models that
credit every candidate, such a goal consumes the same impressions inside the history as in the
full run, so their rows stay exact; ``first_touch`` (the earliest candidate) can differ.

**Commit.** ``begin`` writes ``_BACKFILL`` (the window) and removes ``_SUCCESS``; ``finish``
removes the window's dates that no longer have a goal, writes ``_SUCCESS`` and removes
``_BACKFILL``. Readers (``attribution.spark.output``) read a batch output only while
``_SUCCESS`` exists, so they never see the window half replaced; a backfill that stopped
early leaves ``_BACKFILL`` for the next run to cover (``check_target``).
"""
from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.durations import format_duration_ms, ms_to_iso, parse_duration_ms

from ..config import MS_PER_DAY
from ..schema import PARTITION_COLUMN, PARTITION_SOURCE
from .layout import is_flat
from .output import BACKFILL_MARKER, SINK_LOG_DIR, SUCCESS_MARKER

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
            return "all events before the window's end"
        return f"{format_duration_ms(self.history_ms)} (events from {ms_to_iso(since)})"

    def holds(self, day: dt.date) -> bool:
        """True when a goal date is in the window.

        :param day: the UTC goal date.
        """
        return self.first <= day <= self.last

    def events(self, events: DataFrame, dedup_window_ms: int) -> DataFrame:
        """The valid events a backfill attributes: before the window's end, and from
        ``read_from_ms`` on.

        :param events: the valid input events (a ``ts`` timestamp column).
        :param dedup_window_ms: the dedup window (rule 3), whose buckets are never cut.
        """
        ts = F.unix_millis("ts")
        kept = ts < F.lit(self.end_ms)
        since = self.read_from_ms(dedup_window_ms)
        if since is not None:
            kept &= ts >= F.lit(since)
        return events.filter(kept)

    def rows(self, rows: DataFrame) -> DataFrame:
        """The output rows of the window's goals.

        :param rows: attribution rows (a ``goal_ts`` column).
        """
        goal_ms = F.unix_millis(PARTITION_SOURCE)
        return rows.filter((goal_ms >= F.lit(self.start_ms)) & (goal_ms < F.lit(self.end_ms)))

    def marker(self) -> str:
        """The window as the text of ``_BACKFILL`` (JSON); ``from_marker`` reads it back."""
        return json.dumps({"goals_from": self.first.isoformat(),
                           "goals_to": self.last.isoformat()}) + "\n"

    @classmethod
    def from_marker(cls, text: str) -> "GoalWindow":
        """The window a ``_BACKFILL`` file records.

        :param text: the file's text, as ``marker`` wrote it.
        """
        recorded = json.loads(text)
        return cls(dt.date.fromisoformat(recorded["goals_from"]),
                   dt.date.fromisoformat(recorded["goals_to"]))


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
    """Refuse an ``--output`` a backfill of ``window`` must not write (local paths; a remote
    one is not checked).

    A backfill may write a new or empty directory, a finished batch output with ``goal_date``
    partitions, or one whose backfill stopped early if ``window`` covers that backfill's.

    :param output: the ``--output`` directory.
    :param window: the goal dates to backfill.
    :raises BackfillRefused: a streaming query's output, flat output (written before
        partitions), an unfinished full batch write, or an unfinished backfill of goal dates
        outside ``window``.
    """
    path = Path(output)
    if "://" in output or not path.is_dir():
        return
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
    """The few Hadoop file system calls the markers need, for local and remote outputs alike."""

    def __init__(self, spark, output: str):
        self.jvm = spark._jvm
        self.root = self.jvm.org.apache.hadoop.fs.Path(output)
        self.fs = self.root.getFileSystem(spark._jsc.hadoopConfiguration())

    def path(self, name: str):
        return self.jvm.org.apache.hadoop.fs.Path(self.root, name)

    def write(self, name: str, text: str = "") -> None:
        stream = self.fs.create(self.path(name), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def delete(self, name: str) -> None:
        self.fs.delete(self.path(name), True)

    def directories(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        return [s.getPath().getName() for s in self.fs.listStatus(self.root) if s.isDirectory()]


def begin(spark, output: str, window: GoalWindow) -> None:
    """Mark ``output`` as being backfilled: ``_BACKFILL`` first, then ``_SUCCESS`` removed.

    :param spark: the session, whose Hadoop file system writes the markers.
    :param output: the ``--output`` directory (local or remote).
    :param window: the goal dates being backfilled, recorded in ``_BACKFILL``.
    """
    fs = _FileSystem(spark, output)
    fs.write(BACKFILL_MARKER, window.marker())
    fs.delete(SUCCESS_MARKER)


def finish(spark, output: str, window: GoalWindow, written: Iterable[dt.date]) -> list[dt.date]:
    """Complete a backfill whose rows have been written: remove the ``goal_date`` partitions of
    the window that the backfill did not write (no goal there any more), unless it wrote none at
    all; then write ``_SUCCESS`` and remove ``_BACKFILL``.

    :param spark: the session, whose Hadoop file system lists and deletes.
    :param output: the ``--output`` directory (local or remote).
    :param window: the goal dates backfilled.
    :param written: the goal dates the backfill wrote.
    :returns: the dates removed.
    """
    fs = _FileSystem(spark, output)
    written = set(written)
    removed = []
    if written:
        prefix = f"{PARTITION_COLUMN}="
        for name in fs.directories():
            if not name.startswith(prefix):
                continue
            try:
                day = dt.date.fromisoformat(name[len(prefix):])
            except ValueError:  # not a directory the job wrote
                continue
            if window.holds(day) and day not in written:
                fs.delete(name)
                removed.append(day)
    fs.write(SUCCESS_MARKER)
    fs.delete(BACKFILL_MARKER)
    return sorted(removed)
