"""spark-submit entry point: the click-through join of ad impressions to the visits they caused.

    spark-submit jobs/join_job.py --events DIR [options]
    python jobs/join_job.py --events DIR [options]

A visit is caused by an impression when it is the same user, the visit's url is the impression's
target_url, and the visit's referer is the impression's source_url. The input is validated like
the attribution job's (invalid records go to a dead letter with their reason), each side is
deduplicated by ``event_id`` within its watermark, and the join is built with
``joins.stream_join`` under the chosen cleanup strategy. Its rows, in the columns of
``CLICK_COLUMNS``, are written as Parquet through Spark's exactly-once file sink.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attribution.config import DEFAULT_WATERMARK_DELAY, parse_duration_ms, spark_interval
from attribution.schema import EVENT_SCHEMA, field_kinds
from attribution.spark.pipeline import apply_trigger
from attribution.spark.query_progress import micro_batch_ran
from attribution.spark.validation import (
    DEFAULT_MAX_FUTURE_SKEW,
    VALIDATION_METRICS,
    classify,
    max_future_skew_ms,
    read_raw_stream,
    start_dead_letter_stream,
    valid_events,
)
from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from jobs.runtime import (
    add_stream_options,
    check_input,
    check_sink_directory,
    default_log_file,
    run_with_dead_letter,
    start_spark,
    unexpected_failure,
)
from joins import (
    JOIN_TYPES,
    JoinSide,
    JoinSpecError,
    JoinStateCollector,
    SideCleanup,
    StateKeyCondition,
    StateValueCondition,
    check_cleanup,
    filter_above_watermark,
    inspect_join,
    stream_join,
)
from joins.durations import format_duration_ms, ms_to_iso
from joins.inspect import DetectedSide, InspectionError
from joins.metrics import progress_dict

# The job's own defaults: how long after an impression a visit still counts as its click, and the
# tumbling window that must hold both for the state-key strategy.
DEFAULT_MAX_DELAY = "30 minutes"
DEFAULT_WINDOW = "1 hour"
STRATEGY_CHOICES = ("state-key", "state-value", "mixed")

# Observed metrics: the rows written per micro-batch (the file sink reports no output count) and
# the records read (the progress's input count has every record twice: both sides scan the files).
OUTPUT_METRICS = "click_join_output"
INPUT_METRICS = "click_join_input"
# Spark's name of the dropDuplicatesWithinWatermark operator in query progress.
DEDUP_OPERATOR_NAME = "dedupeWithinWatermark"

# (impression column, visit column) pairs that must be equal.
CLICK_KEYS = (("user_id", "user_id"), ("target_url", "url"), ("source_url", "referer"))
SIDES = ("impression", "visit")


@dataclass(frozen=True)
class OutputColumn:
    """One output column: the event field it holds, from which side, and what it means.

    ``side`` is ``impression``, ``visit``, or ``either`` (the impression's value, or for a visit
    without an impression in an outer join, the visit's). The type is the event field's.
    """

    name: str
    side: str
    field: str
    doc: str

    def kind(self) -> str:
        """The column's type, as ``attribution.schema.type_kind`` names it (e.g. ``timestamp``)."""
        return field_kinds(EVENT_SCHEMA)[self.field][0]


# The output schema, defined here once: the select after the join, the columns of each side fed
# to it, and the --help text are all derived from it.
CLICK_COLUMNS = (
    OutputColumn("user_id", "either", "user_id", "the user who saw the ad and visited"),
    OutputColumn("impression_id", "impression", "impression_id", "the ad impression's id"),
    OutputColumn("impression_event_id", "impression", "event_id", "event_id of the impression"),
    OutputColumn("impression_ts", "impression", "ts", "when the ad was shown"),
    OutputColumn("impression_source_url", "impression", "source_url",
                 "page that showed the ad (= visit_referer)"),
    OutputColumn("impression_target_url", "impression", "target_url",
                 "the ad's landing page (= visit_url)"),
    OutputColumn("visit_event_id", "visit", "event_id", "event_id of the visit"),
    OutputColumn("visit_ts", "visit", "ts", "when the landing page was visited"),
    OutputColumn("visit_url", "visit", "url", "the page visited"),
    OutputColumn("visit_referer", "visit", "referer", "the page the visit came from"),
    OutputColumn("visit_is_goal", "visit", "is_goal", "whether the visit is a conversion"),
)


def output_columns(how: str) -> tuple[OutputColumn, ...]:
    """The output columns of a join type: a semi join has the impression's only.

    :param how: the join type, one of ``JOIN_TYPES``.
    """
    if how == "left_semi":
        return tuple(c for c in CLICK_COLUMNS if c.side != "visit")
    return CLICK_COLUMNS


def side_fields(side: str) -> list[str]:
    """The event fields one side feeds to the join: its output columns' and the join keys.

    :param side: ``impression`` or ``visit``.
    """
    keys = [pair[SIDES.index(side)] for pair in CLICK_KEYS]
    wanted = keys + [c.field for c in CLICK_COLUMNS if c.side in (side, "either")]
    return list(dict.fromkeys(["event_id", "ts", *wanted]))


DESCRIPTION = """\
Click-through join: ad impressions joined to the landing visits they caused (same user_id,
impression.target_url == visit.url, impression.source_url == visit.referer), on two streams of
the same spec-event directory: one filtered to impressions, one to visits.

Invalid records (malformed JSON, missing or wrongly typed fields, unknown event types, strings
over 8192 chars, timestamps beyond --max-future-skew) are validated as by the attribution job:
they never reach the watermark, and are written with their reason to --dead-letter.

Each side's watermark is max(event time seen) - its delay, applied before the split by event
type, so heartbeat records advance both. The query's watermark W is the minimum of the two.
Rows at or below W are late and dropped. Each side is deduplicated by event_id: a copy of a
record (same event_id) is dropped while W is below the first copy's ts + the side's watermark
delay; after that, a copy with the same ts is late. So a redelivered record never joins twice.
The strategy decides how the join's state is cleaned:

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
"""

METRICS_HELP = """\
--metrics FILE.json records, readably: the watermark and deduplication rules, per side the
strategy promised and the one Spark chose (read from the executed plan), the eviction rule in
words with its threshold as an ISO time, whether Spark matches the promise, and per micro-batch
the records read, invalid, duplicates and late rows dropped, join state rows and rows written.
Spark's raw plan text of the join is kept apart, under "spark_plan".
"""


def schema_help() -> str:
    """The output schema as --help text, from ``CLICK_COLUMNS``."""
    width = max(len(c.name) for c in CLICK_COLUMNS)
    lines = ["output columns (Parquet; with --how left_semi only user_id and the impression_ "
             "columns; in an", "outer join, the columns of the side without a match are null):"]
    lines += [f"  {c.name:<{width}}  {c.kind():<9}  {c.doc}" for c in CLICK_COLUMNS]
    return "\n".join(lines) + "\n"


def _duration(text: str) -> str:
    try:
        parse_duration_ms(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="join_job.py", description=DESCRIPTION,
        epilog="\n".join((EXAMPLES, schema_help(), METRICS_HELP, exit_codes_help())),
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
    parser.add_argument("--dead-letter", default=None, metavar="DIR",
                        help="Parquet directory for invalid records (raw record, reason, source "
                             "file, detection time), written by a second exactly-once streaming "
                             "query (default: <output>-dead-letter)")
    parser.add_argument("--max-future-skew", type=_duration, default=DEFAULT_MAX_FUTURE_SKEW,
                        metavar="DURATION",
                        help="reject events whose ts is more than this ahead of their file's "
                             "modification time, so that one bad clock cannot drag the watermark "
                             "forward and make every later event late (default: %(default)s)")
    parser.add_argument("--metrics", default=None, metavar="FILE.json",
                        help="write the cleanup rules, Spark's strategy per side and per-batch "
                             "counts to this JSON file (see below)")
    parser.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    args = parser.parse_args(argv)
    if not Path(args.events).is_dir() and "://" not in args.events:
        parser.error(f"--events {args.events!r} is not a directory")
    if args.max_files_per_trigger is not None and args.max_files_per_trigger < 1:
        parser.error("--max-files-per-trigger must be >= 1")
    args.impression_watermark_delay = args.impression_watermark_delay or args.watermark_delay
    args.visit_watermark_delay = args.visit_watermark_delay or args.watermark_delay
    args.max_future_skew_ms = max_future_skew_ms(args.max_future_skew)
    if args.dead_letter is None:
        args.dead_letter = args.output.rstrip("/") + "-dead-letter"
    return args


def conditions(args) -> dict:
    """The time conditions of the requested strategy."""
    out = {}
    if args.strategy in ("state-key", "mixed"):
        out["state_key"] = StateKeyCondition(window=args.window)
    if args.strategy in ("state-value", "mixed"):
        out["state_value"] = StateValueCondition(lower=0, upper=args.max_delay)
    return out


def _side(events, event_type: str, delay_ms: int):
    """One side of the join: watermarked, split off by event type, deduplicated by event_id."""
    from pyspark.sql import functions as F

    # The watermark comes first: filter_above_watermark keeps the split above it, so heartbeats
    # and the other side's rows advance it; dropDuplicatesWithinWatermark needs it, remembers each
    # event_id until W passes the first copy's ts + delay, and drops copies arriving later as late.
    rows = filter_above_watermark(events.withWatermark("ts", spark_interval(delay_ms)),
                                  F.col("event_type") == event_type)
    return rows.select(*side_fields(event_type)).dropDuplicatesWithinWatermark(["event_id"])


def build_click_join(events, args):
    """Split valid events into deduplicated, watermarked impressions and visits, join them, and
    select ``CLICK_COLUMNS``; return the ``JoinResult``.

    :param events: a stream of valid events (``valid_events``), not yet watermarked.
    :param args: the parsed command line (strategy, join type, window, delays).
    """
    from pyspark.sql import functions as F

    # One read of the directory, two watermarks: both sides see every file in the same batch.
    impression_delay_ms = parse_duration_ms(args.impression_watermark_delay)
    visit_delay_ms = parse_duration_ms(args.visit_watermark_delay)
    result = stream_join(
        JoinSide(_side(events, "impression", impression_delay_ms), "ts", impression_delay_ms,
                 prefix="impression_", name="impression"),
        JoinSide(_side(events, "visit", visit_delay_ms), "ts", visit_delay_ms,
                 prefix="visit_", name="visit"),
        list(CLICK_KEYS), how=args.how, **conditions(args))

    def column(c: OutputColumn):
        if c.side == "either":
            sources = [F.col(f"{side}_{c.field}") for side in SIDES
                       if f"{side}_{c.field}" in result.df.columns]
            return F.coalesce(*sources).alias(c.name)
        return F.col(f"{c.side}_{c.field}").alias(c.name)

    return replace(result, df=result.df.select(*(column(c) for c in output_columns(args.how))))


# -- the metrics, in words -------------------------------------------------------------------

def exact_duration(ms: int) -> str:
    """A duration as ``format_duration_ms`` writes it, exact to the millisecond
    (``1800001`` -> ``"30 min and 1 ms"``).

    :param ms: the duration in milliseconds, not negative.
    """
    text = format_duration_ms(ms)
    if parse_duration_ms(text) == ms:
        return text
    whole = ms - ms % 1000
    if ms % 1000 and whole and parse_duration_ms(format_duration_ms(whole)) == whole:
        return f"{format_duration_ms(whole)} and {ms % 1000} ms"
    return f"{ms} ms"


def _iso(ms: Optional[int]) -> Optional[str]:
    return None if ms is None else ms_to_iso(ms)


def _a(name: str) -> str:
    return ("an " if name[:1] in "aeiou" else "a ") + name


def promised_rule(side: SideCleanup, window: str) -> str:
    """The operator's eviction predicate for one side, in words relative to the watermark.

    :param side: the side's promised cleanup (``ExpectedCleanup.left`` or ``.right``).
    :param window: the tumbling window as given on the command line, for a window predicate.
    """
    if not side.cleanable:
        return f"{side.name} rows are never dropped from the join state"
    offset = side.offset_ms
    bound = "the watermark" if offset == 0 else (
        f"the watermark {'minus' if offset < 0 else 'plus'} {exact_duration(abs(offset))}")
    what = (f"the end of its {window} window ({side.column}.{side.field})" if side.field
            else f"its {side.column}")
    return (f"{_a(side.name)} row (the join's {side.side} side) is dropped from the join state "
            f"once {what} is at or below {bound}")


def detected_rule(name: str, side: DetectedSide) -> str:
    """Spark's eviction predicate for one side, in words with its threshold as an ISO time.

    :param name: the side's name (``impression`` or ``visit``).
    :param side: what ``inspect_join`` read from the executed plan for that side.
    """
    if side.strategy == "none" or side.threshold_ms is None:
        return f"Spark never drops {name} rows from the join state"
    column = f"{side.column}.{side.field}" if side.field else side.column
    return (f"Spark drops {_a(name)} row from the join state once its {column} is at or below "
            f"{ms_to_iso(side.threshold_ms)}")


class ClickJoinRun:
    """Follows one query: per-batch progress lines, the detected cleanup, and the metrics."""

    def __init__(self, query, expected, quiet: bool = False):
        self.query = query
        self.expected = expected
        self.quiet = quiet
        self.state = JoinStateCollector()
        self.inspection = None
        self.inspection_error = None
        self.batches: dict[int, dict] = {}  # batch id -> that batch's counts

    def total(self, key: str) -> int:
        return sum(b[key] for b in self.batches.values())

    @property
    def output_rows(self) -> int:
        return self.total("output_rows")

    def poll(self) -> None:
        for progress in self.query.recentProgress:
            p = progress_dict(progress)
            if not micro_batch_ran(p):
                continue
            for row in self.state.add(p):
                self.batches[row.batch_id] = batch = self._counts(p, row)
                if not self.quiet:
                    print(f"batch {row.batch_id}: read {batch['records_read']} records "
                          f"({batch['invalid']} invalid, dead-lettered; "
                          f"{batch['duplicates_dropped']} duplicates and "
                          f"{batch['dropped_by_watermark']} late rows dropped), wrote "
                          f"{batch['output_rows']} rows, join state {row.total} rows (updated "
                          f"{row.updated}, removed {row.removed}), watermark {row.watermark}",
                          file=sys.stderr, flush=True)
                if self.inspection is None:
                    self.inspect()

    @staticmethod
    def _counts(p: dict, row) -> dict:
        observed = p.get("observedMetrics") or {}

        def metric(name: str, field: str) -> int:
            return observed[name][field] if name in observed else 0

        dedup = [op for op in p.get("stateOperators") or []
                 if op.get("operatorName") == DEDUP_OPERATOR_NAME]
        return {
            "batch_id": row.batch_id,
            "records_read": metric(INPUT_METRICS, "records"),
            "invalid": metric(VALIDATION_METRICS, "invalid"),
            "duplicates_dropped": sum(int((op.get("customMetrics") or {})
                                          .get("numDroppedDuplicateRows", 0)) for op in dedup),
            # A late row is dropped by the first stateful operator it meets: a side's dedup.
            "dropped_by_watermark": row.dropped_by_watermark + sum(
                int(op.get("numRowsDroppedByWatermark", 0)) for op in dedup),
            "output_rows": metric(OUTPUT_METRICS, "rows"),
            "join_state_rows": row.total,
            "join_state_rows_updated": row.updated,
            "join_state_rows_removed": row.removed,
            "dedup_state_rows": sum(int(op.get("numRowsTotal", 0)) for op in dedup),
            "watermark": row.watermark,
        }

    def inspect(self) -> None:
        try:
            self.inspection = inspect_join(self.query)
            self.inspection_error = None
        except InspectionError as err:
            self.inspection_error = str(err)

    def mismatches(self) -> list[str]:
        return check_cleanup(self.expected, self.inspection) if self.inspection else []

    def metrics(self, args) -> dict:
        """The run as a readable JSON document (``--metrics``)."""
        delays = {"impression": args.impression_watermark_delay, "visit": args.visit_watermark_delay}
        policy = "lower" if self.expected.watermark_policy == "min" else "higher"
        promised = {side.name: {"strategy": side.strategy, "rule": promised_rule(side, args.window)}
                    for side in self.expected.sides()}
        detected = spark_plan = None
        if self.inspection is not None:
            inspection = self.inspection
            detected = {"batch_id": inspection.batch_id,
                        "watermark": _iso(inspection.eviction_watermark_ms)}
            spark_plan = {"batch_id": inspection.batch_id, "join_node": inspection.node,
                          "late_events_watermark_ms": inspection.late_events_watermark_ms,
                          "eviction_watermark_ms": inspection.eviction_watermark_ms}
            for name, side in zip(SIDES, inspection.sides()):
                detected[name] = {"strategy": side.strategy, "rule": detected_rule(name, side),
                                  "threshold": _iso(side.threshold_ms)}
                spark_plan[f"{name}_predicate"] = side.predicate
        batches = [self.batches[b] for b in sorted(self.batches)]
        return {
            "strategy": args.strategy, "how": args.how,
            "watermark_delay": delays,
            # Both sides' watermarks see every valid record: they are applied before the split.
            "watermark": (f"W is the {policy} of the impression side's watermark (latest ts - "
                          f"{exact_duration(parse_duration_ms(delays['impression']))}) and the "
                          f"visit side's (latest ts - "
                          f"{exact_duration(parse_duration_ms(delays['visit']))}), the latest ts "
                          "taken over every valid record, heartbeats included; a row whose ts is "
                          "at or below W when it arrives is late and dropped"),
            "deduplication": ("records with the same event_id count once per side: a copy is "
                              "dropped while W is below the first copy's ts plus that side's "
                              "watermark delay; later, a copy with the same ts is late"),
            "promised": promised,
            "detected": detected,
            "inspection_error": self.inspection_error,
            "matches_expected": self.inspection is not None and not self.mismatches(),
            "mismatches": self.mismatches(),
            "dead_letter": args.dead_letter,
            "batches": batches,
            "totals": {"batches": len(batches),
                       **{key: self.total(key) for key in (
                           "records_read", "invalid", "duplicates_dropped",
                           "dropped_by_watermark", "output_rows")},
                       "final_join_state_rows": batches[-1]["join_state_rows"] if batches else None,
                       "final_watermark": batches[-1]["watermark"] if batches else None},
            "spark_plan": spark_plan,
        }

    def report(self, args, stopped_by: Optional[str] = None) -> str:
        """The final report; ``stopped_by`` names the signal that stopped the run, if one did."""
        batches = [self.batches[b] for b in sorted(self.batches)]
        last = batches[-1] if batches else {}
        ending = f"stopped by {stopped_by}" if stopped_by else "finished"
        lines = [f"click-through join ({args.strategy}, {args.how}) {ending}: {len(batches)} "
                 f"batch(es), {self.total('records_read')} records read, {self.output_rows} rows "
                 f"written to {args.output}",
                 f"  invalid records: {self.total('invalid')} (dead letter: {args.dead_letter})",
                 f"  duplicates dropped: {self.total('duplicates_dropped')}, late rows dropped: "
                 f"{self.total('dropped_by_watermark')}",
                 f"  final join state rows: {last.get('join_state_rows', 'n/a')}, "
                 f"watermark {last.get('watermark', 'n/a')}"]
        if self.inspection is None:
            lines.append(f"  Spark's cleanup: not inspected ({self.inspection_error or 'no batch ran'})")
        else:
            lines.append(f"  Spark's cleanup: impression {self.inspection.left.strategy}, "
                         f"visit {self.inspection.right.strategy}")
            problems = self.mismatches()
            lines.append("  matches the operator's promise" if not problems
                         else "  WARNING, differs from the operator's promise: " + "; ".join(problems))
        return "\n".join(lines)


def run(spark, args, stop: Optional[StopRequests] = None) -> ClickJoinRun:
    """Start the join and its dead-letter query; follow them until the trigger finishes
    (available-now) or Ctrl-C."""
    from pyspark.sql import functions as F

    # Validation splits the input before withWatermark: invalid rows never move event time.
    def classified_input(max_files_per_trigger):
        return classify(read_raw_stream(spark, args.events, args.format, max_files_per_trigger),
                        args.format, args.max_future_skew_ms, args.max_future_skew)

    # Both sides' plans hold this one observation, each branch over every record, and Spark
    # reports it once per batch: a count of the records read, each once.
    classified = classified_input(args.max_files_per_trigger).observe(
        INPUT_METRICS, F.count(F.lit(1)).alias("records"))
    result = build_click_join(valid_events(classified), args)
    if not args.quiet:
        print("operator's promise:\n" + result.describe(), file=sys.stderr, flush=True)
    output = result.df.observe(OUTPUT_METRICS, F.count(F.lit(1)).alias("rows"))
    writer = (output.writeStream.format("parquet").outputMode("append")
              .option("path", args.output).option("checkpointLocation", args.checkpoint)
              .queryName("click_join"))
    query = apply_trigger(writer, args.trigger).start()
    # As in the attribution job: the dead-letter query keeps its offsets inside the job's
    # checkpoint, and takes every new file in one micro-batch (it has no watermark to step).
    dead_letter_query = start_dead_letter_stream(
        classified_input(None), args.dead_letter, args.checkpoint.rstrip("/") + "/dead-letter",
        args.trigger, query_name="click_join_dead_letter")
    follow = ClickJoinRun(query, result.expected, quiet=args.quiet)
    run_with_dead_letter(query, dead_letter_query, stop, follow.poll)
    follow.poll()
    follow.inspect()  # the last batch's plan carries the final eviction watermark
    return follow


def write_metrics(follow: ClickJoinRun, args) -> None:
    """Write ``--metrics`` (if given): see ``ClickJoinRun.metrics``."""
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics).write_text(json.dumps(follow.metrics(args), indent=2) + "\n")


def main(argv=None) -> int:
    """Run the join; returns its exit code (``commandline.exits.ExitCode``): one ``error:`` line
    for a failure, Spark's log in --log-file, SIGINT/SIGTERM stop the query after the current
    micro-batch and report."""
    args = parse_args(argv)
    log_file = args.log_file or default_log_file("click-join")
    with StopRequests(announce="stopping after the current micro-batch") as stop:
        started_log = None
        try:
            check_input(args.events, args.format)
            check_writable_dir(args.checkpoint, "--checkpoint", ExitCode.CHECKPOINT)
            check_sink_directory(args.output, "--output", args.checkpoint)
            spark, started_log = start_spark("click-join", args.master, args.shuffle_partitions,
                                             log_file, args.quiet, stop)
            follow = run(spark, args, stop)
        except JoinSpecError as err:
            return report_failure(Failure(ExitCode.USAGE, str(err)))
        except Failure as failure:
            return report_failure(failure)
        except KeyboardInterrupt:  # the signal came outside run()'s loop
            print(f"stopped by {stop.signal_name}", file=sys.stderr)
            return int(stop.exit_code)
        except Exception as err:
            if stop.requested:  # e.g. a signal sent to the whole process group: the JVM is gone
                print(f"stopped by {stop.signal_name}, which reached Spark too and ended it; "
                      "rerun with the same --checkpoint to resume (a micro-batch it cut short is "
                      "redone)", file=sys.stderr)
                return int(stop.exit_code)
            return report_failure(unexpected_failure(err, started_log or log_file))
    print(follow.report(args, stop.signal_name if stop.requested else None), flush=True)
    write_metrics(follow, args)
    if stop.requested:
        print(f"stopped by {stop.signal_name}; rerun with the same --checkpoint to resume",
              file=sys.stderr)
    return int(stop.exit_code)


if __name__ == "__main__":
    sys.exit(main())
