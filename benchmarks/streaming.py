"""The performance benchmark: attribution throughput, memory and state against Spark's own ceiling.

    python -m benchmarks.streaming                     # 1,000,000 events, 3 interleaved repeats
    spark-submit benchmarks/streaming.py --events 250000 --repeats 1
    python -m benchmarks.streaming --scale             # 250k, 500k and 1M: how cost grows
    python -m benchmarks.streaming --state-growth      # long horizon: state with and without GC
    python -m benchmarks.streaming --join              # the click-through join, every strategy
    python -m benchmarks.streaming --models all        # every attribution model in each run

One dataset per size is generated with the project's generator (Parquet, which Spark decodes far
faster than JSON lines, so the input format does not hide the stateful work), in ``--files``
arrival-ordered files plus a trailing heartbeat. Then, in this one process and on those same
files, it runs:

* (a) ``native``: Spark's own stateful aggregation, a count per user per 10-minute event-time
  window, append mode, with the job's watermark and file batching: the engine ceiling;
* (b) the attribution job streaming with ``available-now``, once per backend;
* (c) the attribution job in batch mode;
* (d) ``core``: the pure-Python core (``attribute_batch``) over the events read with pyarrow.

Every attribution run computes the models of ``--models`` (default ``last_touch``).

Runs are interleaved (each repeat rotates the order) and each runs in a fresh checkpoint
directory; the table quotes medians. Events/s is input records over the wall time of the query,
from its start (planning included) to its end; the Spark session is started once, beforehand.
A background thread samples the resident memory of the Spark JVM, the Python workers and this
driver process from ``/proc`` every ``--sample-interval`` seconds; the peaks are per run (the
JVM never returns its heap, so its peak carries over from earlier runs). State rows and state
store size are read from the last micro-batch's ``stateOperators``. Every run is checked against
the core's answer (goal and attributed counts; native: the counts sum to the input events).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attribution.config import (
    DEFAULT_MODELS,
    DEFAULT_WATERMARK_DELAY,
    AttributionConfig,
    parse_duration_ms,
    parse_models,
    spark_interval,
)

# What each run is, in the table's order. ``native`` is the denominator of every ratio.
NATIVE = "native"
STREAM_BACKENDS = ("applyInPandasWithState", "transformWithState")
BATCH = "batch"
CORE = "core"
RUN_KINDS = (NATIVE, *STREAM_BACKENDS, BATCH, CORE)
RUN_LABELS = {
    NATIVE: "(a) native window count",
    "applyInPandasWithState": "(b) stream applyInPandasWithState",
    "transformWithState": "(b) stream transformWithState",
    BATCH: "(c) batch (mapInArrow)",
    CORE: "(d) pure-Python core",
}
NATIVE_WINDOW = "10 minutes"
DEFAULT_EVENTS = 1_000_000
DEFAULT_FILES = 20
SCALE_FRACTIONS = (0.25, 0.5, 1.0)
# State-growth mode: a short lookback and a horizon many times longer keep the run small while
# the horizon still spans many lookbacks; "no GC" is a lookback no event ever leaves.
GROWTH_LOOKBACK = "2 days"
GROWTH_SPAN = "30 days"
GROWTH_NO_GC_LOOKBACK = "36500 days"
MIB = 1024 * 1024


# -- memory ---------------------------------------------------------------------------------------
_PAGE = os.sysconf("SC_PAGE_SIZE")


_TICKS = os.sysconf("SC_CLK_TCK")


def _process_table() -> dict[int, tuple[int, str, int, float]]:
    """pid -> (parent pid, command name, resident bytes, CPU seconds), for every process in
    /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:  # the process ended while we looked
            continue
        close = data.rfind(b")")
        comm = data[data.find(b"(") + 1:close].decode(errors="replace")
        rest = data[close + 2:].split()
        cpu = (int(rest[11]) + int(rest[12])) / _TICKS  # utime + stime
        table[int(entry.name)] = (int(rest[1]), comm, int(rest[21]) * _PAGE, cpu)
    return table


def _descendants(table: dict, root: int) -> list[int]:
    children = defaultdict(list)
    for pid, (ppid, *_) in table.items():
        children[ppid].append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


@dataclass
class MemoryPeaks:
    """Peak resident memory in bytes over one sampling window."""

    jvm: int = 0
    workers: int = 0   # all Python worker processes together, at one instant
    driver: int = 0    # this Python process
    total: int = 0     # JVM + workers + driver, at one instant
    samples: int = 0
    cpu_seconds: float = 0.0  # CPU time the whole process tree used in the window


class MemorySampler:
    """Samples the RSS of the Spark JVM, its Python workers and this driver in a thread.

    Under ``spark-submit`` the JVM is this process's parent; under plain ``python`` it is a child
    (the py4j gateway). Python workers are the JVM's ``python`` descendants. RSS of forked workers
    counts shared pages once per process, so the worker figure is an upper bound.

    CPU time is summed per process over the same tree: what each process used since the window
    began (or since it started, if it started within the window), up to the last sample that
    saw it. A short-lived worker may lose up to one sampling interval. On a machine shared with
    other work, CPU seconds are steadier than wall time.
    """

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.me = os.getpid()
        self.peaks = MemoryPeaks()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cpu_base: dict[int, float] = {}   # pid -> its CPU seconds when the window began
        self._cpu_last: dict[int, float] = {}   # pid -> its CPU seconds at the latest sample
        self._alive: set[int] = set()

    def __enter__(self) -> "MemorySampler":
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def reset(self) -> MemoryPeaks:
        """Start a new window; return the peaks of the one that ended."""
        self.sample()
        with self._lock:
            peaks, self.peaks = self.peaks, MemoryPeaks()
            peaks.cpu_seconds = sum(cpu - self._cpu_base.get(pid, 0.0)
                                    for pid, cpu in self._cpu_last.items())
            # The next window starts from the live processes only (pids can be reused).
            self._cpu_base = {pid: self._cpu_last[pid] for pid in self._alive}
            self._cpu_last = dict(self._cpu_base)
        return peaks

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        table = _process_table()
        parent = table.get(self.me, (0, "", 0, 0.0))[0]
        root = parent if table.get(parent, (0, ""))[1] == "java" else self.me
        jvm = workers = driver = 0
        cpu = {}
        for pid in _descendants(table, root):
            if pid not in table:
                continue
            _, comm, rss, cpu[pid] = table[pid]
            if pid == self.me:
                driver += rss
            elif comm == "java":
                jvm += rss
            elif comm.startswith("python"):
                workers += rss
        with self._lock:
            p = self.peaks
            p.jvm, p.workers, p.driver = max(p.jvm, jvm), max(p.workers, workers), max(p.driver, driver)
            p.total = max(p.total, jvm + workers + driver)
            p.samples += 1
            # Exited processes keep their last value: the window still counts what they used.
            self._cpu_last.update(cpu)
            self._alive = set(cpu)


