"""The streaming benchmark's command line: its arguments, and the run of every mode they ask for
in one Spark session."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from attribution.config import DEFAULT_MODELS, parse_duration_ms, parse_models
from commandline.exits import Failure, report_failure

from . import __doc__ as OVERVIEW
from .cost_model import DEFAULT_BATCH_SIZES, cost_model_mode, parse_batch_sizes
from .datasets import DEFAULT_PROFILE, PROFILES
from .kinds import JOB_LAYOUTS, RUN_KINDS, STREAM_BACKENDS
from .modes import (
    GROWTH_LOOKBACK,
    GROWTH_SPAN,
    WARMUP_EVENTS,
    join_mode,
    lever_mode,
    main_table,
    scale_mode,
    state_growth_mode,
    table_runs,
    warm_up,
)
from .report import machine_description, print_main
from .runs import Bench
from .sustainable import SUSTAINABLE_KINDS, sustainable_mode

PROG = "python -m benchmarks.streaming"
# The overview without its title, usage lines and module list.
DESCRIPTION = OVERVIEW.split("\n\n", 2)[2].split("\nModules:")[0]
DEFAULT_EVENTS = 1_000_000


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's options from ``argv`` (default: the command line), checked; a bad value
    exits with a one-line usage error.

    :param argv: the arguments (default: the command line).
    """
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, metavar="N",
                        help="about how many input records to generate (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, metavar="R",
                        help="runs per kind, interleaved; the table quotes medians "
                             "(default: %(default)s)")
    kinds = tuple(RUN_KINDS)
    parser.add_argument("--runs", default=",".join(kinds), metavar="KINDS",
                        help="comma-separated subset of: " + ", ".join(kinds) +
                             " (default: all)")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=tuple(PROFILES),
                        help="the main table's dataset: " + "; ".join(
                            f"{name}, {p.description} ({p.files} files)"
                            for name, p in PROFILES.items()) + " (default: %(default)s)")
    parser.add_argument("--files", type=int, default=None, metavar="N",
                        help="event files per dataset, plus one heartbeat file; with "
                             "--max-files-per-trigger 1 each is one micro-batch (default: the "
                             "profile's; the standard profile's for --levers and --join)")
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
    parser.add_argument("--sustainable", action="store_true",
                        help="also find each query's highest sustainable rate, fed live by the "
                             "load generator (see benchmarks/streaming/sustainable.py)")
    parser.add_argument("--sustainable-kinds", default=",".join(SUSTAINABLE_KINDS),
                        metavar="KINDS",
                        help="comma-separated subset of: " + ", ".join(SUSTAINABLE_KINDS) +
                             " (default: all)")
    parser.add_argument("--sustainable-trigger", default="10 seconds", metavar="DURATION",
                        help="processing-time trigger of the sustainable runs; a rate is "
                             "sustainable only if the p99 micro-batch is shorter "
                             "(default: %(default)s)")
    parser.add_argument("--sustainable-min-rate", type=int, default=1_000, metavar="EVENTS_PER_S",
                        help="lower bound of the rate search, probed first (default: %(default)s)")
    parser.add_argument("--sustainable-max-rate", type=int, default=100_000,
                        metavar="EVENTS_PER_S",
                        help="upper bound of the rate search (default: %(default)s)")
    parser.add_argument("--sustainable-probes", type=int, default=6, metavar="N",
                        help="probes per kind, bounds included (default: %(default)s)")
    parser.add_argument("--sustainable-duration", default="60 seconds", metavar="DURATION",
                        help="how long the load runs in each probe, at least 4 triggers; its "
                             "first quarter is not measured (default: %(default)s)")
    parser.add_argument("--sustainable-file-interval", default="1 second", metavar="DURATION",
                        help="one new input file per interval (default: %(default)s)")
    parser.add_argument("--cost-model", action="store_true",
                        help="instead of the main table: per job layout, fit seconds per "
                             "micro-batch = a + b x events + c x MB of state, check that 4x the "
                             "micro-batches cost at most 4.5x the time, print a sizing table "
                             "(see benchmarks/streaming/cost_model.py)")
    parser.add_argument("--cost-batch-events", default=None, metavar="LIST",
                        help="events per micro-batch of the cost model's runs, comma-separated, "
                             "at least two sizes, for every layout (default: per layout, "
                             + "; ".join(f"{layout} {','.join(map(str, sizes))}"
                                         for layout, sizes in DEFAULT_BATCH_SIZES.items())
                             + ")")
    parser.add_argument("--cost-batches", type=int, default=16, metavar="N",
                        help="micro-batches per cost-model run, a multiple of 4, at least 8 "
                             "(default: %(default)s)")
    parser.add_argument("--cost-layouts", default=",".join(JOB_LAYOUTS), metavar="LIST",
                        help="job layouts of the cost model, a subset of: "
                             + ", ".join(JOB_LAYOUTS) + " (default: all)")
    parser.add_argument("--cost-repeats", type=int, default=1, metavar="R",
                        help="runs per layout and size, interleaved; the points are medians "
                             "(default: %(default)s)")
    parser.add_argument("--cost-trigger", default="1 minute", metavar="DURATION",
                        help="trigger interval of the sizing table (default: %(default)s)")
    parser.add_argument("--only-modes", action="store_true",
                        help="skip the main table; run only --state-growth, --join, --levers, "
                             "--sustainable and/or --cost-model")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help=f"skip the untimed warm-up runs: every Spark kind on "
                             f"{WARMUP_EVENTS:,} events (at most --events) before the measured "
                             "runs, and the cost model's first run of each layout")
    parser.add_argument("--no-state-encoding", dest="state_encoding", action="store_false",
                        help="skip measuring state bytes per retained event with the core")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default: %(default)s)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), metavar="LIST",
                        help="attribution models of every run, comma-separated, or 'all' "
                             "(default: %(default)s)")
    parser.add_argument("--allowed-lateness", default="0", metavar="LIST",
                        help="the job's --allowed-lateness in the streaming runs of the main "
                             "table and the state-growth mode; several durations, "
                             "comma-separated, run each backend once per value, interleaved, "
                             "e.g. '0,1 hour' (default: %(default)s)")
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
    try:
        args.allowed_lateness = list(dict.fromkeys(
            parse_duration_ms(text.strip(), "--allowed-lateness")
            for text in args.allowed_lateness.split(",")))
    except ValueError as err:
        parser.error(str(err))
    args.kinds = [k.strip() for k in args.runs.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in RUN_KINDS]
    if unknown:
        parser.error(f"--runs: unknown kind(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(kinds)}")
    unavailable = [k for k in args.kinds if k not in kinds]
    if unavailable:
        parser.error(f"--runs: kind(s) {', '.join(unavailable)} need an output format the "
                     f"attribution job does not offer; choose from {', '.join(kinds)}")
    args.kinds = [k for k in RUN_KINDS if k in args.kinds]  # the table's order
    args.growth_backends = [b.strip() for b in args.growth_backends.split(",") if b.strip()]
    if any(b not in STREAM_BACKENDS for b in args.growth_backends):
        parser.error(f"--growth-backends: choose from {', '.join(STREAM_BACKENDS)}")
    if args.files is not None and args.files < 1:
        parser.error("--files must be at least 1")
    for name in ("events", "repeats", "max_files_per_trigger", "growth_events",
                 "growth_files", "lever_events", "sustainable_min_rate", "sustainable_probes",
                 "cost_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.join_events is None:
        args.join_events = args.events
    try:
        args.conf = dict(c.split("=", 1) for c in args.conf)
    except ValueError:
        parser.error("--conf takes KEY=VALUE")
    if args.only_modes and not (args.state_growth or args.join or args.levers
                                or args.sustainable or args.cost_model):
        parser.error("--only-modes needs --state-growth, --join, --levers, --sustainable and/or "
                     "--cost-model")
    _check_sustainable(parser, args)
    _check_cost_model(parser, args)
    return args


def _check_cost_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse and check the --cost-* options; a bad one is a usage error."""
    if args.cost_batch_events is not None:
        try:
            args.cost_batch_events = parse_batch_sizes(args.cost_batch_events)
        except ValueError as err:
            parser.error(str(err))
    args.cost_layouts = [k.strip() for k in args.cost_layouts.split(",") if k.strip()]
    unknown = [k for k in args.cost_layouts if k not in JOB_LAYOUTS]
    if unknown or not args.cost_layouts:
        parser.error(f"--cost-layouts: unknown layout(s) {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(JOB_LAYOUTS)}")
    if args.cost_batches < 8 or args.cost_batches % 4:
        parser.error(f"--cost-batches must be a multiple of 4, at least 8, got "
                     f"{args.cost_batches}")
    try:
        args.cost_trigger_ms = parse_duration_ms(args.cost_trigger, "--cost-trigger")
    except ValueError as err:
        parser.error(str(err))
    if args.cost_trigger_ms <= 0:
        parser.error(f"--cost-trigger must be longer than 0, got {args.cost_trigger!r}")


def _check_sustainable(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse and check the --sustainable-* options; a bad one is a usage error."""
    args.sustainable_kinds = [k.strip() for k in args.sustainable_kinds.split(",") if k.strip()]
    unknown = [k for k in args.sustainable_kinds if k not in SUSTAINABLE_KINDS]
    if unknown or not args.sustainable_kinds:
        parser.error(f"--sustainable-kinds: unknown kind(s) {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(SUSTAINABLE_KINDS)}")
    for name in ("trigger", "duration", "file_interval"):
        option = f"--sustainable-{name.replace('_', '-')}"
        value = getattr(args, f"sustainable_{name}")
        try:
            ms = parse_duration_ms(value, option)
        except ValueError as err:
            parser.error(str(err))
        if ms <= 0:
            parser.error(f"{option} must be longer than 0, got {value!r}")
        setattr(args, f"sustainable_{name}_ms", ms)
    if args.sustainable_max_rate < args.sustainable_min_rate:
        parser.error(f"--sustainable-max-rate {args.sustainable_max_rate} is below "
                     f"--sustainable-min-rate {args.sustainable_min_rate}")
    if args.sustainable_duration_ms < 4 * args.sustainable_trigger_ms:
        parser.error(f"--sustainable-duration {args.sustainable_duration!r} must be at least 4 "
                     f"times --sustainable-trigger {args.sustainable_trigger!r}")


def run(spark, args) -> dict:
    """Run everything ``args`` asks for in ``spark``; print the tables; return the numbers.

    :param spark: the ``SparkSession`` to run in.
    :param args: the parsed command line.
    """
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
                     "command": " ".join([PROG, *sys.argv[1:]])}
    try:
        with bench.sampler:
            if args.warmup:
                warm_up(bench, args)
            if table_runs(args) and args.scale:
                results["scale"] = scale_mode(bench, args, args.kinds)
            elif table_runs(args):
                section = main_table(bench, args, args.kinds, args.events, "main")
                print_main(section, args)
                results["main"] = section
            if args.cost_model:
                results["cost_model"] = cost_model_mode(bench, args)
            if args.state_growth:
                results["state_growth"] = state_growth_mode(bench, args)
            if args.join:
                results["join"] = join_mode(bench, args)
            if args.levers:
                results["levers"] = lever_mode(bench, args)
            if args.sustainable:
                results["sustainable"] = sustainable_mode(bench, args)
    finally:
        bench.close()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def main(argv=None) -> int:
    """Start a Spark session as the command line asks and run the benchmark in it.

    :param argv: the arguments (default: the command line).
    """
    args = parse_args(argv)
    from jobs.runtime import build_spark_session, ship_packages

    spark = build_spark_session("attribution-benchmark", master=args.master,
                                shuffle_partitions=args.shuffle_partitions,
                                extra_conf={"spark.driver.memory": args.driver_memory})
    ship_packages(spark)
    try:
        run(spark, args)
    except Failure as failure:  # e.g. the Kafka-source kind's broker did not start
        return report_failure(failure)
    return 0

