"""The benchmark's modes: the main table (every kind, interleaved repeats, on one dataset), the
scale mode (the table at three sizes), the state-growth mode, the levers and the click-through
join, and the untimed warm-up before them."""
from __future__ import annotations

import shutil
from dataclasses import asdict

from attribution.config import parse_duration_ms
from joins.durations import format_duration_ms

from .console import log
from .datasets import (
    DEFAULT_PROFILE,
    PROFILES,
    Dataset,
    make_dataset,
    measure_state_encoding,
    read_events_arrow,
)
from .kinds import (
    BATCH,
    CORE,
    NATIVE,
    RUN_KINDS,
    RUN_LABELS,
    STREAM_BACKENDS,
    run_label,
    table_variants,
)
from .report import (
    evenly_spaced,
    fmt_bytes,
    fmt_number,
    plateau_verdict,
    print_main,
    render_table,
    source_ratios,
    sparkline,
    summarise,
)
from .runs import Bench, RunResult
from .sampling import MIB

SCALE_FRACTIONS = (0.25, 0.5, 1.0)
# State-growth mode: a short lookback and a horizon many times longer keep the run small while
# the horizon still spans many lookbacks; "no GC" is a lookback no event ever leaves.
GROWTH_LOOKBACK = "2 days"
GROWTH_SPAN = "30 days"
GROWTH_NO_GC_LOOKBACK = "36500 days"
WARMUP_EVENTS = 5_000


def interleaved(kinds: list, repeats: int) -> list[tuple[int, object]]:
    """Each repeat runs every kind (or variant) once, the order rotated by one per repeat.

    :param kinds: the kinds or variants to run.
    :param repeats: how many times each runs.
    """
    order = []
    for r in range(repeats):
        shift = r % len(kinds)
        order += [(r, k) for k in kinds[shift:] + kinds[:shift]]
    return order


def table_files(args) -> int:
    """The event files of the main table's dataset: ``--files``, else its profile's.

    :param args: the parsed command line.
    """
    return args.files or PROFILES[args.profile].files


def mode_files(args) -> int:
    """The event files of the levers' and the join's datasets, which the standard generator
    makes whatever the profile: ``--files``, else the standard profile's.

    :param args: the parsed command line.
    """
    return args.files or PROFILES[DEFAULT_PROFILE].files


def run_size(bench: Bench, dataset: Dataset, variants: list[tuple[str, int]],
             repeats: int) -> list[RunResult]:
    """Every variant (``(kind, allowed lateness)``, see ``kinds.table_variants``) ``repeats``
    times, interleaved; the core runs first once as the reference.

    :param bench: the benchmark's session, scratch space and samplers.
    :param dataset: the dataset to run over.
    :param variants: the ``(kind, allowed lateness)`` pairs to run.
    :param repeats: runs per variant.
    """
    results = []
    plan = interleaved(variants, repeats)
    core = (CORE, 0)
    if core in variants and plan[0][1] != core:
        # Spark runs are checked against the core's answer, so compute it before them.
        plan.remove((next(r for r, v in plan if v == core), core))
        plan.insert(0, (0, core))
    for n, (repeat, (kind, lateness_ms)) in enumerate(plan, 1):
        label = run_label(kind, lateness_ms)
        log(f"[{dataset.label}] run {n}/{len(plan)}: {label} (repeat {repeat + 1}) ...")
        result = bench.run(kind, dataset, repeat, allowed_lateness_ms=lateness_ms)
        log(f"[{dataset.label}]   {result.seconds:.1f}s, {result.events_per_s:,.0f} events/s, "
            f"peak RSS {result.memory.total / MIB:,.0f} MiB, check {result.check}")
        results.append(result)
    return results


def table_runs(args) -> bool:
    """Whether the command line ``args`` runs the main table (at one size, or at three with
    ``--scale``): not with ``--only-modes``, and ``--cost-model`` replaces it.

    :param args: the parsed command line.
    """
    return not args.only_modes and (args.scale or not args.cost_model)