# -- streaming progress ---------------------------------------------------------------------------
class ProgressRecorder:
    """Keeps every ``StreamingQueryProgress`` of every query, and tells when queries have ended.

    A listener rather than ``query.recentProgress`` because the attribution job owns its query
    objects (it runs a dead-letter query next to the main one); listener events arrive in order,
    so once a query's termination is seen, all of its progress has been seen too.
    """

    def __init__(self):
        from pyspark.sql.streaming import StreamingQueryListener

        recorder = self

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                recorder._on_started(str(event.runId), event.name)

            def onQueryProgress(self, event):
                recorder._on_progress(json.loads(event.progress.json))

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                recorder._on_terminated(str(event.runId))

        self.listener = _Listener()
        self._cond = threading.Condition()
        self._started: dict[str, Optional[str]] = {}   # run id -> query name
        self._progress: list[dict] = []
        self._terminated: set[str] = set()

    def start_window(self) -> None:
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

    def wait_for(self, name: str, timeout: float = 120.0) -> list[dict]:
        """Wait until every query started since ``start_window`` has ended (at least one named
        ``name``); return the progress of the queries named ``name``."""
        def done() -> bool:
            return (name in self._started.values()
                    and set(self._started) <= self._terminated)

        with self._cond:
            if not self._cond.wait_for(done, timeout):
                print(f"warning: query {name!r} did not report its end within {timeout:.0f}s; "
                      "state metrics may be incomplete", file=sys.stderr)
            runs = {run for run, n in self._started.items() if n == name}
            return [p for p in self._progress if p["runId"] in runs]


def batches_with_data(progress: list[dict]) -> list[dict]:
    """Micro-batches that ran (idle triggers report progress too, without ``addBatch``)."""
    seen, out = set(), []
    for p in sorted(progress, key=lambda p: (p["runId"], p["batchId"])):
        key = (p["runId"], p["batchId"])
        if key not in seen and "addBatch" in (p.get("durationMs") or {}):
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


def state_stats(batches: list[dict]) -> StateStats:
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


# -- one dataset ----------------------------------------------------------------------------------
@dataclass
class Dataset:
    """A generated input and the facts every run is checked against."""

    label: str
    root: Path
    events_dir: Path
    records: int                  # input records, heartbeat included
    files: int                    # event files, heartbeat file included
    final_watermark_ms: int       # the watermark once the heartbeat has been read
    watermark_delay: str
    config: AttributionConfig
    goals: int = 0
    attributed: int = 0
    state: dict = field(default_factory=dict)   # retained events and their encodings (core)


def _events_per_user(base: dict) -> float:
    """Mean records per user for these generator settings, from a small in-memory probe."""
    from generators.dataset import build
    from generators.params import GeneratorParams

    probe = build(GeneratorParams(**{**base, "users": 2_000}))
    return len(probe.events) / 2_000


def make_dataset(root: Path, events: int, files: int, seed: int, label: str,
                 models: tuple = DEFAULT_MODELS, **overrides) -> Dataset:
    """Generate about ``events`` records (Parquet, ``files`` files and a heartbeat) under ``root``;
    its runs attribute with ``models``."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    base = {"seed": seed, "format": "parquet", "files": files, "heartbeat": True,
            "watermark_delay": DEFAULT_WATERMARK_DELAY, **overrides}
    users = max(2, round(events / _events_per_user(base)))
    params = GeneratorParams(**{**base, "users": users})
    started = time.perf_counter()
    result = generate(params, root, truth=False, plot=False, overwrite=True)
    log(f"generated {label}: {result.records:,} records for {users:,} users in "
        f"{len(result.event_files)} files ({time.perf_counter() - started:.1f}s) under {root}")
    heartbeat = result.manifest["heartbeat"]["ts_ms"]
    return Dataset(label=label, root=root, events_dir=result.events_dir, records=result.records,
                   files=len(result.event_files),
                   final_watermark_ms=heartbeat - params.watermark_delay_ms,
                   watermark_delay=params.watermark_delay,
                   config=replace(params.attribution_config(), models=models))


def closed_window_events(dataset: Dataset) -> int:
    """How many events the native count must have emitted: append mode emits a window once the
    final watermark has passed its end, so events in a still-open window are not counted yet."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.spark.files import data_files

    window_ms = parse_duration_ms(NATIVE_WINDOW)
    total = 0
    for f in data_files(dataset.events_dir):
        table = pq.read_table(f, columns=["event_type", "ts"])
        ms = pc.divide(table.column("ts").cast("int64"), 1000)
        end = pc.add(pc.multiply(pc.divide(ms, window_ms), window_ms), window_ms)
        closed = pc.and_(pc.less_equal(end, dataset.final_watermark_ms),
                         pc.not_equal(table.column("event_type"), "heartbeat"))
        total += pc.sum(closed.cast("int64")).as_py() or 0
    return total


