"""The cost model: what one micro-batch of the attribution job costs, from the events in it and
the state it keeps, fitted per state layout; the state-scaling check; a sizing table.

    python -m benchmarks.streaming --cost-model
    python -m benchmarks.streaming --cost-model --cost-layouts job --cost-repeats 3

Runs. Each layout of ``--cost-layouts`` (the job with its default bucketed state, with per-user
keys, with transformWithState) runs at each of its sizes E, events per micro-batch:
``--cost-batch-events`` if given, else its own (``DEFAULT_BATCH_SIZES``). For each size, one
dataset from the project's generator with its defaults (users arriving over 60 days, the job's
90-day lookback), except that no user comes back after a gap longer than the lookback, so no
state is collected during a run: ``--cost-batches`` files of about E events each, and the
heartbeat. Each layout runs the attribution job over it as its command line would, with
``available-now`` and one file per micro-batch, ``--cost-repeats`` times, the layouts
interleaved; before its first measured run, once untimed (unless ``--no-warmup``). Within a run
the events per micro-batch stay at E while the state grows with every micro-batch; across sizes
E changes, and with it how fast the state grows.

Points. One per micro-batch over a data file, except the first (the query's start: planning,
state stores created) and any that overlapped a micro-batch of the job's dead-letter query in
some run (with ``available-now`` it reads every file in one micro-batch at the start, beside the
main query's first micro-batches):

* events: the micro-batch's ``numInputRows``;
* seconds: its wall time, ``triggerExecution``; CPU seconds: the CPU time the Spark JVM, its
  Python workers and this driver used meanwhile (``sampling.cpu_between``: sampled from
  ``/proc``, interpolated between samples). On a machine shared with other work, CPU seconds
  are the steadier of the two, and they are what a micro-batch costs in cores. With repeats,
  each is the median over the runs of the same micro-batch (the same files, the same state);
* state MB (10^6 bytes): the state store's size on disk at its end, ``rocksdbSstFileSize``
  summed over the operator's partitions. Between two compactions RocksDB keeps the values that
  later micro-batches overwrote, so this size jumps up and down from one micro-batch to the next
  (the bucketed layout rewrites every bucket each time). Each point's state is therefore the
  run's state bytes per event read (least squares through zero over its micro-batches) times
  the events read up to and including the micro-batch; the raw sizes are printed beside it.

Fit. Per layout, ordinary least squares of time = a + b x events + c x state MB over its
points, once for the wall time and once for the CPU time, with each coefficient's standard error
and each point's residual.

State-scaling check (the default layout, at each size): with n = a quarter of the
micro-batches, the time of 4n micro-batches against n is 4 x the mean time of the points among
micro-batches 2..4n over the mean of the points among micro-batches 2..n (the micro-batches left
out above are left out of both); the events read, and so about the state retained, grow 4x. It
passes when the wall-time ratio is at most ``SCALING_LIMIT``; the CPU-time ratio is printed
beside it.

Sizing table. For an input rate R and a state of S GB, with a trigger interval T
(``--cost-trigger``): a micro-batch holds E = R x T events and costs a + b E + c S
core-seconds by the CPU fit (a coefficient below zero, within noise of zero, counts as zero);
the cores that keep up are those core-seconds over T, rounded up, every core busy all the
time.
"""
from __future__ import annotations

import math
import shutil
import statistics
from typing import Optional

from .console import log
from .datasets import make_dataset
from .kinds import CORE, DEFAULT_LAYOUT, JOB_LAYOUT_LABELS, JOB_LAYOUTS
from .modes import interleaved
from .report import align_table, fmt_number
from .runs import Bench