def warm_up(bench: Bench, args) -> None:
    """Run every Spark kind once, untimed, on a small dataset: the first query of a JVM pays for
    class loading and JIT compilation, which would otherwise be charged to whichever kind the
    interleaving happens to put first.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
    dataset = make_dataset(bench.work / "data" / "warmup", min(WARMUP_EVENTS, args.events), 3,
                           args.seed + 1, "warm-up", args.models)
    # The main table warms what it runs; the other modes run the native count and both backends.
    other_modes = (NATIVE, *STREAM_BACKENDS, BATCH)
    kinds = [k for k in RUN_KINDS
             if k != CORE and (k in args.kinds if table_runs(args) else k in other_modes)]
    for kind in kinds:
        log(f"[warm-up] {RUN_LABELS[kind]} ...")
        bench.run(kind, dataset, 0)
    shutil.rmtree(dataset.root, ignore_errors=True)


def main_table(bench: Bench, args, kinds: list[str], events: int, label: str) -> dict:
    """Every kind of ``kinds``, ``args.repeats`` times, on one dataset of ``args.profile``
    (``datasets.PROFILES``) of about ``events`` records tagged ``label``; return its summaries,
    runs, state encoding, event time per micro-batch and rendered table.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    :param kinds: the kinds to run.
    :param events: about how many records the dataset has.
    :param label: the dataset's name.
    """
    profile = PROFILES[args.profile]
    dataset = make_dataset(bench.work / "data" / label, events, table_files(args), args.seed,
                           label, args.models, **profile.generator)
    variants = table_variants(kinds, args.allowed_lateness)
    results = run_size(bench, dataset, variants, args.repeats)
    summaries = summarise(results, variants)
    encoding = {}
    if args.state_encoding:
        log(f"[{label}] measuring state encoding with the core ...")
        encoding = measure_state_encoding(dataset, read_events_arrow(dataset.events_dir))
    shutil.rmtree(dataset.root, ignore_errors=True)
    return {"label": label, "records": dataset.records, "files": dataset.files,
            "profile": {"name": args.profile, **asdict(profile)},
            "batch_event_time_s": dataset.batch_event_times_s(args.max_files_per_trigger),
            "event_time_s": dataset.event_time_s,
            "goals": dataset.goals, "attributed": dataset.attributed,
            "summaries": [asdict(s) for s in summaries],
            "runs": [r.as_dict() for r in results], "state_encoding": encoding,
            "source_ratios": source_ratios(summaries), "table": render_table(summaries)}


def scale_mode(bench: Bench, args, kinds: list[str]) -> dict:
    """The main table of ``kinds`` at each of ``SCALE_FRACTIONS`` of ``args.events``, then how
    each kind's median time grew from the smallest size to the largest.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    :param kinds: the kinds to run.
    """
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
    for kind, lateness_ms in table_variants(kinds, args.allowed_lateness):
        seconds = []
        for s in sections:
            row = next((x for x in s["summaries"] if x["kind"] == kind
                        and x["allowed_lateness_ms"] == lateness_ms), None)
            seconds.append(row["seconds"] if row else None)
        if None in seconds:
            continue
        # Cost per input record grows by this factor times the input ratio; compare like with like.
        ratio = seconds[-1] / seconds[0]
        label = run_label(kind, lateness_ms)
        growth[label] = {"seconds": seconds, "cost_ratio": ratio}
        lines.append([label] + [f"{x:.1f}s" for x in seconds] + [f"{ratio:.2f}x"])
    widths = [max(len(l[i]) for l in lines) for i in range(len(header))]
    for l in lines:
        print("  ".join([l[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(l[1:], widths[1:])]))
    input_ratio = sections[-1]["records"] / sections[0]["records"]
    print(f"(input grew {input_ratio:.2f}x)")
    return {"sections": sections, "growth": growth, "input_ratio": input_ratio}


def state_growth_mode(bench: Bench, args) -> dict:
    """A horizon many lookbacks long; per backend, state rows with GC and without it.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
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
        for lateness_ms in args.allowed_lateness:
            name = backend + (f", L {format_duration_ms(lateness_ms)}" if lateness_ms else "")
            for gc, lookback in (("GC", None), ("no GC", GROWTH_NO_GC_LOOKBACK)):
                log(f"[state-growth] {name}, {gc} ...")
                result = bench.run(backend, dataset, 0, lookback=lookback,
                                   allowed_lateness_ms=lateness_ms)
                rows, sst = result.state.rows_per_batch, result.state.bytes_per_batch
                print(f"{name:<28} {gc:<6} {result.seconds:6.1f}s  state rows per batch "
                      f"{sparkline(rows)}: {plateau_verdict(rows)}")
                print(f"{'':<28} {'':<6} {'':>7}  state SST per batch  "
                      f"[{' '.join(fmt_bytes(b) for b in evenly_spaced(sst))}]: "
                      f"{plateau_verdict(sst)}")
                out["runs"].append({"backend": backend, "allowed_lateness_ms": lateness_ms,
                                    "gc": gc, "seconds": result.seconds,
                                    "rows_per_batch": rows, "sst_per_batch": sst,
                                    "rows_verdict": plateau_verdict(rows),
                                    "sst_verdict": plateau_verdict(sst)})
    print("(applyInPandasWithState keeps one state row per hash bucket of users, so its row count "
          "is capped by the buckets; its state bytes show the growth)")
    shutil.rmtree(dataset.root, ignore_errors=True)
    return out


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
    """Every lever once on one dataset, next to the job's own run and the native count.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
    dataset = make_dataset(bench.work / "data" / "levers", args.lever_events, mode_files(args),
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
        results.append({"lever": label, **r.as_dict(), "ratio": ratio, "cpu_ratio": cpu_ratio})

    report("(a) native window count", native)
    report("the job (validation + dead letter + defaults)", job)
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
    """The click-through join (jobs/join_job.py) once per cleanup strategy, on a dataset of about
    ``args.join_events`` records, next to the native count on the same files.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
    from attribution.spark.click_join import STRATEGIES
    from jobs.join_job import parse_args as join_args
    from jobs.join_job import run as join_run

    dataset = make_dataset(bench.work / "data" / "join", args.join_events, mode_files(args),
                           args.seed, "join")
    print(f"\n== click-through join: {dataset.records:,} records, {dataset.files} files, "
          f"one per micro-batch (native window count as the reference) ==")
    out = {"records": dataset.records, "runs": []}
    native = bench.run(NATIVE, dataset, 0)
    print(f"{'native window count':<24} {native.seconds:6.1f}s  {native.events_per_s:10,.0f} "
          "events/s")
    for strategy in STRATEGIES:
        scratch = bench.scratch(f"join-{strategy}")
        argv = ["--events", str(dataset.events_dir), "--format", "parquet", "--quiet",
                "--strategy", strategy, "--watermark-delay", dataset.watermark_delay,
                "--max-files-per-trigger", str(args.max_files_per_trigger),
                "--output", str(scratch / "out"), "--output-format", "parquet",
                "--checkpoint", str(scratch / "checkpoint")]
        log(f"[join] {strategy} ...")
        follow, seconds, memory, _ = bench.timed(
            lambda: join_run(bench.spark, join_args(argv)), "click_join")
        rows = [r.total for r in follow.state.rows()]
        rate = dataset.records / seconds
        print(f"{strategy:<24} {seconds:6.1f}s  {rate:10,.0f} events/s "
              f"({rate / native.events_per_s:.2f}x "
              f"native)  {follow.output_rows:,} clicks  join state rows {sparkline(rows)}  "
              f"peak {fmt_number(max(rows) if rows else None)}: {plateau_verdict(rows)}  "
              f"peak RSS {memory.total / MIB:,.0f} MiB")
        out["runs"].append({"strategy": strategy, "seconds": seconds, "events_per_s": rate,
                            "ratio": rate / native.events_per_s, "clicks": follow.output_rows,
                            "state_rows_per_batch": rows, "peak_rss_mib": memory.total / MIB})
        shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(dataset.root, ignore_errors=True)
    return out