def read_events_arrow(events_dir: Path) -> list:
    """The events of a Parquet dataset as core ``Event``s, column-wise through pyarrow.

    The generator's files are valid by construction, so per-record validation (``parse_event``)
    is skipped: this measures the core, not the validator.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.events import Event
    from attribution.spark.files import data_files

    out = []
    for f in data_files(events_dir):
        table = pq.read_table(f)
        ts = pc.divide(table.column("ts").cast("int64"), 1000).to_pylist()
        cols = [table.column(c).to_pylist() for c in
                ("event_id", "user_id", "event_type", "url", "referer", "is_goal",
                 "impression_id", "source_url", "target_url")]
        for eid, uid, typ, t, url, ref, goal, iid, src, tgt in zip(
                cols[0], cols[1], cols[2], ts, *cols[3:]):
            out.append(Event(eid, uid, typ, t, url, ref, goal is True, iid, src, tgt))
    return out


def measure_state_encoding(dataset: Dataset, events: list) -> dict:
    """The core's state once every event is in and every goal attributed, before any GC.

    The core's blob per user is what transformWithState (compact layout) stores, and what
    applyInPandasWithState stores inside its bucket maps (with the user id and wake-up next to
    it); both are measured per retained event, next to the same events' Avro encoding
    (``EVENT_SCHEMA``, schemaless).
    """
    import fastavro

    from attribution.core import WATERMARK_INFINITY, UserAttribution
    from attribution.schema import EVENT_SCHEMA
    from attribution.spark.apply_in_pandas import encode_bucket, state_text
    from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS

    by_user = defaultdict(list)
    for e in events:
        if e.event_type != "heartbeat":
            by_user[e.user_id].append(e)
    by_id = {e.event_id: e for e in events}
    retained = blob_bytes = avro_bytes = users_with_state = 0
    bucket_entries = {}
    buf = io.BytesIO()
    # What the lead-owned core costs per user, one call each (perf_counter, CPU-bound).
    cost = dict.fromkeys(("add", "fire", "to_bytes", "from_bytes"), 0.0)
    clock = time.perf_counter
    for user_id, user_events in by_user.items():
        t0 = clock()
        core = UserAttribution(user_id, dataset.config)
        core.add(user_events)
        t1 = clock()
        core.fire(WATERMARK_INFINITY)  # every goal attributed; nothing collected
        t2 = clock()
        cost["add"] += t1 - t0
        cost["fire"] += t2 - t1
        if core.is_empty:
            continue
        users_with_state += 1
        t0 = clock()
        blob = core.to_bytes()
        t1 = clock()
        UserAttribution.from_bytes(blob, dataset.config)
        cost["to_bytes"] += t1 - t0
        cost["from_bytes"] += clock() - t1
        blob_bytes += len(blob)
        bucket_entries[user_id] = (core.next_wakeup(), blob, "")
        for event_id in [*core.visits, *(i.event_id for i in core.impressions.values())]:
            retained += 1
            buf.seek(0)
            buf.truncate()
            fastavro.schemaless_writer(buf, EVENT_SCHEMA, by_id[event_id].to_record())
            avro_bytes += buf.tell()
    # applyInPandasWithState keeps these blobs in compressed per-bucket maps, stored as base64
    # text: the users are split into as many buckets as the job's default (by crc32 here,
    # xxhash64 in Spark: the sizes differ only by chance).
    buckets: dict = defaultdict(dict)
    for user_id, entry in bucket_entries.items():
        buckets[zlib.crc32(user_id.encode()) % DEFAULT_STATE_BUCKETS][user_id] = entry
    bucket_bytes = sum(len(state_text(encode_bucket(users))) for users in buckets.values())
    return {"users_with_state": users_with_state, "retained_events": retained,
            "blob_bytes": blob_bytes, "avro_bytes": avro_bytes, "bucket_bytes": bucket_bytes,
            "blob_bytes_per_event": blob_bytes / retained if retained else None,
            "bucket_bytes_per_event": bucket_bytes / retained if retained else None,
            "avro_bytes_per_event": avro_bytes / retained if retained else None,
            "users": len(by_user), "core_seconds": cost}


# -- the runs -------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """One timed run."""

    kind: str
    dataset: str
    repeat: int
    records: int
    seconds: float
    memory: MemoryPeaks
    state: StateStats = field(default_factory=StateStats)
    batches: int = 0
    goals: Optional[int] = None
    attributed: Optional[int] = None
    check: str = "n/a"

    @property
    def events_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")


def _write_available_now(rows, scratch: Path, name: str, what: str) -> None:
    """Stream ``rows`` to Parquet under ``scratch`` with ``availableNow``; raise if it failed."""
    q = (rows.writeStream.format("parquet").outputMode("append")
         .option("path", str(scratch / "out"))
         .option("checkpointLocation", str(scratch / "checkpoint"))
         .queryName(name).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{what} failed: {q.exception()}")


class Bench:
    """Runs the benchmark's queries in one Spark session, with memory and progress recorded."""

    def __init__(self, spark, work: Path, args):
        self.spark = spark
        self.work = work
        self.args = args
        self.recorder = ProgressRecorder()
        spark.streams.addListener(self.recorder.listener)
        self.sampler = MemorySampler(args.sample_interval)
        self._runs = 0

    def close(self) -> None:
        self.spark.streams.removeListener(self.recorder.listener)

    def _scratch(self, name: str) -> Path:
        self._runs += 1
        path = self.work / "runs" / f"{self._runs:03d}-{name}"
        path.mkdir(parents=True)
        return path

    def _timed(self, fn: Callable[[], object], query_name: Optional[str] = None) -> tuple:
        """Run ``fn`` with memory sampled and progress recorded; return (result, seconds,
        memory peaks, micro-batches of the streaming query named ``query_name``)."""
        self.recorder.start_window()
        self.sampler.reset()
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
        memory = self.sampler.reset()
        progress = self.recorder.wait_for(query_name) if query_name else []
        return result, seconds, memory, batches_with_data(progress)

    def run(self, kind: str, dataset: Dataset, repeat: int, **job_options) -> RunResult:
        scratch = self._scratch(kind)
        try:
            if kind == NATIVE:
                return self._native(dataset, repeat, scratch)
            if kind == CORE:
                return self._core(dataset, repeat)
            return self._job(kind, dataset, repeat, scratch, **job_options)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # (a)
    def _native(self, dataset: Dataset, repeat: int, scratch: Path) -> RunResult:
        from pyspark.sql import functions as F

        from attribution.spark.pipeline import drop_heartbeats
        from attribution.spark.readers import read_event_stream

        def query():
            events = read_event_stream(self.spark, str(dataset.events_dir), "parquet",
                                       self.args.max_files_per_trigger)
            watermarked = events.withWatermark(
                "ts", spark_interval(parse_duration_ms(dataset.watermark_delay)))
            counts = (drop_heartbeats(watermarked)
                      .groupBy("user_id", F.window("ts", NATIVE_WINDOW)).count())
            _write_available_now(counts, scratch, "benchmark_native", "native aggregation")

        _, seconds, memory, batches = self._timed(query, "benchmark_native")
        counted = self.spark.read.parquet(str(scratch / "out")).agg(F.sum("count")).first()[0]
        expected = closed_window_events(dataset)
        check = "ok" if counted == expected else f"FAIL: counted {counted} of {expected} events"
        return RunResult(NATIVE, dataset.label, repeat, dataset.records, seconds, memory,
                         state_stats(batches), len(batches), check=check)

    # (b) and (c)
    def _job(self, kind: str, dataset: Dataset, repeat: int, scratch: Path,
             lookback: Optional[str] = None) -> RunResult:
        from jobs.attribution_job import parse_args, run

        argv = ["--events", str(dataset.events_dir), "--format", "parquet",
                "--output", str(scratch / "out"), "--checkpoint", str(scratch / "checkpoint"),
                "--watermark-delay", dataset.watermark_delay, "--quiet",
                "--lookback", lookback or f"{dataset.config.lookback_ms} ms",
                "--dedup-window", f"{dataset.config.dedup_window_ms} ms",
                "--models", ",".join(dataset.config.models)]
        if kind == BATCH:
            argv += ["--mode", "batch"]
        else:
            argv += ["--backend", kind, "--max-files-per-trigger",
                     str(self.args.max_files_per_trigger)]
        args = parse_args(argv)
        report, seconds, memory, batches = self._timed(
            lambda: run(self.spark, args), None if kind == BATCH else "attribution")
        check = "ok"
        if lookback is None and dataset.goals and (report.goals, report.attributed) != (
                dataset.goals, dataset.attributed):
            check = (f"FAIL: {report.goals} goals / {report.attributed} attributed, core says "
                     f"{dataset.goals} / {dataset.attributed}")
        elif lookback is not None or not dataset.goals:
            check = "n/a"
        return RunResult(kind, dataset.label, repeat, dataset.records, seconds, memory,
                         state_stats(batches), report.batches, report.goals, report.attributed,
                         check)

    def run_bare(self, dataset: Dataset, backend: str, conf: Optional[dict] = None,
                 **stream_options) -> RunResult:
        """The attribution query alone (no validation, no dead-letter query), for levers:
        ``stream_options`` go to ``attribution_stream``, ``conf`` is set for this run only."""
        from pyspark.sql import functions as F

        from attribution.spark.pipeline import attribution_stream
        from attribution.spark.readers import read_event_stream

        scratch = self._scratch("bare")
        saved = {key: self.spark.conf.get(key, None) for key in (conf or {})}
        cores = self.spark.sparkContext.defaultParallelism
        try:
            for key, value in (conf or {}).items():
                if value.endswith("x"):  # a multiple of the cores, e.g. "2x"
                    value = str(int(value[:-1]) * cores)
                self.spark.conf.set(key, value)

            def query():
                events = read_event_stream(self.spark, str(dataset.events_dir), "parquet",
                                           self.args.max_files_per_trigger)
                rows = attribution_stream(
                    events, watermark_delay_ms=parse_duration_ms(dataset.watermark_delay),
                    config=dataset.config, backend=backend, **stream_options)
                _write_available_now(rows, scratch, "benchmark_bare", "attribution query")

            _, seconds, memory, batches = self._timed(query, "benchmark_bare")
            first_model = F.col("model") == F.lit(dataset.config.models[0])
            counts = self.spark.read.parquet(str(scratch / "out")).filter(first_model).agg(
                F.count_distinct("user_id", "goal_event_id").alias("goals"),
                F.count_distinct(F.when(F.col("impression_id").isNotNull(), F.col("user_id")),
                                 "goal_event_id").alias("attributed")).first()
        finally:
            for key, value in saved.items():
                if value is None:
                    self.spark.conf.unset(key)
                else:
                    self.spark.conf.set(key, value)
            shutil.rmtree(scratch, ignore_errors=True)
        check = "ok" if (counts.goals, counts.attributed) == (dataset.goals, dataset.attributed) \
            else f"FAIL: {counts.goals} / {counts.attributed}"
        return RunResult(backend, dataset.label, 0, dataset.records, seconds, memory,
                         state_stats(batches), len(batches), counts.goals, counts.attributed,
                         check)

    # (d)
    def _core(self, dataset: Dataset, repeat: int) -> RunResult:
        from attribution.oracle import attribute_batch

        def attribute():
            return attribute_batch(read_events_arrow(dataset.events_dir), dataset.config)

        rows, seconds, memory, _ = self._timed(attribute)
        goals, attributed = goal_counts(rows, dataset.config.models[0])
        if not dataset.goals:  # the first core run is the reference for the Spark runs
            dataset.goals, dataset.attributed = goals, attributed
        check = "ok" if (goals, attributed) == (dataset.goals, dataset.attributed) else "FAIL"
        return RunResult(CORE, dataset.label, repeat, dataset.records, seconds, memory,
                         goals=goals, attributed=attributed, check=check)


