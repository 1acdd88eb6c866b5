"""Sustainable throughput: the highest input rate each query keeps up with when fed live.

    make bench-sustainable      # = python -m benchmarks.streaming --only-modes --sustainable
    python -m benchmarks.streaming --only-modes --sustainable --sustainable-kinds native,job \\
        --sustainable-trigger "5 seconds" --sustainable-duration "40 seconds"

Each probe runs one query at one rate R from scratch (an empty input directory, a new
checkpoint):

* The load: ``python -m generators stream`` (``generators.load``), a child process, writes a new
  Parquet file every ``--sustainable-file-interval`` (default 1 s) holding the next R x interval
  events of the generator's endless stream (a pool of ``LOAD_USERS`` users), for
  ``--sustainable-duration`` (default 60 s). Each file is written under a hidden name and renamed
  into place. The child is left out of the CPU and memory samples.
* The query reads the directory as a file stream with a processing-time trigger of
  ``--sustainable-trigger`` (default 10 s), every file present at a trigger in that micro-batch,
  and writes Parquet through Spark's file sink. It starts before the load; one trigger interval
  after the load ends it is stopped as soon as no micro-batch runs (after at most one more
  interval, interrupting the one that does). The kinds (``--sustainable-kinds``):
  ``native``, Spark's count per user per 10-minute window, as in the main table;
  ``passthrough``, the events written out unchanged: the floor of any query on this source;
  ``job``, ``job-per-user`` and ``job-tws``, the attribution job (``jobs/attribution_job.py``:
  validation, dead-letter query, attribution) with its default layout (applyInPandasWithState,
  64 hash buckets of users), with per-user keys (``--state-buckets 0``) and with
  ``--backend transformWithState``.

Definitions. Times are the wall clock of the one machine; a file's time is its modification time
(mtime) on the one local filesystem.

* Measured window: from the first file's arrival plus a quarter of the duration (the first
  quarter absorbs start-up, planning and JIT) to the first file's arrival plus the duration (the
  load's end); the measured micro-batches are those that start in it.
* Backlog after a micro-batch: the input files that had arrived by the end of the micro-batch
  (its trigger time plus its ``triggerExecution``) and that neither it nor an earlier
  micro-batch read, counted in rows and divided by the rows of one file (every file holds as
  many).
* A rate is sustainable when the load reached at least 95 % of it (``LOAD_SHORTFALL``), the
  measured window holds at least 3 micro-batches (``MIN_MEASURED_BATCHES``), the backlog is
  flat (its maximum over the second half of the measured micro-batches exceeds its maximum over
  the first half by less than the files of one trigger interval), and the p99 of the measured
  micro-batches' ``triggerExecution`` is under the trigger interval.
* Bisection: first the lower bound ``--sustainable-min-rate`` (if it is not sustainable, the
  kind has no sustainable rate in range), then the upper bound ``--sustainable-max-rate`` (if it
  is, it is reported, and the true figure may be higher), then the geometric mean of the highest
  sustainable and the lowest unsustainable rate so far, ``--sustainable-probes`` probes in all.
* CPU seconds per million events: the CPU time of the Spark JVM, its Python workers and this
  driver from just before the load starts until the query has stopped, over the input rows the
  query read, times one million.
* End-to-end latency of a goal (a visit with ``is_goal``) whose file arrived in the measured
  window: the commit time of the micro-batch whose output holds the goal's row, minus the
  arrival of the goal's file. Arrival: the file's mtime (set as the generator wrote it, just
  before the rename). Commit: the mtime of that micro-batch's entry in the file sink's log
  (``_spark_metadata/<batch>``, or ``<batch>.compact``), written as the batch commits: from then
  on a reader through the log sees its rows. The log keeps every entry during these runs
  (``spark.sql.streaming.fileSink.log.deletion`` off), so every part file's micro-batch is known.
  The goal's row: for the job, the attribution row of the goal; for ``native``, the count row of
  the goal's user and window; for ``passthrough``, the goal event itself. p50 and p99 are
  nearest-rank percentiles over the goals whose rows were committed before the query stopped;
  the others (held back by the watermark, or in the micro-batch the stop interrupted) are
  counted as pending. A goal waits for the next trigger, for its micro-batch and, in the
  stateful kinds, for the watermark to pass it; the generator's event time runs ahead of the
  wall clock, the faster the higher the rate, so the watermark delay costs less wall time at
  higher rates.

The report gives, per kind, the highest sustainable rate and, at that rate, the CPU seconds per
million events and the latency p50/p99; every probe's figures are in the JSON (``--json``).
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import unquote, urlparse

from attribution.config import DEFAULT_WATERMARK_DELAY, parse_duration_ms, spark_interval
from generators.layout import EVENTS_DIR

from .console import log
from .kinds import JOB_LAYOUT_LABELS, JOB_LAYOUTS, NATIVE, NATIVE_WINDOW
from .listeners import batches_with_data, epoch_s
from .report import align_table, fmt_number
from .runs import JOB_QUERY, Bench, native_counts
from .sampling import MIB

ROOT = Path(__file__).resolve().parents[2]
PASSTHROUGH = "passthrough"
SUSTAINABLE_KINDS = (NATIVE, PASSTHROUGH, *JOB_LAYOUTS)
SUSTAINABLE_LABELS = {
    NATIVE: "native window count",
    PASSTHROUGH: "pass-through (the floor)",
    **JOB_LAYOUT_LABELS,
}
QUERY_NAMES = {NATIVE: "sustainable_native", PASSTHROUGH: "sustainable_passthrough",
               **dict.fromkeys(JOB_LAYOUTS, JOB_QUERY)}
LOAD_USERS = 100_000
LOAD_SHORTFALL = 0.95
MIN_MEASURED_BATCHES = 3
SINK_LOG = "_spark_metadata"


# -- the search -----------------------------------------------------------------------------------
def bisect_rates(low: int, high: int, probes: int,
                 sustainable: Callable[[int], bool]) -> tuple[Optional[int], Optional[int]]:
    """Probe rates (events/s) between ``low`` and ``high`` with ``sustainable``, at most
    ``probes`` times: ``low``, then ``high``, then geometric means of the highest sustainable
    and the lowest unsustainable rate so far. Return (highest sustainable, lowest
    unsustainable), either None when no probe found one.

    :param low: the lowest rate, events/s.
    :param high: the highest rate, events/s.
    :param probes: the most probes.
    :param sustainable: whether a rate is sustainable (runs a probe).
    """
    best = worst = None
    rate = low
    for _ in range(probes):
        if sustainable(rate):
            best = rate
        else:
            worst = rate
        if best is None or best >= high:
            break  # the lower bound fails, or the upper bound holds: nothing between to learn
        rate = high if worst is None else round(math.sqrt(best * worst))
        if rate in (best, worst):
            break  # the bounds are adjacent
    return best, worst


def percentile(values: list, q: float) -> Optional[float]:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ``values``; None when empty.

    :param values: the values.
    :param q: the percentile, 0 < q <= 100.
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# -- one probe ------------------------------------------------------------------------------------
def _busy(queries: list) -> bool:
    return any(q.isActive and q.status["isTriggerActive"] for q in queries)


def _stop_when_idle(queries: list, patience_s: float) -> bool:
    """Stop ``queries`` once none of them is in a micro-batch, waiting at most ``patience_s``
    (a stop interrupts a running micro-batch); return whether they were idle when stopped."""
    deadline = time.monotonic() + patience_s
    while _busy(queries) and time.monotonic() < deadline:
        time.sleep(0.1)
    idle = not _busy(queries)
    for query in queries:
        query.stop()
    return idle


def _start_query(bench: Bench, kind: str, events_dir: Path, out: Path, checkpoint: Path,
                 trigger: str) -> Callable[[float], bool]:
    """Start ``kind``'s query on ``events_dir`` with a processing-time ``trigger``; return the
    function that stops it (see ``_stop_when_idle``), raising if it had failed before."""
    if kind in JOB_LAYOUTS:
        backend, options = JOB_LAYOUTS[kind]
        return _start_job(bench, ["--backend", backend, *options], events_dir, out, checkpoint,
                          trigger)
    from attribution.spark.readers import read_event_stream

    events = read_event_stream(bench.spark, str(events_dir), "parquet")
    rows = native_counts(events, DEFAULT_WATERMARK_DELAY) if kind == NATIVE else events
    query = (rows.writeStream.format("parquet").outputMode("append")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .queryName(QUERY_NAMES[kind]).trigger(processingTime=trigger).start())

    def stop(patience_s: float) -> bool:
        if not query.isActive:  # it ended on its own: it failed
            raise RuntimeError(f"{SUSTAINABLE_LABELS[kind]} failed: {query.exception()}")
        return _stop_when_idle([query], patience_s)
    return stop


def _start_job(bench: Bench, options: list, events_dir: Path, out: Path, checkpoint: Path,
               trigger: str) -> Callable[[float], bool]:
    """The attribution job, run as its command line would (``options`` added), in a thread: it
    blocks until its queries end, which the returned function brings about."""
    from jobs.attribution_job import parse_args, run

    args = parse_args(["--events", str(events_dir), "--format", "parquet", "--output", str(out),
                       "--output-format", "parquet", "--checkpoint", str(checkpoint),
                       "--trigger", trigger, "--quiet",
                       *options])
    failures: list = []

    def job() -> None:
        try:
            run(bench.spark, args)
        except Exception as err:  # raised again in the caller's thread if it came first
            failures.append(err)

    thread = threading.Thread(target=job, name="attribution-job", daemon=True)
    thread.start()

    def stop(patience_s: float) -> bool:
        if not thread.is_alive():  # the job ended on its own: it failed
            raise RuntimeError(f"the attribution job failed: {failures[0] if failures else '?'}")
        # The job's query and its dead-letter query.
        idle = _stop_when_idle(list(bench.spark.streams.active), patience_s)
        thread.join()
        if failures:  # what interrupting a micro-batch made of it, not a failure of its own
            log(f"[sustainable]   stopped in a micro-batch: {str(failures[0]).splitlines()[0]}")
        return idle
    return stop


def _run_load(out: Path, rate: int, duration_s: float, file_interval_s: float,
              seed: int) -> subprocess.Popen:
    """Start the load generator writing ``rate`` events/s into ``out/events``."""
    command = [sys.executable, "-m", "generators", "stream", "--out", str(out),
               "--rate", str(rate), "--duration", str(duration_s),
               "--file-interval", str(file_interval_s), "--format", "parquet",
               "--users", str(LOAD_USERS), "--seed", str(seed), "--quiet"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)


def probe(bench: Bench, kind: str, rate: int, settings: dict) -> dict:
    """Feed ``kind``'s query ``rate`` events/s for ``settings["duration_s"]`` (also
    ``trigger_s``, ``file_interval_s`` and the generator's ``seed``); return its figures (see
    the module docstring), ``sustainable`` among them.

    :param bench: the benchmark's session, scratch space and samplers.
    :param kind: the kind of query to feed.
    :param rate: the input rate, events/s.
    :param settings: the probe's timing and seed (see above).
    """
    scratch = bench.scratch(f"sustain-{kind}-{rate}")
    events_dir, out = scratch / EVENTS_DIR, scratch / "out"
    events_dir.mkdir()
    trigger_s, duration_s = settings["trigger_s"], settings["duration_s"]
    try:
        with bench.session_conf({"spark.sql.streaming.fileSink.log.deletion": "false"}):
            bench.recorder.start_window()
            stop = _start_query(bench, kind, events_dir, out, scratch / "checkpoint",
                                spark_interval(round(trigger_s * 1000)))
            patience_s = 0.0  # on an error, stop at once
            try:
                bench.recorder.wait_started(QUERY_NAMES[kind])
                load = _run_load(scratch, rate, duration_s, settings["file_interval_s"],
                                 settings["seed"])
                with bench.sampler.excluding(load.pid):
                    bench.sampler.reset()
                    code = load.wait()
                # The last files' trigger, then up to one more interval to finish its batch.
                time.sleep(trigger_s)
                patience_s = trigger_s
            finally:
                idle = stop(patience_s)
            memory = bench.sampler.reset()
        if code != 0:
            raise RuntimeError(f"the load generator failed with exit code {code}")
        progress = bench.recorder.wait_for(QUERY_NAMES[kind])
        figures = analyse(kind, rate, settings, events_dir, out, progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures["stopped_in_a_batch"] = not idle
    figures["cpu_seconds"] = memory.cpu_seconds
    figures["cpu_s_per_million"] = (memory.cpu_seconds / figures["input_rows"] * 1e6
                                    if figures["input_rows"] else None)
    figures["peak_rss_mib"] = memory.total / MIB
    return figures


# -- what a probe measured ------------------------------------------------------------------------
def _input_files(events_dir: Path) -> list[tuple[float, int, Path]]:
    """(arrival, rows, path) of every event file, in arrival order."""
    import pyarrow.parquet as pq

    files = [(p.stat().st_mtime, pq.ParquetFile(p).metadata.num_rows, p)
             for p in events_dir.glob("part-*.parquet")]
    return sorted(files)


def _goal_arrivals(files: list, since: float) -> dict:
    """Goal event id -> (arrival, user id, event time in ms), for goals whose first copy
    arrived at ``since`` or later."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    goals: dict = {}
    for arrival, _, path in files:
        table = pq.read_table(path, columns=["event_id", "user_id", "ts", "event_type",
                                             "is_goal"])
        table = table.filter(pc.and_(pc.equal(table.column("event_type"), "visit"),
                                     pc.fill_null(table.column("is_goal"), False)))
        ts_ms = pc.divide(table.column("ts").cast("int64"), 1000).to_pylist()
        for event_id, user_id, ms in zip(table.column("event_id").to_pylist(),
                                         table.column("user_id").to_pylist(), ts_ms):
            goals.setdefault(event_id, (arrival, user_id, ms))
    return {k: v for k, v in goals.items() if v[0] >= since}


