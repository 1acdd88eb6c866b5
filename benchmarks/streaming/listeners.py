"""Spark progress, recorded: every micro-batch's ``StreamingQueryProgress`` of the benchmark's
queries, and the state figures read from them."""
from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from attribution.spark.query_progress import micro_batch_ran

from .sampling import cpu_between


class _JsonListener:
    """Spark's listener interface for Python (``PythonStreamingQueryListener``), reading each
    event in one or two calls: the progress as its JSON, a query's start or end as its run id.

    PySpark's own ``StreamingQueryListener`` converts a progress event field by field, and its
    observed metrics through a class py4j looks up by name in each import, which fails through
    every jar on the class path first: in a benchmark run of the attribution job, a seventh of
    the driver JVM's CPU samples, on the cores the measured query runs on.
    """

    def __init__(self, recorder: "ProgressRecorder"):
        self.recorder = recorder

    def onQueryStarted(self, event) -> None:
        self.recorder._on_started(event.runId().toString(), event.name())

    def onQueryProgress(self, event) -> None:
        self.recorder._on_progress(json.loads(event.progress().json()))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.recorder._on_terminated(event.runId().toString())

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class ProgressRecorder:
    """Keeps every ``StreamingQueryProgress`` of every query of a session, and tells when
    queries have ended; ``add_to`` a session first, ``remove_from`` it at the end.

    A listener rather than ``query.recentProgress`` because the attribution job owns its query
    objects; listener events arrive in order, so once a query's termination is seen, all of its
    progress has been seen too.
    """

    def __init__(self):
        """A recorder not yet listening to any session."""
        self._cond = threading.Condition()
        self._started: dict[str, Optional[str]] = {}   # run id -> query name
        self._progress: list[dict] = []
        self._terminated: set[str] = set()
        self._jlistener = None

    def add_to(self, spark) -> None:
        """Record the progress of ``spark``'s streaming queries from now on.

        :param spark: a classic ``SparkSession`` (the listener is registered in its JVM).
        """
        from pyspark.java_gateway import ensure_callback_server_started

        gateway = spark.sparkContext._gateway
        ensure_callback_server_started(gateway)
        self._jlistener = gateway.jvm.org.apache.spark.sql.streaming \
            .PythonStreamingQueryListenerWrapper(_JsonListener(self))
        spark._jsparkSession.streams().addListener(self._jlistener)

    def remove_from(self, spark) -> None:
        """Stop recording ``spark``'s queries (the session ``add_to`` was given).

        :param spark: the session.
        """
        if self._jlistener is not None:
            spark._jsparkSession.streams().removeListener(self._jlistener)
            self._jlistener = None

    def start_window(self) -> None:
        """Forget what was recorded: record from now on only."""
        with self._cond:
            self._started, self._progress, self._terminated = {}, [], set()

    def _on_started(self, run_id: str, name: Optional[str]) -> None:
        with self._cond:
            self._started[run_id] = name
            self._cond.notify_all()

    def _on_progress(self, progress: dict) -> None:
        with self._cond:
            self._progress.append(progress)

    def _on_terminated(self, run_id: str) -> None:
        with self._cond:
            self._terminated.add(run_id)
            self._cond.notify_all()

    def wait_started(self, name: str, timeout: float = 120.0) -> None:
        """Wait until a query named ``name`` has started since ``start_window``, for at most
        ``timeout`` seconds; raise if none did.

        :param name: the query's name.
        :param timeout: the most seconds to wait.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: name in self._started.values(), timeout):
                raise RuntimeError(f"query {name!r} did not start within {timeout:.0f}s")

    def wait_for(self, name: str, timeout: float = 120.0) -> list[dict]:
        """Wait until every query started since ``start_window`` has ended (at least one named
        ``name``), for at most ``timeout`` seconds; return the progress of the queries named
        ``name``.

        :param name: the query's name.
        :param timeout: the most seconds to wait.
        """
        def done() -> bool:
            return (name in self._started.values()
                    and set(self._started) <= self._terminated)

        with self._cond:
            if not self._cond.wait_for(done, timeout):
                print(f"warning: query {name!r} did not report its end within {timeout:.0f}s; "
                      "state metrics may be incomplete", file=sys.stderr)
            runs = {run for run, n in self._started.items() if n == name}
            return [p for p in self._progress if p["runId"] in runs]

    def others(self, name: str) -> list[dict]:
        """The progress recorded since ``start_window`` of the queries not named ``name`` (e.g.
        the job's dead-letter query beside its main one); call after ``wait_for``.

        :param name: the name of the query to leave out.
        """
        with self._cond:
            runs = {run for run, n in self._started.items() if n != name}
            return [p for p in self._progress if p["runId"] in runs]


def batches_with_data(progress: list[dict]) -> list[dict]:
    """The updates of micro-batches that ran (``micro_batch_ran``), each once.

    :param progress: progress updates, as JSON dicts.
    """
    seen, out = set(), []
    for p in sorted(progress, key=lambda p: (p["runId"], p["batchId"])):
        key = (p["runId"], p["batchId"])
        if key not in seen and micro_batch_ran(p):
            seen.add(key)
            out.append(p)
    return out


@dataclass
class StateStats:
    """State of a streaming run, from ``stateOperators`` of its micro-batches."""

    final_rows: Optional[int] = None
    peak_rows: Optional[int] = None
    memory_bytes: Optional[int] = None    # RocksDB's memory use, as the operator reports it
    sst_bytes: Optional[int] = None       # RocksDB SST files: the state's size on disk
    rows_per_batch: list = field(default_factory=list)
    bytes_per_batch: list = field(default_factory=list)
    durations_per_batch: list = field(default_factory=list)  # Spark's durationMs, for the JSON


def epoch_s(timestamp: str) -> float:
    """Seconds since the epoch of a progress report's ISO-8601 ``timestamp``.

    :param timestamp: the report's ``timestamp`` field.
    """
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _span(p: dict) -> tuple[float, float]:
    """(start, end) in epoch seconds of the micro-batch whose progress is ``p``."""
    start = epoch_s(p["timestamp"])
    return start, start + p["durationMs"]["triggerExecution"] / 1000


def _event_time_s(p: dict) -> Optional[float]:
    """Seconds of event time the input of the micro-batch whose progress is ``p`` spans."""
    times = p.get("eventTime") or {}
    if "min" not in times or "max" not in times:
        return None
    return epoch_s(times["max"]) - epoch_s(times["min"])


def micro_batch_figures(batches: list[dict], cpu_timeline: Optional[list] = None,
                        others: list[dict] = ()) -> list[dict]:
    """Per micro-batch of ``batches`` (the progress of micro-batches that ran, in order): its
    input rows, its wall time (``triggerExecution``, seconds), the CPU seconds the sampled
    processes used meanwhile (from ``cpu_timeline``, ``MemoryPeaks.cpu_timeline``; None
    without it), whether a micro-batch of another query (``others``, progress of micro-batches
    that ran) overlapped it, the event time its input spans (seconds from its earliest event
    to its latest, as Spark reports them for a query with a watermark; None otherwise), and,
    summed over the stateful operators, the state rows and the state store's size on disk
    (RocksDB SST files, bytes) at its end.

    :param batches: the progress of the micro-batches that ran, in order.
    :param cpu_timeline: the sampled CPU seconds over time, or ``None``.
    :param others: the progress of other queries' micro-batches that ran.
    """
    busy = [_span(p) for p in others]
    out = []
    for p in batches:
        ops = p.get("stateOperators") or []
        start, end = _span(p)
        out.append({
            "batch": p["batchId"], "input_rows": p["numInputRows"], "seconds": end - start,
            "cpu_seconds": cpu_between(cpu_timeline or [], start, end),
            "overlapped": any(s < end and start < e for s, e in busy),
            "event_time_s": _event_time_s(p),
            "state_rows": sum(op.get("numRowsTotal", 0) for op in ops),
            "sst_bytes": sum((op.get("customMetrics") or {}).get("rocksdbSstFileSize", 0)
                             for op in ops)})
    return out


def state_stats(batches: list[dict]) -> StateStats:
    """The state figures of ``batches``, the progress of micro-batches that ran, in order.

    :param batches: the progress of the micro-batches that ran, in order.
    """
    stats = StateStats()
    for p in batches:
        stats.durations_per_batch.append(p.get("durationMs"))
        ops = p.get("stateOperators") or []
        if not ops:
            continue
        rows = sum(op.get("numRowsTotal", 0) for op in ops)
        sst = sum((op.get("customMetrics") or {}).get("rocksdbSstFileSize", 0) for op in ops)
        stats.rows_per_batch.append(rows)
        stats.bytes_per_batch.append(sst)
        stats.final_rows = rows
        stats.peak_rows = max(rows, stats.peak_rows or 0)
        stats.memory_bytes = sum(op.get("memoryUsedBytes", 0) for op in ops)
        stats.sst_bytes = sst
    return stats