def goal_counts(rows, model: str) -> tuple[int, int]:
    """Goals, and goals ``model`` credited to an impression, among attribution rows (a model may
    give a goal several rows)."""
    goals = {(r.user_id, r.goal_event_id) for r in rows if r.model == model}
    attributed = {(r.user_id, r.goal_event_id) for r in rows if r.model == model and not r.organic}
    return len(goals), len(attributed)


# -- reports --------------------------------------------------------------------------------------
def interleaved(kinds: list[str], repeats: int) -> list[tuple[int, str]]:
    """Each repeat runs every kind once, the order rotated by one per repeat."""
    order = []
    for r in range(repeats):
        shift = r % len(kinds)
        order += [(r, k) for k in kinds[shift:] + kinds[:shift]]
    return order


@dataclass
class Summary:
    """The median of one kind's repeats, as one table row."""

    kind: str
    runs: int
    seconds: float
    events_per_s: float
    ratio: Optional[float]
    cpu_seconds: float
    cpu_ratio: Optional[float]   # the native run's CPU seconds over this run's
    jvm_mib: float
    workers_mib: float
    driver_mib: float
    total_mib: float
    batches: int
    state_final_rows: Optional[int]
    state_peak_rows: Optional[int]
    state_sst_bytes: Optional[int]
    state_memory_bytes: Optional[int]
    check: str