MB = 1_000_000
SCALING_LIMIT = 4.5
# Events per micro-batch of each layout's runs unless ``--cost-batch-events`` is given: per
# layout, large enough for the per-event and per-MB costs to show above the fixed cost of a
# micro-batch, small enough for minutes of runs on 2 cores (per-user keys cost several times
# more per event than buckets).
DEFAULT_BATCH_SIZES = {
    "job": (20_000, 40_000, 80_000),
    "job-per-user": (2_000, 4_000, 8_000),
    "job-tws": (5_000, 10_000, 20_000),
}
# The sizing table's input rates (events/s) and state sizes (GB).
SIZING_RATES = (1_000, 5_000, 20_000, 50_000)
SIZING_STATE_GB = (0.1, 1, 10, 100)


def parse_batch_sizes(text: str) -> list[int]:
    """``--cost-batch-events``: comma-separated events per micro-batch, ascending, repeats
    dropped; ``ValueError`` naming the bad item, or when fewer than two sizes are given (the fit
    could not tell events from state).

    :param text: the option's value.
    """
    sizes = set()
    for item in (i.strip() for i in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--cost-batch-events: bad size {item!r}; give whole numbers of "
                             "events per micro-batch, at least 1, e.g. 5000,10000,20000")
        sizes.add(int(item))
    if len(sizes) < 2:
        raise ValueError(f"--cost-batch-events: {text!r} has one size; give at least two (the "
                         "fit separates events from state)")
    return sorted(sizes)


# -- the points -----------------------------------------------------------------------------------
def sst_bytes_per_event(micro_batches: list[dict]) -> float:
    """The state's size on disk per event read: least squares through zero of each micro-batch's
    SST bytes on the events read up to and including it (``micro_batches`` as
    ``listeners.micro_batch_figures`` gives them).

    :param micro_batches: one run's micro-batch figures, in order.
    """
    read, num, den = 0, 0.0, 0.0
    for b in micro_batches:
        read += b["input_rows"]
        num += b["sst_bytes"] * read
        den += read * read
    return num / den if den else 0.0


def _median(values: list) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def run_points(runs: list[list[dict]], batches: int) -> tuple[list[dict], float]:
    """The points of one layout at one size from its repeated ``runs`` (each the micro-batches
    of one run), over the first ``batches`` micro-batches (the data files), leaving out the
    first and any that overlapped a micro-batch of another query in some run; and the state
    bytes per event read (see the module docstring).

    :param runs: each run's micro-batch figures.
    :param batches: the micro-batches that read data files.
    """
    for micro in runs:
        if len(micro) < batches:
            raise RuntimeError(f"a run had {len(micro)} micro-batches, fewer than the "
                               f"{batches} data files: was each file its own micro-batch?")
    median = [{key: _median([run[i][key] for run in runs])
               for key in ("input_rows", "seconds", "cpu_seconds", "state_rows", "sst_bytes")}
              for i in range(batches)]
    per_event = sst_bytes_per_event(median)
    points, read = [], 0
    for i, b in enumerate(median):
        read += b["input_rows"]
        if i and not any(run[i].get("overlapped") for run in runs):
            points.append({"batch": i + 1, "events": b["input_rows"], "seconds": b["seconds"],
                           "cpu_seconds": b["cpu_seconds"], "events_read": read,
                           "state_mb": per_event * read / MB, "sst_mb": b["sst_bytes"] / MB,
                           "state_rows": b["state_rows"]})
    return points, per_event


