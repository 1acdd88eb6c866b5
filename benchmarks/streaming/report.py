"""Reporting: the per-kind summaries (medians of repeats), the tables and the
small formatters every mode prints with, and the machine the numbers were taken on."""
from __future__ import annotations

import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .kinds import BATCH, CORE, NATIVE, RUN_LABELS, counterpart, run_label
from .sampling import MIB

if TYPE_CHECKING:
    from .runs import RunResult


@dataclass
class Summary:
    """The median of one kind's repeats, as one table row."""

    kind: str
    allowed_lateness_ms: int
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
    state_peak_sst_bytes: Optional[int]
    state_memory_bytes: Optional[int]
    check: str


def summarise(results: list[RunResult], variants: list[tuple[str, int]]) -> list[Summary]:
    """One row per variant of ``variants`` (``(kind, allowed lateness)``, see
    ``kinds.table_variants``) that has runs in ``results``, in that order; ratios are against
    the native count's medians.

    :param results: the runs.
    :param variants: the table's rows, in order.
    """
    by_kind = defaultdict(list)
    for r in results:
        by_kind[(r.kind, r.allowed_lateness_ms)].append(r)
    native = by_kind.get((NATIVE, 0))
    native_rate = statistics.median(r.events_per_s for r in native) if native else None
    native_cpu = statistics.median(r.memory.cpu_seconds for r in native) if native else None
    out = []
    for kind, lateness_ms in variants:
        runs = by_kind.get((kind, lateness_ms))
        if not runs:
            continue
        rate = statistics.median(r.events_per_s for r in runs)
        cpu = statistics.median(r.memory.cpu_seconds for r in runs)
        last = runs[-1]
        checks = sorted({r.check for r in runs})
        out.append(Summary(
            kind=kind, allowed_lateness_ms=lateness_ms, runs=len(runs),
            seconds=statistics.median(r.seconds for r in runs),
            events_per_s=rate, ratio=rate / native_rate if native_rate else None,
            cpu_seconds=cpu, cpu_ratio=native_cpu / cpu if native_cpu and cpu > 0 else None,
            jvm_mib=max(r.memory.jvm for r in runs) / MIB,
            workers_mib=max(r.memory.workers for r in runs) / MIB,
            driver_mib=max(r.memory.driver for r in runs) / MIB,
            total_mib=max(r.memory.total for r in runs) / MIB,
            batches=last.batches, state_final_rows=last.state.final_rows,
            state_peak_rows=last.state.peak_rows, state_sst_bytes=last.state.sst_bytes,
            state_peak_sst_bytes=max(last.state.bytes_per_batch, default=None),
            state_memory_bytes=last.state.memory_bytes,
            check=checks[0] if len(checks) == 1 else "; ".join(checks)))
    return out


def source_ratios(summaries: list[Summary]) -> list[dict]:
    """For each row of a kind that reads another input than the files (a Kafka topic) or writes
    another format than Parquet (Delta), its ratios to the row of the same query on the files
    into Parquet at the same allowed lateness (``kinds.counterpart``), in the table's
    convention: its events/s over theirs, their CPU seconds over its.

    :param summaries: the table's rows, as ``summarise`` returns them.
    """
    rows = {(s.kind, s.allowed_lateness_ms): s for s in summaries}
    out = []
    for s in summaries:
        other = counterpart(s.kind)
        files = rows.get((other[0], s.allowed_lateness_ms)) if other else None
        if files is None:
            continue
        out.append({"kind": s.kind, "files_kind": files.kind, "word": other[1],
                    "allowed_lateness_ms": s.allowed_lateness_ms,
                    "seconds": s.seconds, "files_seconds": files.seconds,
                    "ratio": s.events_per_s / files.events_per_s,
                    "cpu_ratio": files.cpu_seconds / s.cpu_seconds if s.cpu_seconds > 0
                    else None})
    return out


def fmt_number(value, fmt: str = ",.0f", none: str = "-") -> str:
    """``value`` formatted with ``fmt``, or ``none`` when it is missing.

    :param value: the number, or ``None``.
    :param fmt: the format spec.
    :param none: the text for a missing value.
    """
    return none if value is None else format(value, fmt)