def summarise(results: list[RunResult], kinds: list[str]) -> list[Summary]:
    by_kind = defaultdict(list)
    for r in results:
        by_kind[r.kind].append(r)
    native = by_kind.get(NATIVE)
    native_rate = statistics.median(r.events_per_s for r in native) if native else None
    native_cpu = statistics.median(r.memory.cpu_seconds for r in native) if native else None
    out = []
    for kind in kinds:
        runs = by_kind.get(kind)
        if not runs:
            continue
        rate = statistics.median(r.events_per_s for r in runs)
        cpu = statistics.median(r.memory.cpu_seconds for r in runs)
        last = runs[-1]
        checks = sorted({r.check for r in runs})
        out.append(Summary(
            kind=kind, runs=len(runs), seconds=statistics.median(r.seconds for r in runs),
            events_per_s=rate, ratio=rate / native_rate if native_rate else None,
            cpu_seconds=cpu, cpu_ratio=native_cpu / cpu if native_cpu and cpu > 0 else None,
            jvm_mib=max(r.memory.jvm for r in runs) / MIB,
            workers_mib=max(r.memory.workers for r in runs) / MIB,
            driver_mib=max(r.memory.driver for r in runs) / MIB,
            total_mib=max(r.memory.total for r in runs) / MIB,
            batches=last.batches, state_final_rows=last.state.final_rows,
            state_peak_rows=last.state.peak_rows, state_sst_bytes=last.state.sst_bytes,
            state_memory_bytes=last.state.memory_bytes,
            check=checks[0] if len(checks) == 1 else "; ".join(checks)))
    return out