# -- the fit --------------------------------------------------------------------------------------
def fit(points: list[dict], target: str) -> dict:
    """Ordinary least squares of ``target`` ("seconds" or "cpu_seconds") = a + b x events +
    c x state MB over the ``points`` that have it: the coefficients, their standard errors, R^2
    and the RMS residual; each point gets its fitted value and residual (``<target>_fitted``,
    ``<target>_residual``).

    :param points: the measured micro-batches (``events``, ``state_mb`` and the target).
    :param target: the measure to fit, ``"seconds"`` or ``"cpu_seconds"``.
    """
    import numpy as np

    known = [p for p in points if p[target] is not None]
    x = np.array([[1.0, p["events"], p["state_mb"]] for p in known])
    y = np.array([p[target] for p in known])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    fitted = x @ coef
    residuals = y - fitted
    dof = len(known) - 3
    rss = float(residuals @ residuals)
    variance = rss / dof if dof > 0 else float("nan")
    errors = np.sqrt(np.abs(np.diag(variance * np.linalg.pinv(x.T @ x))))
    tss = float(((y - y.mean()) ** 2).sum())
    for p, f, r in zip(known, fitted, residuals):
        p[f"{target}_fitted"], p[f"{target}_residual"] = float(f), float(r)
    return {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2]),
            "a_se": float(errors[0]), "b_se": float(errors[1]), "c_se": float(errors[2]),
            "r2": 1 - rss / tss if tss > 0 else float("nan"),
            "rms_residual": math.sqrt(rss / len(known)), "points": len(known)}


def predict(model: dict, events: float, state_mb: float) -> float:
    """``model``'s seconds for one micro-batch of ``events`` events over ``state_mb`` MB of
    state, a coefficient below zero counted as zero.

    :param model: a fit, as ``fit`` returns it.
    :param events: events in the micro-batch.
    :param state_mb: the state's size in MB.
    """
    return (max(model["a"], 0.0) + max(model["b"], 0.0) * events
            + max(model["c"], 0.0) * state_mb)


def describe(model: dict, unit: str) -> str:
    """``model``'s coefficients with their standard errors, and how well it fits; ``unit``
    names what it predicts.

    :param model: a fit, as ``fit`` returns it.
    :param unit: the unit of what it predicts (e.g. ``s`` or ``CPU s``).
    """
    return (f"a = {model['a']:.3f} {unit} (+/- {model['a_se']:.3f}), "
            f"b = {model['b'] * 1000:.4f} {unit} per 1,000 events "
            f"(+/- {model['b_se'] * 1000:.4f}), c = {model['c']:.4f} {unit} per MB of state "
            f"(+/- {model['c_se']:.4f}); R^2 {model['r2']:.2f}, RMS residual "
            f"{model['rms_residual']:.2f} {unit} over {model['points']} points")


# -- the check and the table ----------------------------------------------------------------------
def scaling_check(points: list[dict], batches: int) -> Optional[dict]:
    """The state-scaling check over the points of one size, from runs of ``batches``
    micro-batches (n = batches / 4): 4 x the mean time of the points among micro-batches 2..4n
    over the mean of those among 2..n (see the module docstring), in wall time (the verdict)
    and in CPU time; None when no point is left among 2..n.

    :param points: the points of one layout at one size.
    :param batches: the micro-batches per run.
    """
    n = batches // 4
    first = [p for p in points if p["batch"] <= n]
    every = [p for p in points if p["batch"] <= 4 * n]
    if not first:
        return None

    def ratio(key: str) -> Optional[float]:
        if any(p[key] is None for p in every):
            return None
        return 4 * statistics.fmean(p[key] for p in every) / statistics.fmean(
            p[key] for p in first)

    wall = ratio("seconds")
    # The events read (and the state) by the last micro-batch of either window.
    return {"events_per_batch": points[0]["events"], "n": n, "ratio": wall,
            "cpu_ratio": ratio("cpu_seconds"), "within": wall <= SCALING_LIMIT,
            "first_batches": [p["batch"] for p in first],
            "events_read_ratio": every[-1]["events_read"] / first[-1]["events_read"],
            "sst_ratio": (every[-1]["sst_mb"] / first[-1]["sst_mb"]
                          if first[-1]["sst_mb"] else None),
            "rows_ratio": (every[-1]["state_rows"] / first[-1]["state_rows"]
                           if first[-1]["state_rows"] else None)}