def render_table(summaries: list[Summary]) -> str:
    """The main table: one line per summary, numbers right-aligned.

    :param summaries: the table's rows, as ``summarise`` returns them.
    """
    header = ("run", "events/s", "x native", "median s", "CPU s", "x native CPU", "JVM MiB",
              "workers MiB", "driver MiB", "total MiB", "batches", "state rows", "peak rows",
              "state SST", "peak SST", "check")
    rows = [header]
    for s in summaries:
        batches = fmt_number(s.batches, "d") if s.kind not in (BATCH, CORE) else "-"
        rows.append((run_label(s.kind, s.allowed_lateness_ms), fmt_number(s.events_per_s),
                     fmt_number(s.ratio, ".2f"), fmt_number(s.seconds, ".1f"),
                     fmt_number(s.cpu_seconds, ".1f"), fmt_number(s.cpu_ratio, ".2f"),
                     fmt_number(s.jvm_mib), fmt_number(s.workers_mib),
                     fmt_number(s.driver_mib), fmt_number(s.total_mib), batches,
                     fmt_number(s.state_final_rows), fmt_number(s.state_peak_rows),
                     fmt_bytes(s.state_sst_bytes), fmt_bytes(s.state_peak_sst_bytes), s.check))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:-1])]
        lines.append("  ".join(cells + [r[-1]]))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def align_table(rows: list) -> str:
    """``rows`` of text cells, the header first, as a table: the first column left-aligned, the
    others right-aligned, a rule under the header.

    :param rows: the rows, each a list of text cells; the header first.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join([row[0].ljust(widths[0])]
                       + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])])
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_bytes(value: Optional[int]) -> str:
    """A byte count in KiB or MiB.

    :param value: the byte count, or ``None``.
    """
    if value is None:
        return "-"
    if value >= MIB:
        return f"{value / MIB:.1f} MiB"
    return f"{value / 1024:.0f} KiB"


def fmt_seconds(seconds: float) -> str:
    """A duration of event time in the largest unit that keeps it at least 1: s, min, h or days.

    :param seconds: the duration, seconds.
    """
    for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def machine_description() -> str:
    """Cores, CPU model, memory and the Python, PySpark and Java versions."""
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
    """The version ``java -version`` reports, or "unknown"."""
    import subprocess

    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        first = (out.stderr or out.stdout).splitlines()[0]
        return first.split('"')[1] if '"' in first else first
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def print_main(section: dict, args) -> None:
    """Print one dataset's table (``section``, from ``modes.main_table``) and its state encoding;
    ``args`` gives the file batching and repeats it was run with.

    :param section: one dataset's results.
    :param args: the parsed command line.
    """
    profile = section["profile"]
    spans = section["batch_event_time_s"]
    print(f"\n== {section['label']}, {profile['name']} profile ({profile['description']}): "
          f"{section['records']:,} input records (Parquet, {section['files']} files incl. "
          f"heartbeat, maxFilesPerTrigger={args.max_files_per_trigger}), median of "
          f"{args.repeats} interleaved run(s) ==")
    if spans:
        print(f"event time per micro-batch (heartbeat aside): median "
              f"{fmt_seconds(statistics.median(spans))}, longest {fmt_seconds(max(spans))}; "
              f"all of it {fmt_seconds(section['event_time_s'])}")
    print(section["table"])
    for r in section["source_ratios"]:
        print(f"{run_label(r['kind'], r['allowed_lateness_ms'])}: {r['word']} {r['ratio']:.2f} "
              f"(events/s over those of '{RUN_LABELS[r['files_kind']]}', the same query on the "
              f"files into Parquet), {r['word']} CPU {fmt_number(r['cpu_ratio'], '.2f')}; "
              f"median {r['seconds']:.1f}s against {r['files_seconds']:.1f}s")
    print(f"goals {section['goals']:,}, attributed {section['attributed']:,} (from the core; "
          "every Spark run's counts must match: column 'check')")
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


def plateau_verdict(rows: list[int]) -> str:
    """Compare the state in the last third of the batches (the heartbeat's batch excluded, since
    it moves the watermark past everything) with the middle third.

    :param rows: the state rows at the end of each micro-batch, in order.
    """
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


def evenly_spaced(values: list, width: int = 12) -> list:
    """About ``width`` evenly spaced values, the last one always included.

    :param values: the values to pick from.
    :param width: about how many to pick.
    """
    if len(values) <= width:
        return list(values)
    step = len(values) / (width - 1)
    return [values[int(i * step)] for i in range(width - 1)] + [values[-1]]


def sparkline(values: list[int], width: int = 12) -> str:
    """About ``width`` of ``values``, evenly spaced, shortened and bracketed.

    :param values: the values to show.
    :param width: about how many to show.
    """
    if not values:
        return "-"
    return "[" + " ".join(_short(v) for v in evenly_spaced(values, width)) + "]"


def _short(v: int) -> str:
    return f"{v / 1000:.0f}k" if v >= 10_000 else str(v)