def _committed_files(out: Path) -> list[tuple[float, list[Path]]]:
    """(commit time, part files) of every micro-batch in the file sink's log, in order."""
    log_dir = out / SINK_LOG
    entries = sorted((int(p.name.split(".")[0]), p) for p in log_dir.iterdir()
                     if p.name.split(".")[0].isdigit()) if log_dir.is_dir() else []
    seen: set = set()
    batches = []
    for _, entry in entries:
        lines = entry.read_text().splitlines()[1:]  # the first line is the log's version
        paths = {json.loads(line)["path"] for line in lines if line.strip()}
        new = paths - seen  # a compact entry repeats every earlier batch's files
        seen |= paths
        batches.append((entry.stat().st_mtime,
                        [Path(unquote(urlparse(p).path)) for p in sorted(new)]))
    return batches


def _goal_commits(kind: str, out: Path, goals: dict) -> dict:
    """Goal event id -> commit time of the micro-batch that wrote the goal's row."""
    import pyarrow.parquet as pq

    window_ms = parse_duration_ms(NATIVE_WINDOW)
    wanted: dict = {}  # the key of a goal's row in the output -> the goals it stands for
    for goal_id, (_, user_id, ms) in goals.items():
        key = (user_id, ms - ms % window_ms) if kind == NATIVE else goal_id
        wanted.setdefault(key, []).append(goal_id)
    commits = {}
    for committed, paths in _committed_files(out):
        for path in paths:
            if kind == NATIVE:
                table = pq.read_table(path, columns=["user_id", "window"])
                # Microseconds: the session writes Parquet timestamps so (jobs.runtime).
                starts = table.column("window").combine_chunks().field("start")
                keys = zip(table.column("user_id").to_pylist(),
                           (us // 1000 for us in starts.cast("int64").to_pylist()))
            else:
                column = "event_id" if kind == PASSTHROUGH else "goal_event_id"
                keys = pq.read_table(path, columns=[column]).column(column).to_pylist()
            for key in keys:
                for goal_id in wanted.get(key, ()):
                    commits.setdefault(goal_id, committed)
    return commits


def analyse(kind: str, rate: int, settings: dict, events_dir: Path, out: Path,
            progress: list[dict]) -> dict:
    """The figures of one probe of ``kind`` at ``rate``, from its input files, its output's
    sink log and ``progress``, the query's micro-batches; ``settings`` as for ``probe``.

    :param kind: the probed kind.
    :param rate: the probed rate, events/s.
    :param settings: as for ``probe``.
    :param events_dir: the probe's input directory.
    :param out: the query's output directory.
    :param progress: the query's micro-batches' progress.
    """
    trigger_s, duration_s = settings["trigger_s"], settings["duration_s"]
    files = _input_files(events_dir)
    written = sum(rows for _, rows, _ in files)
    rows_per_file = files[0][1] if files else 1
    load_start = files[0][0] if files else 0.0
    window_start, window_end = load_start + duration_s / 4, load_start + duration_s
    batches, read = [], 0
    for p in batches_with_data(progress):
        read += p["numInputRows"]
        started = epoch_s(p["timestamp"])
        seconds = p["durationMs"]["triggerExecution"] / 1000
        arrived = sum(rows for arrival, rows, _ in files if arrival <= started + seconds)
        batches.append({"start_s": started - load_start, "seconds": seconds,
                        "rows": p["numInputRows"],
                        "backlog_files": (arrived - read) / rows_per_file,
                        "measured": window_start <= started < window_end})
    measured = [b for b in batches if b["measured"]]
    reasons = []
    achieved = written / duration_s
    if achieved < LOAD_SHORTFALL * rate:
        reasons.append(f"the load reached only {achieved:,.0f} events/s")
    backlog = [b["backlog_files"] for b in measured]
    growth = p99_batch = None
    if len(measured) < MIN_MEASURED_BATCHES:
        reasons.append(f"{len(measured)} micro-batch(es) in the measured window, fewer than "
                       f"{MIN_MEASURED_BATCHES}")
    else:
        half = len(backlog) // 2
        growth = max(backlog[half:]) - max(backlog[:half])
        if growth >= trigger_s / settings["file_interval_s"]:
            reasons.append(f"the backlog grew by {growth:.0f} files")
        p99_batch = percentile([b["seconds"] for b in measured], 99)
        if p99_batch >= trigger_s:
            reasons.append(f"p99 micro-batch {p99_batch:.1f}s, not under the {trigger_s:g}s "
                           "trigger")
    goals = _goal_arrivals(files, window_start)
    commits = _goal_commits(kind, out, goals)
    latencies = [commits[g] - goals[g][0] for g in commits]
    return {"kind": kind, "rate": rate, "sustainable": not reasons, "reasons": reasons,
            "achieved_rate": achieved, "files": len(files), "input_rows": read,
            "micro_batches": batches, "measured_batches": len(measured),
            "backlog_growth": growth, "p99_batch_s": p99_batch,
            "goals_measured": len(goals), "goals_pending": len(goals) - len(commits),
            "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99)}


# -- the mode -------------------------------------------------------------------------------------
def sustainable_mode(bench: Bench, args) -> dict:
    """Bisect each kind of ``args.sustainable_kinds`` for its highest sustainable rate; print
    the table and return every probe.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
    settings = {"trigger_s": args.sustainable_trigger_ms / 1000,
                "duration_s": args.sustainable_duration_ms / 1000,
                "file_interval_s": args.sustainable_file_interval_ms / 1000, "seed": args.seed}
    print(f"\n== sustainable throughput: processing-time trigger {settings['trigger_s']:g}s, a "
          f"file every {settings['file_interval_s']:g}s for {settings['duration_s']:g}s per "
          f"probe, up to {args.sustainable_probes} probes per run between "
          f"{args.sustainable_min_rate:,} and {args.sustainable_max_rate:,} events/s ==",
          flush=True)
    out = {"settings": settings, "runs": []}
    for kind in args.sustainable_kinds:
        probes: list = []

        def sustainable(rate: int) -> bool:
            log(f"[sustainable] {SUSTAINABLE_LABELS[kind]} at {rate:,} events/s ...")
            figures = probe(bench, kind, rate, settings)
            log(f"[sustainable]   {'sustainable' if figures['sustainable'] else 'not: '}"
                f"{'; '.join(figures['reasons'])}; p99 micro-batch "
                f"{fmt_number(figures['p99_batch_s'], '.1f')}s, backlog "
                f"{[round(b['backlog_files']) for b in figures['micro_batches']]} files")
            probes.append(figures)
            return figures["sustainable"]

        best, worst = bisect_rates(args.sustainable_min_rate, args.sustainable_max_rate,
                                   args.sustainable_probes, sustainable)
        at_best = next((p for p in probes if p["rate"] == best), {})
        out["runs"].append({
            "kind": kind, "label": SUSTAINABLE_LABELS[kind], "sustainable_rate": best,
            "lowest_unsustainable_rate": worst,
            "cpu_s_per_million": at_best.get("cpu_s_per_million"),
            "latency_p50_s": at_best.get("latency_p50_s"),
            "latency_p99_s": at_best.get("latency_p99_s"), "probes": probes})
    out["table"] = render_sustainable(out["runs"], args.sustainable_max_rate)
    print(out["table"], flush=True)
    return out


def render_sustainable(runs: list[dict], max_rate: int) -> str:
    """The mode's table: one line per kind (``runs`` as ``sustainable_mode`` returns them);
    ``max_rate`` is the upper bound of the search.

    :param runs: each kind's probes, as ``sustainable_mode`` returns them.
    :param max_rate: the upper bound of the search, events/s.
    """
    header = ("run", "sustainable events/s", "first unsustainable", "CPU s per M events",
              "latency p50 s", "latency p99 s")
    rows = [header]
    for r in runs:
        best = r["sustainable_rate"]
        rate = ("none in range" if best is None
                else f">= {best:,}" if best >= max_rate else f"{best:,}")
        rows.append((r["label"], rate, fmt_number(r["lowest_unsustainable_rate"]),
                     fmt_number(r["cpu_s_per_million"], ",.1f"),
                     fmt_number(r["latency_p50_s"], ".1f"), fmt_number(r["latency_p99_s"], ".1f")))
    return align_table(rows)