def sizing_table(cpu_model: dict, trigger_s: float) -> str:
    """One layout's sizing table from its CPU model: per input rate (rows) and state size
    (columns), the core-seconds of one micro-batch every ``trigger_s`` and the cores that
    keep up, core-seconds over the trigger interval, rounded up.

    :param cpu_model: the layout's fit of ``cpu_seconds``.
    :param trigger_s: the trigger interval, seconds.
    """
    rows = [["events/s"] + [f"{gb:g} GB state" for gb in SIZING_STATE_GB]]
    for rate in SIZING_RATES:
        cells = []
        for gb in SIZING_STATE_GB:
            core_s = predict(cpu_model, rate * trigger_s, gb * 1000)
            cells.append(f"{core_s:,.0f} core-s, {max(1, math.ceil(core_s / trigger_s)):,} "
                         "cores")
        rows.append([f"{rate:,}"] + cells)
    return align_table(rows)


def _points_table(points: list[dict]) -> str:
    rows = [["events/batch", "batch", "events", "state MB", "SST MB", "wall s", "fitted",
             "residual", "CPU s", "fitted", "residual"]]
    for p in points:
        rows.append([f"{p['size']:,}", str(p["batch"]), f"{p['events']:,.0f}",
                     f"{p['state_mb']:.2f}", f"{p['sst_mb']:.2f}"]
                    + [fmt_number(p.get(key), fmt) for target in ("seconds", "cpu_seconds")
                       for key, fmt in ((target, ".2f"), (f"{target}_fitted", ".2f"),
                                        (f"{target}_residual", "+.2f"))])
    return align_table(rows)


# -- the mode -------------------------------------------------------------------------------------
def cost_model_mode(bench: Bench, args) -> dict:
    """Run every layout of ``args.cost_layouts`` at each of its sizes (``args.cost_batch_events``
    if given, else ``DEFAULT_BATCH_SIZES``); print the fits with their points, the
    state-scaling check and the sizing tables; return them all.

    :param bench: the benchmark's session, scratch space and samplers.
    :param args: the parsed command line.
    """
    layouts, batches = args.cost_layouts, args.cost_batches
    repeats, trigger_s = args.cost_repeats, args.cost_trigger_ms / 1000
    plan = {layout: list(args.cost_batch_events or DEFAULT_BATCH_SIZES[layout])
            for layout in layouts}
    cores = bench.spark.sparkContext.defaultParallelism
    print(f"\n== cost model: {batches} micro-batches per run, {repeats} run(s) per layout and "
          f"size (times: medians over the runs), on {cores} cores; events per micro-batch: "
          + "; ".join(f"{JOB_LAYOUT_LABELS[layout]} {', '.join(f'{s:,}' for s in sizes)}"
                      for layout, sizes in plan.items()) + " ==", flush=True)
    micro: dict = {(layout, size): [] for layout, sizes in plan.items() for size in sizes}
    runs, warmed = [], set()
    for size in sorted({size for sizes in plan.values() for size in sizes}):
        label = f"cost-{size}"
        dataset = make_dataset(bench.work / "data" / label, size * batches, batches, args.seed,
                               label, dormant_gap_prob=0.0)
        bench.run(CORE, dataset, 0)  # the answer every run is checked against
        here = [layout for layout in layouts if size in plan[layout]]
        for layout in here:
            if args.warmup and layout not in warmed:
                # Untimed: a layout's first tens of micro-batches in a JVM pay for JIT
                # compilation and for its Python workers' imports.
                log(f"[cost model] {JOB_LAYOUT_LABELS[layout]}: untimed warm-up run ...")
                backend, options = JOB_LAYOUTS[layout]
                bench.run(backend, dataset, 0, options=options)
                warmed.add(layout)
        for repeat, layout in interleaved(here, repeats):
            backend, options = JOB_LAYOUTS[layout]
            log(f"[cost model] {JOB_LAYOUT_LABELS[layout]}, {size:,} events per micro-batch, "
                f"run {repeat + 1} ...")
            result = bench.run(backend, dataset, repeat, options=options)
            log(f"[cost model]   {result.seconds:.1f}s, check {result.check}")
            micro[(layout, size)].append(result.micro_batches)
            runs.append({"layout": layout, "events_per_batch": size, **result.as_dict()})
        shutil.rmtree(dataset.root, ignore_errors=True)

    out: dict = {"cores": cores, "trigger_s": trigger_s, "batches": batches, "repeats": repeats,
                 "sizes": plan, "layouts": {}, "runs": runs}
    for layout in layouts:
        points, per_event = [], []
        for size in plan[layout]:
            size_points, bytes_per_event = run_points(micro[(layout, size)], batches)
            points += [{"size": size, **p} for p in size_points]
            per_event.append(bytes_per_event)
        wall, cpu = fit(points, "seconds"), fit(points, "cpu_seconds")
        out["layouts"][layout] = {"wall": wall, "cpu": cpu, "points": points,
                                  "sst_bytes_per_event": statistics.median(per_event)}
        print(f"\n-- {JOB_LAYOUT_LABELS[layout]}: time per micro-batch = a + b x events + "
              "c x state MB --")
        print(f"wall: {describe(wall, 's')}")
        print(f"CPU:  {describe(cpu, 'CPU s')}")
        print(f"state on disk per event read: {out['layouts'][layout]['sst_bytes_per_event']:.1f}"
              " B (median over the sizes)")
        print(_points_table(points))

    if DEFAULT_LAYOUT in layouts:
        _print_scaling(out, plan[DEFAULT_LAYOUT], batches)

    print(f"\n-- sizing: a micro-batch every {trigger_s:g} s; per cell, its core-seconds (the "
          "CPU fit above) and the cores that keep up (core-seconds over the trigger interval, "
          "rounded up) --")
    for layout in layouts:
        table = sizing_table(out["layouts"][layout]["cpu"], trigger_s)
        out["layouts"][layout]["sizing"] = table
        print(f"{JOB_LAYOUT_LABELS[layout]}:\n{table}")
    return out


