"""spark-submit entry point: the click-through join of ad impressions to the visits they caused.

    spark-submit jobs/join_job.py --events DIR [options]
    python jobs/join_job.py --events DIR [options]

A visit is caused by an impression when it is the same user, the visit's url is the impression's
target_url, and the visit's referer is the impression's source_url. The join is built with
``joins.stream_join`` under the chosen cleanup strategy; its output is the columns of both sides,
prefixed ``impression_`` and ``visit_``, written as Parquet through Spark's exactly-once file sink.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attribution.config import DEFAULT_WATERMARK_DELAY, parse_duration_ms, spark_interval
from attribution.spark.pipeline import apply_trigger
from attribution.spark.readers import read_event_stream
from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from jobs.runtime import (
    add_stream_options,
    check_input,
    check_sink_directory,
    default_log_file,
    start_spark,
    unexpected_failure,
)
from joins import (
    JOIN_TYPES,
    JoinSide,
    JoinSpecError,
    JoinStateCollector,
    StateKeyCondition,
    StateValueCondition,
    check_cleanup,
    filter_above_watermark,
    inspect_join,
    stream_join,
)
from joins.inspect import InspectionError

# The job's own defaults: how long after an impression a visit still counts as its click, and the
# tumbling window that must hold both for the state-key strategy.
DEFAULT_MAX_DELAY = "30 minutes"
DEFAULT_WINDOW = "1 hour"
STRATEGY_CHOICES = ("state-key", "state-value", "mixed")

# Name of the observed metric that counts the rows written per micro-batch (the file sink itself
# reports no output count).
OUTPUT_METRICS = "click_join_output"

# (impression column, visit column) pairs that must be equal.
CLICK_KEYS = (("user_id", "user_id"), ("target_url", "url"), ("source_url", "referer"))

DESCRIPTION = """\
Click-through join: ad impressions joined to the landing visits they caused (same user_id,
impression.target_url == visit.url, impression.source_url == visit.referer), on two streams of
the same spec-event directory: one filtered to impressions, one to visits.

Each side's watermark is max(event time seen) - its delay, applied before the split by event
type, so heartbeat records advance both. The query's watermark W is the minimum of the two.
Rows at or below W are late and dropped. The strategy decides how the join's state is cleaned:

  strategy     time condition                            state evicted when
  state-key    window(imp.ts) == window(visit.ts)         the window has ended: window.end <= W
  state-value  imp.ts <= visit.ts <= imp.ts + max-delay   impression: imp.ts <= W - max-delay - 1 ms
                                                          visit: visit.ts <= W - 1 ms
  mixed        both conditions                            as state-key (Spark prefers the key)

Outer joins emit an unmatched row, padded with nulls, in the micro-batch that evicts it.
"""

EXAMPLES = """\
examples:
  # all files in DIR, one per micro-batch, then stop; state-value strategy
  python jobs/join_job.py --events DIR --max-files-per-trigger 1 --strategy state-value

  # impressions without a click, emitted once their 30-minute range has passed
  spark-submit jobs/join_job.py --events DIR --how left_outer --metrics out/clicks-metrics.json

