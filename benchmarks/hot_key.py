"""Benchmark of one hot key: a single user with 1,000,000 events and 100,000 goals.

Reports the wall time and peak memory of attributing them, through the engine-free core and,
with ``--spark``, through the Spark job (one of the stateful backends, as a separate process).

The user's history is deliberately hostile to the referer graph: ``--sessions`` sessions of 10
events, one a minute (100,000 sessions span 69 days, inside the 90-day lookback), all over the
same pages. Each session is an ad click (a search URL unique to the session) or, every
``--organic-every``-th session, an organic entry; then a landing page, seven pages and a goal:

    impression (search?q=k -> /landing)   paid sessions
    impression (news -> /never-visited)   organic sessions, shape "ignored-ads" only: an ad
                                          shown and never followed (never consumed, reaches
                                          nothing)
    /landing  <- search?q=k (paid) or http://social.example/ (organic)
    /p1 <- /landing, /p2 <- /p1, ..., /p7 <- /p6
    /goal <- /p7                                  (a goal)

Because every session reuses the same URLs, every earlier landing page refers into every later
session: the time-respecting graph has a path from every impression to every later goal. A
walk that does not stop early, or that re-walks history per goal, is quadratic here. The spec's
answer is still simple: a paid session's goal is credited to its own click (every earlier click
was consumed by its own goal) with the trail ``/landing, /p1, ..., /p7``; an organic session's
goal is organic. ``expected_rows`` states exactly that, independently of the core. In the
"ignored-ads" shape an unconsumed impression always exists, so proving a goal organic cannot
stop at "no unconsumed impression left": that is the harder of the two shapes. Shape
"clicks-only" has 9 events per organic session (990,000 events for 100,000 sessions), shape
"ignored-ads" 10 (1,000,000).

Each core run happens in a child process with a time limit (``--time-limit``): a run that does
not finish is reported as such, with its limit, rather than hanging the benchmark.

    python -m benchmarks.hot_key                      # the core, both shapes, 100,000 sessions
    python -m benchmarks.hot_key --shapes clicks-only --spark --backend transformWithState
    python -m benchmarks.hot_key --sessions 20000     # a smaller hot key
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from attribution.events import Event  # noqa: E402
from generators.shapes import HOT_USER, SHAPES, hot_key_events  # noqa: E402
from generators.shapes import hot_key_expected_rows as expected_rows  # noqa: E402


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_core(sessions: int, organic_every: int, shape: str) -> dict:
    """Add every event to one ``UserAttribution`` and fire at +infinity, as batch mode does.

    :param sessions: the hot user's sessions (10 events each).
    :param organic_every: every N-th session has no ad click (0: none).
    :param shape: how the hot user's events are laid out, one of ``SHAPES``.
    """
    from attribution.core import WATERMARK_INFINITY, UserAttribution

    build_started = time.perf_counter()
    events = hot_key_events(sessions, organic_every, shape)
    build_s = time.perf_counter() - build_started
    started, cpu0 = time.perf_counter(), time.process_time()
    state = UserAttribution(HOT_USER)
    state.add(events)
    add_s = time.perf_counter() - started
    rows = state.fire(WATERMARK_INFINITY)
    total_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    got = [(r.goal_event_id, r.impression_id, r.trail) for r in rows]
    return {"shape": shape, "events": len(events), "goals": len(rows), "build_s": build_s,
            "add_s": add_s,
            "fire_s": total_s - add_s, "total_s": total_s, "cpu_s": cpu_s,
            "peak_rss_mb": peak_rss_mb(), "correct": got == expected_rows(sessions, organic_every)}


def _core_child(queue, sessions: int, organic_every: int, shape: str) -> None:
    queue.put(run_core(sessions, organic_every, shape))


def run_core_limited(sessions: int, organic_every: int, shape: str, limit_s: float) -> dict:
    """``run_core`` in a fresh child process (its own peak RSS), abandoned after ``limit_s``.

    :param sessions: the hot user's sessions (10 events each).
    :param organic_every: every N-th session has no ad click (0: none).
    :param shape: how the hot user's events are laid out, one of ``SHAPES``.
    :param limit_s: seconds after which the child is killed.
    """
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_core_child, args=(queue, sessions, organic_every, shape))
    started = time.perf_counter()
    child.start()
    try:
        return queue.get(timeout=limit_s)
    except Exception:  # queue.Empty: the time limit passed
        return {"shape": shape, "finished": False, "limit_s": limit_s,
                "seconds": time.perf_counter() - started}
    finally:
        if child.is_alive():
            child.kill()
        child.join()


class TreeRssSampler:
    """Peak total RSS of a process and its descendants, sampled from /proc every 0.2 s (a Spark
    job is a Python driver, a JVM and Python workers; none of them reports for the others)."""

    def __init__(self, pid: int):
        """A sampler of ``pid`` and its descendants; sampling runs inside ``with``.

        :param pid: the root process of the tree to sample.
        """
        self.pid, self.peak_mb, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        return tree

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            total_kb = 0
            for pid in self._tree():
                try:
                    with open(f"/proc/{pid}/status") as fh:
                        for line in fh:
                            if line.startswith("VmRSS:"):
                                total_kb += int(line.split()[1])
                except OSError:
                    continue
            self.peak_mb = max(self.peak_mb, total_kb / 1024)


def write_event_files(events: list[Event], out: Path, files: int) -> Path:
    """JSON-lines files in time order with increasing mtimes, and a final heartbeat file.

    :param events: the events, in time order.
    :param out: the directory under which ``events/`` is created.
    :param files: how many event files to split them into.
    """
    from attribution.spark.files import write_events

    events_dir = out / "events"
    events_dir.mkdir(parents=True)
    size = -(-len(events) // files)
    chunks = [events[k:k + size] for k in range(0, len(events), size)]
    chunks.append([Event("heartbeat-final", None, "heartbeat", events[-1].ts + 3_600_000)])
    # Written now, in order: --max-future-skew is judged against a file's modification time.
    first = int(time.time()) - len(chunks)
    for n, chunk in enumerate(chunks):
        path = events_dir / f"part-{n:05d}.json"
        write_events(chunk, path, "json")
        os.utime(path, (first + n, first + n))
    return events_dir


def run_spark(sessions: int, organic_every: int, shape: str, backend: str, files: int,
              work: Path) -> dict:
    """The job over the hot key's files, as a subprocess: time, peak RSS, and the checked rows.

    :param sessions: the hot user's sessions (10 events each).
    :param organic_every: every N-th session has no ad click (0: none).
    :param shape: how the hot user's events are laid out, one of ``SHAPES``.
    :param backend: the job's stateful backend.
    :param files: how many event files to split the input into.
    :param work: the run's scratch directory (input, output, checkpoint).
    """
    import pyarrow.parquet as pq

    events = hot_key_events(sessions, organic_every, shape)
    events_dir = write_event_files(events, work, files)
    del events
    command = [sys.executable, str(ROOT / "jobs" / "attribution_job.py"),
               "--events", str(events_dir), "--output", str(work / "out"),
               "--checkpoint", str(work / "checkpoint"), "--backend", backend,
               "--max-files-per-trigger", "1", "--watermark-delay", "10 minutes",
               "--report-json", str(work / "report.json")]
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    with TreeRssSampler(proc.pid) as sampler:
        for line in proc.stdout:
            if line.startswith("batch ") or line.startswith("attribution "):
                print("    " + line.rstrip()[:150], flush=True)
        code = proc.wait()
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"the attribution job failed with exit code {code}")
    # The file sink's log says which part files are committed (no crash here, but be exact).
    table = pq.ParquetDataset(str(work / "out")).read()
    rows = sorted(zip(table.column("goal_event_id").to_pylist(),
                      table.column("impression_id").to_pylist(),
                      (tuple(t) for t in table.column("trail").to_pylist())))
    report = json.loads((work / "report.json").read_text())
    return {"shape": shape, "backend": backend, "files": files + 1, "seconds": seconds,
            "peak_tree_rss_mb": sampler.peak_mb, "goals": report["goals"],
            "batches": report["batches"], "correct": rows == expected_rows(sessions, organic_every)}


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's options from ``argv``; an unknown shape exits with a usage error.

    :param argv: the arguments (default: the command line).
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=type(
            "Formatter", (argparse.ArgumentDefaultsHelpFormatter,
                          argparse.RawDescriptionHelpFormatter), {}))
    parser.add_argument("--sessions", type=int, default=100_000,
                        help="sessions of the hot user (10 events each; 100,000 gives "
                             "1,000,000 events and 100,000 goals)")
    parser.add_argument("--organic-every", type=int, default=10,
                        help="every N-th session has no ad click (0: none)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="comma-separated shapes to run, from: " + ", ".join(SHAPES))
    parser.add_argument("--time-limit", type=float, default=900, metavar="SECONDS",
                        help="abandon a core run after this long and report it unfinished")
    parser.add_argument("--spark", action="store_true",
                        help="also run the Spark job over the same events (every shape)")
    parser.add_argument("--backend", default="applyInPandasWithState",
                        choices=("applyInPandasWithState", "transformWithState"),
                        help="stateful backend of the Spark run")
    parser.add_argument("--files", type=int, default=10,
                        help="event files (micro-batches) of the Spark run, plus a heartbeat")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write results as JSON")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.files < 1:
        parser.error("--sessions and --files must be positive")
    args.shapes = args.shapes.split(",")
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    return args


def main(argv=None) -> int:
    """Run the core and the Spark job on each shape; print and check the results.

    :param argv: the arguments (default: the command line).
    """
    args = parse_args(argv)
    print(f"hot key: one user, {args.sessions:,} sessions (up to {args.sessions * 10:,} events), "
          f"{args.sessions:,} goals; time limit per core run {args.time_limit:.0f} s", flush=True)
    results = {"sessions": args.sessions, "core": [], "spark": []}
    ok = True
    for shape in args.shapes:
        print(f"core   [{shape}] running ...", flush=True)
        core = run_core_limited(args.sessions, args.organic_every, shape, args.time_limit)
        results["core"].append(core)
        if not core.get("finished", True):
            print(f"core   [{shape}] did NOT finish within {core['limit_s']:.0f} s", flush=True)
            ok = False
            continue
        print(f"core   [{shape}] {core['events']:,} events, {core['goals']:,} goals: add "
              f"{core['add_s']:.1f} s + fire {core['fire_s']:.1f} s = {core['total_s']:.1f} s wall "
              f"({core['cpu_s']:.1f} s cpu), peak RSS {core['peak_rss_mb']:.0f} MB, "
              f"{'matches' if core['correct'] else 'DIFFERS FROM'} the expected rows", flush=True)
        ok = ok and core["correct"]
    for shape in args.shapes if args.spark else ():
        work = Path(tempfile.mkdtemp(prefix="hot-key-"))
        try:
            print(f"spark  [{shape}] {args.backend}, {args.files} files + heartbeat ...",
                  flush=True)
            spark = run_spark(args.sessions, args.organic_every, shape, args.backend, args.files,
                              work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"spark  [{shape}] {spark['goals']:,} goals in {spark['seconds']:.1f} s wall "
              f"({spark['batches']} batches, JVM start included), peak RSS of the job's "
              f"processes {spark['peak_tree_rss_mb']:.0f} MB, "
              f"{'matches' if spark['correct'] else 'DIFFERS FROM'} the expected rows", flush=True)
        results["spark"].append(spark)
        ok = ok and spark["correct"]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