def _print_scaling(out: dict, sizes: list[int], batches: int) -> None:
    """The state-scaling check of the default layout at each of ``sizes``, from runs of
    ``batches`` micro-batches, printed and added to ``out``."""
    points = out["layouts"][DEFAULT_LAYOUT]["points"]
    checks = [scaling_check([p for p in points if p["size"] == size], batches)
              for size in sizes]
    done = [c for c in checks if c is not None]
    out["scaling"] = {"limit": SCALING_LIMIT, "checks": done,
                      # None: nothing to judge (no size had a measured first quarter).
                      "within": all(c["within"] for c in done) if done else None}
    print(f"\n-- state scaling, {JOB_LAYOUT_LABELS[DEFAULT_LAYOUT]}: 4x the micro-batches at "
          f"the same events per micro-batch, at most {SCALING_LIMIT}x the time --")
    for size, c in zip(sizes, checks):
        if c is None:
            print(f"{size:,} events per micro-batch: no micro-batch among the first quarter "
                  "was measured (each overlapped the start-up or another query)")
            continue
        print(f"{c['events_per_batch']:,} events per micro-batch: {4 * c['n']} micro-batches "
              f"against {c['n']}: {c['ratio']:.2f}x the time "
              f"({'within' if c['within'] else 'NOT within'} {SCALING_LIMIT}x), "
              f"{fmt_number(c['cpu_ratio'], '.2f')}x the CPU time (first quarter measured by "
              f"micro-batch(es) {', '.join(map(str, c['first_batches']))}); events read "
              f"{c['events_read_ratio']:.2f}x, state store on disk "
              f"{fmt_number(c['sst_ratio'], '.2f')}x, state rows "
              f"{fmt_number(c['rows_ratio'], '.2f')}x")
    within = out["scaling"]["within"]
    if within is None:
        print("state scaling: not measured (rerun with more micro-batches, --cost-batches)")
    else:
        print(f"state scaling: {'within' if within else 'NOT within'} {SCALING_LIMIT}x at "
              "every size")