Output columns: impression_event_id, impression_user_id, ..., visit_event_id, visit_url, ...
(with --how left_semi: the impression columns only, one row per clicked impression).
--metrics FILE.json records the strategy Spark chose per side (read from the executed plan),
whether it matches the operator's promise, and the join's state rows per micro-batch.
"""


def _duration(text: str) -> str:
    try:
        parse_duration_ms(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="join_job.py", description=DESCRIPTION, epilog=EXAMPLES + "\n" + exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_options(parser, default_output="out/clicks", default_checkpoint="out/checkpoints/clicks")
    parser.add_argument("--strategy", choices=STRATEGY_CHOICES, default="state-value",
                        help="state cleanup strategy, see the table above (default: %(default)s)")
    parser.add_argument("--how", choices=tuple(JOIN_TYPES), default="inner",
                        help="join type; left = impressions, right = visits (default: %(default)s)")
    parser.add_argument("--window", type=_duration, default=DEFAULT_WINDOW, metavar="DURATION",
                        help="tumbling window that must hold both the impression and the visit, "
                             "for state-key and mixed (default: %(default)s)")
    parser.add_argument("--max-delay", type=_duration, default=DEFAULT_MAX_DELAY, metavar="DURATION",
                        help="longest time from impression to visit, for state-value and mixed "
                             "(default: %(default)s)")
    parser.add_argument("--watermark-delay", type=_duration, default=DEFAULT_WATERMARK_DELAY,
                        metavar="DURATION",
                        help="watermark delay of both sides unless set per side (default: %(default)s)")
    parser.add_argument("--impression-watermark-delay", type=_duration, default=None, metavar="DURATION",
                        help="watermark delay of the impression side (default: --watermark-delay)")
    parser.add_argument("--visit-watermark-delay", type=_duration, default=None, metavar="DURATION",
                        help="watermark delay of the visit side (default: --watermark-delay)")
    parser.add_argument("--metrics", default=None, metavar="FILE.json",
                        help="write the detected strategy per side and the per-batch join state "
                             "rows to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    args = parser.parse_args(argv)
    if not Path(args.events).is_dir() and "://" not in args.events:
        parser.error(f"--events {args.events!r} is not a directory")
    if args.max_files_per_trigger is not None and args.max_files_per_trigger < 1:
        parser.error("--max-files-per-trigger must be >= 1")
    args.impression_watermark_delay = args.impression_watermark_delay or args.watermark_delay
    args.visit_watermark_delay = args.visit_watermark_delay or args.watermark_delay
    return args


def conditions(args) -> dict:
    """The time conditions of the requested strategy."""
    out = {}
    if args.strategy in ("state-key", "mixed"):
        out["state_key"] = StateKeyCondition(window=args.window)
    if args.strategy in ("state-value", "mixed"):
        out["state_value"] = StateValueCondition(lower=0, upper=args.max_delay)
    return out


def build_click_join(events, args):
    """Split the event stream into watermarked impressions and visits and join them."""
    from pyspark.sql import functions as F

    # One read of the directory, two watermarks: each is applied before the split by type, and
    # every filter is kept above it, so heartbeats advance both; both sides see every file in the
    # same micro-batch.
    impression_delay_ms = parse_duration_ms(args.impression_watermark_delay)
    visit_delay_ms = parse_duration_ms(args.visit_watermark_delay)
    impressions = filter_above_watermark(
        events.withWatermark("ts", spark_interval(impression_delay_ms)),
        F.col("event_type") == "impression")
    visits = filter_above_watermark(
        events.withWatermark("ts", spark_interval(visit_delay_ms)),
        F.col("event_type") == "visit")
    return stream_join(
        JoinSide(impressions, "ts", impression_delay_ms, prefix="impression_", name="impression"),
        JoinSide(visits, "ts", visit_delay_ms, prefix="visit_", name="visit"),
        list(CLICK_KEYS), how=args.how, **conditions(args))


class ClickJoinRun:
    """Follows one query: per-batch progress lines, the detected cleanup, and the metrics."""

    def __init__(self, query, expected, quiet: bool = False):
        self.query = query
        self.expected = expected
        self.quiet = quiet
        self.state = JoinStateCollector()
        self.inspection = None
        self.inspection_error = None
        self.written: dict[int, int] = {}  # batch id -> rows written
        self.input_rows = 0

    @property
    def output_rows(self) -> int:
        return sum(self.written.values())

    def poll(self) -> None:
        for progress in self.query.recentProgress:
            if "addBatch" not in (progress["durationMs"] or {}):
                continue  # an idle trigger: no micro-batch ran
            observed = (progress["observedMetrics"] or {}).get(OUTPUT_METRICS)
            for row in self.state.add(progress):
                self.input_rows += row.input_rows
                self.written[row.batch_id] = observed["rows"] if observed is not None else 0
                if not self.quiet:
                    print(f"batch {row.batch_id}: read {row.input_rows} rows (each side reads "
                          f"every file), wrote {self.written[row.batch_id]} rows, join state "
                          f"{row.total} rows (updated {row.updated}, removed {row.removed}, late "
                          f"dropped {row.dropped_by_watermark}), watermark {row.watermark}",
                          file=sys.stderr, flush=True)
                if self.inspection is None:
                    self.inspect()

    def inspect(self) -> None:
        try:
            self.inspection = inspect_join(self.query)
            self.inspection_error = None
        except InspectionError as err:
            self.inspection_error = str(err)

    def mismatches(self) -> list[str]:
        return check_cleanup(self.expected, self.inspection) if self.inspection else []

    def metrics(self, args) -> dict:
        detected = None
        if self.inspection is not None:
            detected = {
                "impression": asdict(self.inspection.left),
                "visit": asdict(self.inspection.right),
                "join_type": self.inspection.join_type,
                "eviction_watermark_ms": self.inspection.eviction_watermark_ms,
                "batch_id": self.inspection.batch_id,
            }
        rows = self.state.rows()
        return {
            "strategy": args.strategy, "how": args.how,
            "watermark_delay": {"impression": args.impression_watermark_delay,
                                "visit": args.visit_watermark_delay},
            "expected": self.expected.to_dict(),
            "detected": detected,
            "inspection_error": self.inspection_error,
            "matches_expected": self.inspection is not None and not self.mismatches(),
            "mismatches": self.mismatches(),
            "batches": [{**r.to_dict(), "output_rows": self.written.get(r.batch_id)} for r in rows],
            "totals": {"batches": len(rows), "input_rows": self.input_rows,
                       "output_rows": self.output_rows,
                       "dropped_by_watermark": sum(r.dropped_by_watermark for r in rows),
                       "final_state_rows": rows[-1].total if rows else None},
        }

    def report(self, args) -> str:
        rows = self.state.rows()
        lines = [f"click-through join ({args.strategy}, {args.how}) finished: {len(rows)} batch(es), "
                 f"{self.input_rows} input rows, {self.output_rows} rows written to {args.output}",
                 f"  late rows dropped: {sum(r.dropped_by_watermark for r in rows)}",
                 f"  final join state rows: {rows[-1].total if rows else 'n/a'}, "
                 f"watermark {rows[-1].watermark if rows else 'n/a'}"]
        if self.inspection is None:
            lines.append(f"  Spark's cleanup: not inspected ({self.inspection_error or 'no batch ran'})")
        else:
            lines.append(f"  Spark's cleanup: impression {self.inspection.left.strategy}, "
                         f"visit {self.inspection.right.strategy}")
            problems = self.mismatches()
            lines.append("  matches the operator's promise" if not problems
                         else "  WARNING, differs from the operator's promise: " + "; ".join(problems))
        return "\n".join(lines)


def run(spark, args) -> ClickJoinRun:
    """Start the join and follow it until the trigger finishes (available-now) or Ctrl-C."""
    events = read_event_stream(spark, args.events, args.format, args.max_files_per_trigger)
    result = build_click_join(events, args)
    if not args.quiet:
        print("operator's promise:\n" + result.describe(), file=sys.stderr, flush=True)
    from pyspark.sql import functions as F

    output = result.df.observe(OUTPUT_METRICS, F.count(F.lit(1)).alias("rows"))
    writer = (output.writeStream.format("parquet").outputMode("append")
              .option("path", args.output).option("checkpointLocation", args.checkpoint)
              .queryName("click_join"))
    query = apply_trigger(writer, args.trigger).start()
    follow = ClickJoinRun(query, result.expected, quiet=args.quiet)
    try:
        while not query.awaitTermination(1):
            follow.poll()
    except KeyboardInterrupt:
        print("stopping: interrupted; restart with the same --checkpoint to resume", file=sys.stderr)
        query.stop()
    follow.poll()
    follow.inspect()  # the last batch's plan carries the final eviction watermark
    return follow


def write_metrics(follow: ClickJoinRun, args) -> None:
    """Write ``--metrics`` (if given): detected strategy per side and per-batch state rows."""
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics).write_text(json.dumps(follow.metrics(args), indent=2) + "\n")


def main(argv=None) -> int:
    """Run the join; returns its exit code (``commandline.exits.ExitCode``): one ``error:`` line
    for a failure, Spark's log in --log-file, SIGINT/SIGTERM stop the query and report."""
    args = parse_args(argv)
    log_file = args.log_file or default_log_file("click-join")
    with StopRequests(interrupt=True) as stop:  # run() stops the query on KeyboardInterrupt
        started_log = None
        try:
            check_input(args.events, args.format)
            check_writable_dir(args.checkpoint, "--checkpoint", ExitCode.CHECKPOINT)
            check_sink_directory(args.output, "--output", args.checkpoint)
            spark, started_log = start_spark("click-join", args.master, args.shuffle_partitions,
                                             log_file, args.quiet, stop)
            follow = run(spark, args)
        except JoinSpecError as err:
            return report_failure(Failure(ExitCode.USAGE, str(err)))
        except Failure as failure:
            return report_failure(failure)
        except KeyboardInterrupt:  # the signal came outside run()'s loop
            print(f"stopped by {stop.signal_name}", file=sys.stderr)
            return int(stop.exit_code)
        except Exception as err:
            return report_failure(unexpected_failure(err, started_log or log_file))
    print(follow.report(args))
    write_metrics(follow, args)
    return int(stop.exit_code)


if __name__ == "__main__":
    sys.exit(main())
