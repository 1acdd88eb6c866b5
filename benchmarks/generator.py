"""Benchmark of the event generator: events per second written, for each file format.

Runs ``generators.dataset.generate`` (site, behaviour, disorder, file writing, manifest; the
truth and the picture are off because they are not the generator) on one core and prints, per
format, the records written and the rate by CPU time and by wall time. CPU time is the
number to compare with the target (300,000 events/s for Parquet): on a shared machine the wall
clock also counts other people's processes.

    python -m benchmarks.generator                      # 100,000 users, every format
    python -m benchmarks.generator --users 20000 --formats parquet --repeat 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

TARGET_PARQUET_EVENTS_PER_S = 300_000
FORMATS = ("parquet", "json", "avro")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure how many events per second the generator writes, per format.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--users", type=int, default=100_000,
                        help="users per run (about 16 events each with the default knobs)")
    parser.add_argument("--files", type=int, default=20, help="event files per run")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="comma-separated formats to measure, from: " + ", ".join(FORMATS))
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per format; the best one is reported (least disturbed)")
    parser.add_argument("--disorder", default="bounded", help="disorder model of the runs")
    parser.add_argument("--redelivery-rate", type=float, default=0.0,
                        help="fraction of events delivered twice")
    parser.add_argument("--core", type=int, default=None,
                        help="pin the process to this CPU (default: the first one allowed)")
    parser.add_argument("--out", default=None,
                        help="scratch directory for the files (default: a temporary directory, "
                             "removed afterwards)")
    args = parser.parse_args(argv)
    unknown = [f for f in args.formats.split(",") if f not in FORMATS]
    if unknown:
        parser.error(f"unknown format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    if args.users < 1 or args.repeat < 1 or args.files < 1:
        parser.error("--users, --files and --repeat must be positive")
    return args


def pin_to_one_core(core) -> str:
    """Run on one CPU, Arrow included, so the numbers mean 'one core'."""
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity on this platform)"
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[0] if core is None else core
    if chosen not in allowed:
        raise SystemExit(f"error: --core {core} is not available; allowed CPUs: {allowed}")
    os.sched_setaffinity(0, {chosen})
    return f"pinned to CPU {chosen}"


def main(argv=None) -> int:
    args = parse_args(argv)
    pinning = pin_to_one_core(args.core)
    from generators.dataset import generate
    from generators.params import GeneratorParams

    scratch = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamgen-bench-"))
    print(f"generator benchmark: {args.users:,} users, {args.files} files, {args.disorder} "
          f"disorder, best of {args.repeat}; {pinning}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    try:
        for fmt in args.formats.split(","):
            params = GeneratorParams(users=args.users, files=args.files, format=fmt,
                                     disorder=args.disorder,
                                     redelivery_rate=args.redelivery_rate)
            best = None
            for run in range(1, args.repeat + 1):
                out = scratch / f"{fmt}-{run}"
                cpu, wall = time.process_time(), time.perf_counter()
                result = generate(params, out, truth=False, plot=False, overwrite=True)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                size = sum(p.stat().st_size for p in result.event_files)
                line = (f"  {fmt:8s} run {run}: {result.records:,} records, {size / 1e6:,.1f} MB, "
                        f"cpu {cpu:.2f} s ({result.records / cpu:,.0f} events/s), "
                        f"wall {wall:.2f} s ({result.records / wall:,.0f} events/s); "
                        f"build {result.seconds['build']:.2f} s, write {result.seconds['write']:.2f} s")
                print(line, flush=True)
                if best is None or cpu < best[1]:
                    best = (result.records, cpu, wall)
                shutil.rmtree(out)
            results[fmt] = best
    finally:
        if not args.out:
            shutil.rmtree(scratch, ignore_errors=True)

    print("\nformat    records     events/s (cpu)  events/s (wall)")
    for fmt, (records, cpu, wall) in results.items():
        print(f"{fmt:8s}  {records:>10,}  {records / cpu:>14,.0f}  {records / wall:>15,.0f}")
    if "parquet" in results:
        records, cpu, _ = results["parquet"]
        rate = records / cpu
        verdict = "meets" if rate >= TARGET_PARQUET_EVENTS_PER_S else "MISSES"
        print(f"\nparquet: {rate:,.0f} events/s per core {verdict} the target of "
              f"{TARGET_PARQUET_EVENTS_PER_S:,} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