def _n(value, fmt: str = ",.0f", none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def render_table(summaries: list[Summary]) -> str:
    header = ("run", "events/s", "x native", "median s", "CPU s", "x native CPU", "JVM MiB", "workers MiB", "driver MiB",
              "total MiB", "batches", "state rows", "peak rows", "state SST", "check")
    rows = [header]
    for s in summaries:
        rows.append((RUN_LABELS.get(s.kind, s.kind), _n(s.events_per_s), _n(s.ratio, ".2f"),
                     _n(s.seconds, ".1f"), _n(s.cpu_seconds, ".1f"), _n(s.cpu_ratio, ".2f"),
                     _n(s.jvm_mib), _n(s.workers_mib), _n(s.driver_mib),
                     _n(s.total_mib), _n(s.batches, "d") if s.kind not in (BATCH, CORE) else "-",
                     _n(s.state_final_rows), _n(s.state_peak_rows),
                     _bytes(s.state_sst_bytes), s.check))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:-1])]
        lines.append("  ".join(cells + [r[-1]]))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _bytes(value: Optional[int]) -> str:
    if value is None:
        return "-"
    if value >= MIB:
        return f"{value / MIB:.1f} MiB"
    return f"{value / 1024:.0f} KiB"


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        total_kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {total_kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    import platform

    import pyspark

    return (f"{os.cpu_count()} cores ({cpu}){mem}, Python {platform.python_version()}, "
            f"PySpark {pyspark.__version__}, Java {java_version()}")


def java_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        first = (out.stderr or out.stdout).splitlines()[0]
        return first.split('"')[1] if '"' in first else first
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


# -- the modes ------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_size(bench: Bench, dataset: Dataset, kinds: list[str], repeats: int) -> list[RunResult]:
    """Every kind ``repeats`` times, interleaved; the core runs first once as the reference."""
    results = []
    plan = interleaved(kinds, repeats)
    if CORE in kinds and plan[0][1] != CORE:
        # Spark runs are checked against the core's answer, so compute it before them.
        plan.remove((next(r for r, k in plan if k == CORE), CORE))
        plan.insert(0, (0, CORE))
    for n, (repeat, kind) in enumerate(plan, 1):
        log(f"[{dataset.label}] run {n}/{len(plan)}: {RUN_LABELS[kind]} (repeat {repeat + 1}) ...")
        result = bench.run(kind, dataset, repeat)
        log(f"[{dataset.label}]   {result.seconds:.1f}s, {result.events_per_s:,.0f} events/s, "
            f"peak RSS {result.memory.total / MIB:,.0f} MiB, check {result.check}")
        results.append(result)
    return results


WARMUP_EVENTS = 5_000


def warm_up(bench: Bench, args) -> None:
    """Run every Spark kind once, untimed, on a small dataset: the first query of a JVM pays for
    class loading and JIT compilation, which would otherwise be charged to whichever kind the
    interleaving happens to put first."""
    dataset = make_dataset(bench.work / "data" / "warmup", min(WARMUP_EVENTS, args.events), 3,
                           args.seed + 1, "warm-up", args.models)
    # The main table warms what it runs; the other modes run the native count and both backends.
    kinds = [k for k in (NATIVE, *STREAM_BACKENDS, BATCH) if args.only_modes or k in args.kinds]
    for kind in kinds:
        log(f"[warm-up] {RUN_LABELS[kind]} ...")
        bench.run(kind, dataset, 0)
    shutil.rmtree(dataset.root, ignore_errors=True)


def main_table(bench: Bench, args, kinds: list[str], events: int, label: str) -> dict:
    dataset = make_dataset(bench.work / "data" / label, events, args.files, args.seed, label,
                           args.models)
    results = run_size(bench, dataset, kinds, args.repeats)
    summaries = summarise(results, kinds)
    encoding = {}
    if args.state_encoding:
        log(f"[{label}] measuring state encoding with the core ...")
        encoding = measure_state_encoding(dataset, read_events_arrow(dataset.events_dir))
    shutil.rmtree(dataset.root, ignore_errors=True)
    return {"label": label, "records": dataset.records, "files": dataset.files,
            "goals": dataset.goals, "attributed": dataset.attributed,
            "summaries": [asdict(s) for s in summaries],
            "runs": [_run_dict(r) for r in results], "state_encoding": encoding,
            "table": render_table(summaries)}


def _run_dict(r: RunResult) -> dict:
    d = asdict(r)
    d["events_per_s"] = r.events_per_s
    return d


def print_main(section: dict, args) -> None:
    print(f"\n== {section['label']}: {section['records']:,} input records (Parquet, "
          f"{section['files']} files incl. heartbeat, maxFilesPerTrigger="
          f"{args.max_files_per_trigger}), models {','.join(args.models)}, median of "
          f"{args.repeats} interleaved run(s) ==")
    print(section["table"])
    print(f"goals {section['goals']:,}, attributed by {args.models[0]} {section['attributed']:,} "
          "(from the core; every Spark run's counts must match: column 'check')")
    enc = section["state_encoding"]
    if enc and enc.get("retained_events"):
        avro = enc["avro_bytes_per_event"]
        line = (f"state bytes per retained event: core blob {enc['blob_bytes_per_event']:.1f} B "
                f"({enc['blob_bytes_per_event'] / avro:.2f}x), in the bucket maps as stored "
                f"(zstd, base64) {enc['bucket_bytes_per_event']:.1f} B "
                f"({enc['bucket_bytes_per_event'] / avro:.2f}x), vs the event's Avro encoding "
                f"{avro:.1f} B; over {enc['retained_events']:,} retained events of "
                f"{enc['users_with_state']:,} users (the state store's SST sizes above are "
                "compressed again by the store)")
        print(line)
        cost, users = enc["core_seconds"], enc["users"]
        print("core cost per user (all of a user's events at once): " + ", ".join(
            f"{name} {seconds / users * 1e6:,.0f} us ({seconds:.1f}s in all)"
            for name, seconds in cost.items()) + f", over {users:,} users")


def scale_mode(bench: Bench, args, kinds: list[str]) -> dict:
    sections = []
    for fraction in SCALE_FRACTIONS:
        events = int(args.events * fraction)
        section = main_table(bench, args, kinds, events, f"scale-{events // 1000}k")
        print_main(section, args)
        sections.append(section)
    print("\n== how cost grows (median seconds per run; linear would be "
          f"{SCALE_FRACTIONS[-1] / SCALE_FRACTIONS[0]:.1f}x from the smallest to the largest) ==")
    header = ["run"] + [f"{s['records']:,} ev" for s in sections] + ["cost ratio"]
    lines = [header]
    growth = {}
    for kind in kinds:
        seconds = []
        for s in sections:
            row = next((x for x in s["summaries"] if x["kind"] == kind), None)
            seconds.append(row["seconds"] if row else None)
        if None in seconds:
            continue
        # Cost per input record grows by this factor times the input ratio; compare like with like.
        ratio = seconds[-1] / seconds[0]
        growth[kind] = {"seconds": seconds, "cost_ratio": ratio}
        lines.append([RUN_LABELS[kind]] + [f"{x:.1f}s" for x in seconds] + [f"{ratio:.2f}x"])
    widths = [max(len(l[i]) for l in lines) for i in range(len(header))]
    for l in lines:
        print("  ".join([l[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(l[1:], widths[1:])]))
    input_ratio = sections[-1]["records"] / sections[0]["records"]
    print(f"(input grew {input_ratio:.2f}x)")
    return {"sections": sections, "growth": growth, "input_ratio": input_ratio}


def state_growth_mode(bench: Bench, args) -> dict:
    """A horizon many lookbacks long; per backend, state rows with GC and without it."""
    lookback_ms = parse_duration_ms(GROWTH_LOOKBACK)
    overrides = {"lookback": GROWTH_LOOKBACK, "span": GROWTH_SPAN, "sessions_per_user": 2.0,
                 "session_gap": "1 day"}
    dataset = make_dataset(bench.work / "data" / "growth", args.growth_events, args.growth_files,
                           args.seed, "state-growth", args.models, **overrides)
    horizon_days = parse_duration_ms(GROWTH_SPAN) / lookback_ms
    print(f"\n== state growth: {dataset.records:,} records, users arriving over {GROWTH_SPAN} "
          f"(about {horizon_days:.0f}x the {GROWTH_LOOKBACK} lookback), {dataset.files} files, "
          "one per micro-batch ==")
    print(f"'no GC' runs with --lookback {GROWTH_NO_GC_LOOKBACK}: nothing ever leaves the "
          "lookback, so nothing is ever collected (the lookback also widens the candidate set; "
          "only the state is compared here)")
    out = {"records": dataset.records, "files": dataset.files, "runs": []}
    for backend in args.growth_backends:
        for gc, lookback in (("GC", None), ("no GC", GROWTH_NO_GC_LOOKBACK)):
            log(f"[state-growth] {backend}, {gc} ...")
            result = bench.run(backend, dataset, 0, lookback=lookback)
            rows, sst = result.state.rows_per_batch, result.state.bytes_per_batch
            print(f"{backend:<24} {gc:<6} {result.seconds:6.1f}s  state rows per batch "
                  f"{_sparkline(rows)}: {plateau_verdict(rows)}")
            print(f"{'':<24} {'':<6} {'':>7}  state SST per batch  "
                  f"[{' '.join(_bytes(b) for b in _sample(sst))}]: {plateau_verdict(sst)}")
            out["runs"].append({"backend": backend, "gc": gc, "seconds": result.seconds,
                                "rows_per_batch": rows, "sst_per_batch": sst,
                                "rows_verdict": plateau_verdict(rows),
                                "sst_verdict": plateau_verdict(sst)})
    print("(applyInPandasWithState keeps one state row per hash bucket of users, so its row count "
          "is capped by the buckets; its state bytes show the growth)")
    shutil.rmtree(dataset.root, ignore_errors=True)
    return out


def plateau_verdict(rows: list[int]) -> str:
    """Compare the state in the last third of the batches (the heartbeat's batch excluded, since
    it moves the watermark past everything) with the middle third."""
    body = rows[:-1] if len(rows) > 3 else rows
    if len(body) < 3:
        return "too few batches to tell"
    third = len(body) // 3
    middle = max(body[third:2 * third])
    last = max(body[2 * third:])
    if middle == 0:
        return "no state"
    growth = last / middle
    if growth <= 1.25:
        return f"plateau (last third {growth:.2f}x the middle third)"
    return f"grows (last third {growth:.2f}x the middle third)"


def _sample(values: list, width: int = 12) -> list:
    """About ``width`` evenly spaced values, the last one always included."""
    if len(values) <= width:
        return list(values)
    step = len(values) / (width - 1)
    return [values[int(i * step)] for i in range(width - 1)] + [values[-1]]


def _sparkline(values: list[int], width: int = 12) -> str:
    if not values:
        return "-"
    return "[" + " ".join(_short(v) for v in _sample(values, width)) + "]"


def _short(v: int) -> str:
    return f"{v / 1000:.0f}k" if v >= 10_000 else str(v)


# Each lever is the bare attribution query (file source -> stateful stage -> Parquet sink, no
# validation and no dead-letter query) with one thing changed from the job's defaults.
LEVERS = (
    ("applyInPandasWithState, 64 buckets (default)", "applyInPandasWithState", {}, {}),
    ("64 buckets keyed by bucket number (uneven over partitions)", "applyInPandasWithState",
     {"bucket_keys": "index"}, {}),
    ("applyInPandasWithState, 256 buckets", "applyInPandasWithState",
     {"state_buckets": 256}, {}),
    ("applyInPandasWithState, one key per user", "applyInPandasWithState",
     {"state_buckets": 0}, {}),
    ("transformWithState, compact state (default)", "transformWithState", {}, {}),
    ("transformWithState, declared list state", "transformWithState",
     {"tws_state": "declared"}, {}),
    ("64 buckets, Arrow batches of 1,000 rows", "applyInPandasWithState", {},
     {"spark.sql.execution.arrow.maxRecordsPerBatch": "1000"}),
    ("64 buckets, Arrow batches of 50,000 rows", "applyInPandasWithState", {},
     {"spark.sql.execution.arrow.maxRecordsPerBatch": "50000"}),
    ("64 buckets, 2x the cores as shuffle partitions", "applyInPandasWithState", {},
     {"spark.sql.shuffle.partitions": "2x"}),
    ("64 buckets, 4x the cores as shuffle partitions", "applyInPandasWithState", {},
     {"spark.sql.shuffle.partitions": "4x"}),
)


def lever_mode(bench: Bench, args) -> dict:
    """Every lever once, interleaved with the job's own run, on one dataset."""
    dataset = make_dataset(bench.work / "data" / "levers", args.lever_events, args.files,
                           args.seed, "levers", args.models)
    reference = bench.run(CORE, dataset, 0)
    print(f"\n== levers: {dataset.records:,} records, {dataset.files} files, one per micro-batch; "
          "the bare attribution query unless noted; one run each ==")
    job = bench.run("applyInPandasWithState", dataset, 0)
    native = bench.run(NATIVE, dataset, 0)
    width = max(len(label) for label, *_ in LEVERS) + 8
    print(f"{'run':<{width}}  {'seconds':>7}  {'CPU s':>6}  {'events/s':>9}  {'x native':>8}  "
          f"{'x native CPU':>12}  check", flush=True)
    results = []

    def report(label: str, r: RunResult) -> None:
        ratio = r.events_per_s / native.events_per_s
        cpu_ratio = (native.memory.cpu_seconds / r.memory.cpu_seconds
                     if r.memory.cpu_seconds > 0 else float("nan"))
        print(f"{label:<{width}}  {r.seconds:7.1f}  {r.memory.cpu_seconds:6.1f}  "
              f"{r.events_per_s:9,.0f}  {ratio:8.2f}  {cpu_ratio:12.2f}  {r.check}", flush=True)
        results.append({"lever": label, **_run_dict(r), "ratio": ratio, "cpu_ratio": cpu_ratio})

    report("(a) native window count", native)
    report("the job (validation + dead-letter query + defaults)", job)
    for label, backend, options, conf in LEVERS:
        log(f"[levers] {label} ...")
        try:
            report(label, bench.run_bare(dataset, backend, conf=conf, **options))
        except Exception as err:  # one broken lever must not lose the others' numbers
            print(f"{label:<{width}}  failed: {str(err).splitlines()[0][:200]}", flush=True)
            results.append({"lever": label, "failed": str(err)})
    shutil.rmtree(dataset.root, ignore_errors=True)
    return {"records": dataset.records, "core_goals": reference.goals, "runs": results}


def join_mode(bench: Bench, args) -> dict:
    """The click-through join (jobs/join_job.py) on the main dataset, once per strategy."""
    try:
        from jobs.join_job import STRATEGY_CHOICES
        from jobs.join_job import parse_args as join_args
        from jobs.join_job import run as join_run
    except ImportError as err:
        print(f"\n== join mode skipped: jobs/join_job.py is not importable ({err}) ==")
        return {"skipped": str(err)}
    dataset = make_dataset(bench.work / "data" / "join", args.join_events, args.files,
                           args.seed, "join")
    print(f"\n== click-through join: {dataset.records:,} records, {dataset.files} files, "
          f"one per micro-batch (native window count as the reference) ==")
    out = {"records": dataset.records, "runs": []}
    native = bench.run(NATIVE, dataset, 0)
    print(f"{'native window count':<24} {native.seconds:6.1f}s  {native.events_per_s:10,.0f} "
          "events/s")
    for strategy in STRATEGY_CHOICES:
        scratch = bench._scratch(f"join-{strategy}")
        argv = ["--events", str(dataset.events_dir), "--format", "parquet", "--quiet",
                "--strategy", strategy, "--watermark-delay", dataset.watermark_delay,
                "--max-files-per-trigger", str(args.max_files_per_trigger),
                "--output", str(scratch / "out"), "--checkpoint", str(scratch / "checkpoint")]
        log(f"[join] {strategy} ...")
        follow, seconds, memory, _ = bench._timed(
            lambda: join_run(bench.spark, join_args(argv)), "click_join")
        rows = [r.total for r in follow.state.rows()]
        rate = dataset.records / seconds
        print(f"{strategy:<24} {seconds:6.1f}s  {rate:10,.0f} events/s ({rate / native.events_per_s:.2f}x "
              f"native)  {follow.output_rows:,} clicks  join state rows {_sparkline(rows)}  "
              f"peak {_n(max(rows) if rows else None)}: {plateau_verdict(rows)}  "
              f"peak RSS {memory.total / MIB:,.0f} MiB")
        out["runs"].append({"strategy": strategy, "seconds": seconds, "events_per_s": rate,
                            "ratio": rate / native.events_per_s, "clicks": follow.output_rows,
                            "state_rows_per_batch": rows, "peak_rss_mib": memory.total / MIB})
        shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(dataset.root, ignore_errors=True)
    return out


# -- command line ---------------------------------------------------------------------------------
DESCRIPTION = __doc__.split("\n\n", 2)[2]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmark.py", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, metavar="N",
                        help="about how many input records to generate (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, metavar="R",
                        help="runs per kind, interleaved; the table quotes medians "
                             "(default: %(default)s)")
    parser.add_argument("--runs", default=",".join(RUN_KINDS), metavar="KINDS",
                        help="comma-separated subset of: " + ", ".join(RUN_KINDS) +
                             " (default: all)")
    parser.add_argument("--files", type=int, default=DEFAULT_FILES, metavar="N",
                        help="event files per dataset, plus one heartbeat file; with "
                             "--max-files-per-trigger 1 each is one micro-batch "
                             "(default: %(default)s)")
    parser.add_argument("--max-files-per-trigger", type=int, default=1, metavar="N",
                        help="files per micro-batch for every streaming run (default: %(default)s)")
    parser.add_argument("--scale", action="store_true",
                        help="run the table at 1/4, 1/2 and all of --events and report how the "
                             "cost grows")
    parser.add_argument("--state-growth", action="store_true",
                        help=f"also run the state-growth mode: users arriving over {GROWTH_SPAN} "
                             f"with a {GROWTH_LOOKBACK} lookback, state rows per batch with and "
                             "without GC")
    parser.add_argument("--growth-events", type=int, default=250_000, metavar="N",
                        help="records of the state-growth dataset (default: %(default)s)")
    parser.add_argument("--growth-files", type=int, default=40, metavar="N",
                        help="files (micro-batches) of the state-growth dataset "
                             "(default: %(default)s)")
    parser.add_argument("--growth-backends", default=",".join(STREAM_BACKENDS), metavar="LIST",
                        help="backends of the state-growth mode (default: %(default)s)")
    parser.add_argument("--join", action="store_true",
                        help="also run the click-through join once per cleanup strategy")
    parser.add_argument("--join-events", type=int, default=None, metavar="N",
                        help="records of the join dataset (default: --events)")
    parser.add_argument("--levers", action="store_true",
                        help="also run each optimisation lever once (the bare attribution query "
                             "with one setting changed) against the job and the native count")
    parser.add_argument("--lever-events", type=int, default=200_000, metavar="N",
                        help="records of the levers dataset (default: %(default)s)")
    parser.add_argument("--only-modes", action="store_true",
                        help="skip the main table; run only --state-growth, --join and/or "
                             "--levers")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help=f"skip the untimed warm-up run of every Spark kind on "
                             f"{WARMUP_EVENTS:,} events (at most --events) before the measured "
                             "runs")
    parser.add_argument("--no-state-encoding", dest="state_encoding", action="store_false",
                        help="skip measuring state bytes per retained event with the core")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), metavar="LIST",
                        help="attribution models of every run, comma-separated, or 'all' "
                             "(default: %(default)s); goal counts are checked on the first")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default: %(default)s)")
    parser.add_argument("--master", default=None,
                        help="Spark master under plain python (default: local[*])")
    parser.add_argument("--shuffle-partitions", type=int, default=None, metavar="N",
                        help="spark.sql.shuffle.partitions (default: the project's runtime "
                             "default, one per core)")
    parser.add_argument("--driver-memory", default="1g",
                        help="spark.driver.memory when this script starts the JVM; in local mode "
                             "it is the heap of the whole engine (default: %(default)s, Spark's "
                             "own default and so what the attribution job runs with)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration, repeatable, e.g. "
                             "spark.sql.execution.arrow.maxRecordsPerBatch=50000")
    parser.add_argument("--work-dir", default=None, metavar="DIR",
                        help="where datasets and checkpoints go (default: a temporary directory, "
                             "removed at the end)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write every run's numbers as JSON to FILE")
    parser.add_argument("--sample-interval", type=float, default=0.2, metavar="SECONDS",
                        help="RSS sampling period (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        args.models = parse_models(args.models)
    except ValueError as err:
        parser.error(f"--models: {err}")
    args.kinds = [k.strip() for k in args.runs.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in RUN_KINDS]
    if unknown:
        parser.error(f"--runs: unknown kind(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(RUN_KINDS)}")
    args.kinds = [k for k in RUN_KINDS if k in args.kinds]  # the table's order
    args.growth_backends = [b.strip() for b in args.growth_backends.split(",") if b.strip()]
    if any(b not in STREAM_BACKENDS for b in args.growth_backends):
        parser.error(f"--growth-backends: choose from {', '.join(STREAM_BACKENDS)}")
    for name in ("events", "repeats", "files", "max_files_per_trigger", "growth_events",
                 "growth_files", "lever_events"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.join_events is None:
        args.join_events = args.events
    try:
        args.conf = dict(c.split("=", 1) for c in args.conf)
    except ValueError:
        parser.error("--conf takes KEY=VALUE")
    if args.only_modes and not (args.state_growth or args.join or args.levers):
        parser.error("--only-modes needs --state-growth, --join and/or --levers")
    return args


def run(spark, args) -> dict:
    """Run everything ``args`` asks for in ``spark``; print the tables; return the numbers."""
    if args.shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    for key, value in args.conf.items():
        spark.conf.set(key, value)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="attr-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(spark, work, args)
    machine = machine_description()
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    print(f"machine: {machine}; Spark master {spark.sparkContext.master}, "
          f"{partitions} shuffle partitions")
    results: dict = {"machine": machine, "master": spark.sparkContext.master,
                     "shuffle_partitions": partitions, "conf": args.conf,
                     "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    try:
        with bench.sampler:
            if args.warmup:
                warm_up(bench, args)
            if not args.only_modes:
                if args.scale:
                    results["scale"] = scale_mode(bench, args, args.kinds)
                else:
                    section = main_table(bench, args, args.kinds, args.events, "main")
                    print_main(section, args)
                    results["main"] = section
            if args.state_growth:
                results["state_growth"] = state_growth_mode(bench, args)
            if args.join:
                results["join"] = join_mode(bench, args)
            if args.levers:
                results["levers"] = lever_mode(bench, args)
    finally:
        bench.close()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    from jobs.runtime import build_spark_session, ship_packages

    spark = build_spark_session("attribution-benchmark", master=args.master,
                                shuffle_partitions=args.shuffle_partitions,
                                extra_conf={"spark.driver.memory": args.driver_memory})
    ship_packages(spark)
    run(spark, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
