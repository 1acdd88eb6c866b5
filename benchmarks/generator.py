"""Benchmark of the event generator end to end: events per second with the truth and without.

Runs the command a user runs, ``python -m generators generate`` (interpreter start, site,
behaviour, disorder, event files, manifest, pictures and, in one of the two kinds of run, the
truth file) as a subprocess, and times it on the wall clock: the generator uses both cores of a
2-core machine (a helper process draws the pictures and computes half of the truth), so CPU time
of one process would not say how long a user waits. Runs with and without the truth alternate;
each figure is the median of ``--repeat`` runs. The machine is shared, so the load average is
printed before and after: a busy machine makes every figure worse, never better.

Targets (1,000,000 Parquet events on 2 cores): 100,000 events/s with the truth, 300,000 without.

    python -m benchmarks.generator                          # 1M Parquet events, 3 runs each
    python -m benchmarks.generator --events 200000 --repeat 5 --no-plot
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from attribution.spark.formats import FORMATS  # noqa: E402 (after the path set-up above)

TARGETS = {True: 100_000, False: 300_000}   # events/s, with the truth / without
_SAMPLE_USERS = 2_000


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's options from ``argv``.

    :param argv: the arguments (default: the command line).
    """
    parser = argparse.ArgumentParser(
        description="Measure the generator end to end (python -m generators generate), with and "
                    "without the truth, in events per second of wall time.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="about how many events per run (the users are sized to it)")
    parser.add_argument("--format", default="parquet", choices=FORMATS, help="event file format")
    parser.add_argument("--files", type=int, default=20, help="event files per run")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each kind; the median is reported")
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                        help="draw the pictures, as the command does by default")
    parser.add_argument("--processes", type=int, default=None,
                        help="passed to the command (default: its own choice)")
    parser.add_argument("--out", default=None,
                        help="scratch directory for the runs (default: a temporary directory, "
                             "removed afterwards)")
    args = parser.parse_args(argv)
    for name in ("events", "files", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.processes is not None and args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    return args


def users_for(events: int, fmt: str) -> int:
    """Users that make about ``events`` events with the default knobs (measured on a sample).

    :param events: about how many events are wanted.
    :param fmt: the event file format.
    """
    from generators.dataset import build
    from generators.params import GeneratorParams

    sample = build(GeneratorParams(users=_SAMPLE_USERS, format=fmt))
    return max(1, round(events * _SAMPLE_USERS / len(sample.arrival.rows)))


def run_once(out: Path, users: int, args: argparse.Namespace, truth: bool) -> dict:
    """One ``generate`` command; its records, wall seconds and CPU seconds (helpers included).

    :param out: the directory the events go to (overwritten).
    :param users: how many users to generate.
    :param args: the parsed command line (format, files, ...).
    :param truth: generate the truth file too.
    """
    command = [sys.executable, "-m", "generators", "generate", "--out", str(out),
               "--users", str(users), "--format", args.format, "--files", str(args.files),
               "--overwrite", "--quiet", "--truth" if truth else "--no-truth",
               "--plot" if args.plot else "--no-plot"]
    if args.processes is not None:
        command += ["--processes", str(args.processes)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    manifest = json.loads((out / "manifest.json").read_text())
    records = sum(f["records"] for f in manifest["files"])
    return {"records": records, "wall": wall, "cpu": cpu}


def main(argv=None) -> int:
    """Time the generator with and without the truth and print the rates.

    :param argv: the arguments (default: the command line).
    """
    args = parse_args(argv)
    users = users_for(args.events, args.format)
    scratch = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamgen-bench-"))
    print(f"generator benchmark: about {args.events:,} events ({users:,} users), {args.format}, "
          f"{args.files} files, pictures {'on' if args.plot else 'off'}, median of "
          f"{args.repeat}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
          flush=True)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    try:
        for n in range(args.repeat):
            # Alternate which kind goes first, so neither always runs on a warmer machine.
            for truth in ((True, False) if n % 2 == 0 else (False, True)):
                out = scratch / ("truth" if truth else "no-truth")
                r = run_once(out, users, args, truth)
                runs[truth].append(r)
                print(f"  run {n + 1} {'with truth   ' if truth else 'without truth'}: "
                      f"{r['records']:,} records in {r['wall']:.2f} s wall "
                      f"({r['records'] / r['wall']:,.0f} events/s), {r['cpu']:.2f} s CPU",
                      flush=True)
                shutil.rmtree(out)
    finally:
        if not args.out:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for truth in (True, False):
        rates = [r["records"] / r["wall"] for r in runs[truth]]
        median = statistics.median(rates)
        verdict = "meets" if median >= TARGETS[truth] else "MISSES"
        print(f"{'with truth' if truth else 'without truth'}: median {median:,.0f} events/s "
              f"end to end (runs: {', '.join(f'{x:,.0f}' for x in rates)}); {verdict} the "
              f"target of {TARGETS[truth]:,} events/s for 1,000,000 events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
