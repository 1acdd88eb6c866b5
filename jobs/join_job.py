"""spark-submit entry point: the click-through join of ad impressions to the visits they caused.

    spark-submit jobs/join_job.py --events DIR [options]
    python jobs/join_job.py --events DIR [options]

A visit is caused by an impression when it is the same user, the visit's url is the impression's
target_url, and the visit's referer is the impression's source_url. The input is validated like
the attribution job's (invalid records go to a dead letter with their reason), each side is
deduplicated by ``event_id`` within its watermark, and the join is built with
``joins.stream_join`` under the chosen cleanup strategy. Its rows, in the columns of
``CLICK_COLUMNS``, are written exactly once to a Delta table (Delta's streaming sink) or as
Parquet through Spark's file sink (``--output-format``).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import functions as F

from attribution.config import DEFAULT_WATERMARK_DELAY, parse_duration_ms
from attribution.spark import click_join
from attribution.spark.sinks import SINKS
from attribution.spark.validation import valid_events
from commandline.exits import ExitCode, exit_codes_help
from commandline.options import option
from commandline.signals import StopRequests
from jobs.command import StreamingJob
from jobs.progress import MicroBatchProgress, watermark_text
from jobs.runtime import DeadLetterOutput, classified_stream, follow_queries
from jobs.settings import JobSettings, duration
from joins import JOIN_TYPES, JoinSpecError, JoinStateCollector, check_cleanup, inspect_join
from joins.inspect import InspectionError
from joins.metrics import progress_dict

# The job's own defaults: how long after an impression a visit still counts as its click, and the
# tumbling window that must hold both for the state-key strategy.
DEFAULT_MAX_DELAY = "30 minutes"
DEFAULT_WINDOW = "1 hour"
JOIN = "join"


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
    """The output schema as --help text, from ``click_join.CLICK_COLUMNS``."""
    width = max(len(c.name) for c in click_join.CLICK_COLUMNS)
    lines = ["output columns (with --how left_semi only user_id and the impression_ "
             "columns; in an", "outer join, the columns of the side without a match are null):"]
    lines += [f"  {c.name:<{width}}  {c.kind():<9}  {c.doc}" for c in click_join.CLICK_COLUMNS]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class JoinSettings(JobSettings):
    """The click-through join's settings: the shared groups and the join's own options.

    ``impression_watermark_delay`` and ``visit_watermark_delay`` default to
    ``watermark_delay``; derived: each side's delay in milliseconds.
    """

    APP = "click-join"
    DEFAULTS = {"output": "out/clicks", "checkpoint": "out/checkpoints/clicks"}

    strategy: str = option("state-value", "state cleanup strategy, see the table above "
                           "(default: %(default)s)", JOIN, choices=click_join.STRATEGIES)
    how: str = option("inner", "join type; left = impressions, right = visits (default: "
                      "%(default)s)", JOIN, choices=tuple(JOIN_TYPES))
    window: str = option(DEFAULT_WINDOW, "tumbling window that must hold both the impression "
                         "and the visit, for state-key and mixed (default: %(default)s)", JOIN,
                         kind="duration", type=duration)
    max_delay: str = option(DEFAULT_MAX_DELAY, "longest time from impression to visit, for "
                            "state-value and mixed (default: %(default)s)", JOIN,
                            kind="duration", type=duration)
    watermark_delay: str = option(DEFAULT_WATERMARK_DELAY, "watermark delay of both sides "
                                  "unless set per side (default: %(default)s)", JOIN,
                                  kind="duration", type=duration)
    impression_watermark_delay: Optional[str] = option(
        None, "watermark delay of the impression side (default: --watermark-delay)", JOIN,
        kind="duration", type=duration)
    visit_watermark_delay: Optional[str] = option(
        None, "watermark delay of the visit side (default: --watermark-delay)", JOIN,
        kind="duration", type=duration)
    metrics: Optional[str] = option(None, "write the cleanup rules, Spark's strategy per side "
                                    "and per-batch counts to this JSON file (see below)", JOIN,
                                    metavar="FILE.json")

    # Derived in __post_init__.
    impression_delay_ms: int = field(init=False, repr=False, compare=False)
    visit_delay_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "max_delay", "watermark_delay"):
            parse_duration_ms(getattr(self, name), "--" + name.replace("_", "-"))
        impression = self.impression_watermark_delay or self.watermark_delay
        visit = self.visit_watermark_delay or self.watermark_delay
        self._set(impression_watermark_delay=impression, visit_watermark_delay=visit,
                  impression_delay_ms=parse_duration_ms(impression,
                                                        "--impression-watermark-delay"),
                  visit_delay_ms=parse_duration_ms(visit, "--visit-watermark-delay"))


class ClickJoinRun(MicroBatchProgress):
    """Follows the join's query: a record and a progress line per micro-batch
    (``click_join.batch_counts``), the cleanup Spark chose, the metrics and the report.

    :param query: the join's ``StreamingQuery``.
    :param expected: the cleanup the operator promised (``JoinResult.expected``).
    :param quiet: no progress lines.
    :param json_lines: a file that gets each micro-batch's counts as a JSON line.
    """

    def __init__(self, query, expected, quiet: bool = False,
                 json_lines: Optional[str] = None):
        super().__init__(quiet=quiet, json_lines=json_lines)
        self.query = query
        self.expected = expected
        self.state = JoinStateCollector()
        self.inspection = None
        self.inspection_error = None

    @property
    def batches(self) -> list[dict]:
        """Each micro-batch's counts, in batch order."""
        return sorted(self.history, key=lambda b: b["batch_id"])

    def total(self, key: str) -> int:
        """The sum of ``key`` over the micro-batches seen.

        :param key: a field of the micro-batch counts (``output_rows``, ...).
        """
        return sum(b[key] for b in self.history)

    @property
    def output_rows(self) -> int:
        """The rows the join wrote, over all micro-batches."""
        return self.total("output_rows")

    def _account(self, p) -> dict:
        progress = progress_dict(p)
        rows = self.state.add(progress)
        row = rows[0] if rows else self.state.rows()[-1]
        return click_join.batch_counts(progress, row)

    def line(self, batch: dict) -> str:
        """The progress line of one micro-batch.

        :param batch: one micro-batch's counts.
        """
        return (f"batch {batch['batch_id']}: read {batch['records_read']} records "
                f"({batch['invalid']} invalid, dead-lettered; {batch['duplicates_dropped']} "
                f"duplicates and {batch['dropped_by_watermark']} late rows dropped), wrote "
                f"{batch['output_rows']} rows, join state {batch['join_state_rows']} rows "
                f"(updated {batch['join_state_rows_updated']}, removed "
                f"{batch['join_state_rows_removed']}), watermark "
                f"{watermark_text(batch['watermark'])}")

    def _after(self, p) -> None:
        if self.inspection is None:
            self.inspect()

    def inspect(self) -> None:
        """Read the cleanup Spark chose from the query's last executed plan."""
        try:
            self.inspection = inspect_join(self.query)
            self.inspection_error = None
        except InspectionError as err:
            self.inspection_error = str(err)

    def mismatches(self) -> list[str]:
        """Where the state cleanup Spark chose differs from the expected one; empty when it
        matches."""
        return check_cleanup(self.expected, self.inspection) if self.inspection else []

    def metrics(self, settings: JoinSettings) -> dict:
        """The run as a readable JSON document (``--metrics``).

        :param settings: the run's settings.
        """
        delays = {"impression": settings.impression_watermark_delay,
                  "visit": settings.visit_watermark_delay}
        policy = "lower" if self.expected.watermark_policy == "min" else "higher"
        promised = {side.name: {"strategy": side.strategy,
                                "rule": click_join.promised_rule(side, settings.window)}
                    for side in self.expected.sides()}
        detected = spark_plan = None
        if self.inspection is not None:
            inspection = self.inspection
            detected = {"batch_id": inspection.batch_id,
                        "watermark": click_join.iso_or_none(inspection.eviction_watermark_ms)}
            spark_plan = {"batch_id": inspection.batch_id, "join_node": inspection.node,
                          "late_events_watermark_ms": inspection.late_events_watermark_ms,
                          "eviction_watermark_ms": inspection.eviction_watermark_ms}
            for name, side in zip(click_join.SIDES, inspection.sides()):
                detected[name] = {"strategy": side.strategy,
                                  "rule": click_join.detected_rule(name, side),
                                  "threshold": click_join.iso_or_none(side.threshold_ms)}
                spark_plan[f"{name}_predicate"] = side.predicate
        batches = self.batches
        return {
            "strategy": settings.strategy, "how": settings.how,
            "watermark_delay": delays,
            # Both sides' watermarks see every valid record: they are applied before the split.
            "watermark": (f"W is the {policy} of the impression side's watermark (latest ts - "
                          f"{click_join.exact_duration(settings.impression_delay_ms)}) and the "
                          f"visit side's (latest ts - "
                          f"{click_join.exact_duration(settings.visit_delay_ms)}), the latest ts "
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
            "dead_letter": settings.dead_letter,
            "batches": batches,
            "totals": {"batches": len(batches),
                       **{key: self.total(key) for key in (
                           "records_read", "invalid", "duplicates_dropped",
                           "dropped_by_watermark", "output_rows")},
                       "final_join_state_rows": batches[-1]["join_state_rows"] if batches else None,
                       "final_watermark": batches[-1]["watermark"] if batches else None},
            "spark_plan": spark_plan,
        }

    def report(self, settings: JoinSettings, stopped_by: Optional[str] = None) -> str:
        """The final report.

        :param settings: the run's settings.
        :param stopped_by: the signal that stopped the run, if one did.
        """
        batches = self.batches
        last = batches[-1] if batches else {}
        ending = f"stopped by {stopped_by}" if stopped_by else "finished"
        lines = [f"click-through join ({settings.strategy}, {settings.how}) {ending}: "
                 f"{len(batches)} batch(es), {self.total('records_read')} records read, "
                 f"{self.output_rows} rows written to {settings.output}",
                 f"  invalid records: {self.total('invalid')} (dead letter: "
                 f"{settings.dead_letter})",
                 f"  duplicates dropped: {self.total('duplicates_dropped')}, late rows dropped: "
                 f"{self.total('dropped_by_watermark')}",
                 f"  final join state rows: {last.get('join_state_rows', 'n/a')}, "
                 f"watermark {watermark_text(last.get('watermark')) if last else 'n/a'}"]
        if self.inspection is None:
            lines.append(f"  Spark's cleanup: not inspected "
                         f"({self.inspection_error or 'no batch ran'})")
        else:
            lines.append(f"  Spark's cleanup: impression {self.inspection.left.strategy}, "
                         f"visit {self.inspection.right.strategy}")
            problems = self.mismatches()
            lines.append("  matches the operator's promise" if not problems else
                         "  WARNING, differs from the operator's promise: " + "; ".join(problems))
        return "\n".join(lines)


# --output's format (``JobSettings.resolved_output_format``) -> its sink. The joined rows have
# no completeness frontier: a Delta output is written by Delta's own streaming sink.
JOIN_OUTPUTS = {"delta": lambda path: SINKS["delta"](path, frontier=False),
                "parquet": lambda path: SINKS["parquet"](path)}


def run(spark, settings: JoinSettings, stop: Optional[StopRequests] = None) -> ClickJoinRun:
    """Start the join and its dead letter; follow them until the trigger finishes
    (available-now) or ``stop`` is requested.

    :param spark: the session.
    :param settings: the run's settings (``parse_args``).
    :param stop: the command's stop requests (``None``: none).
    """
    # Both sides' plans hold this one observation, each branch over every record, and Spark
    # reports it once per batch: a count of the records read, each once.
    classified = classified_stream(spark, settings).observe(
        click_join.INPUT_METRICS, F.count(F.lit(1)).alias("records"))
    result = click_join.build_click_join(
        valid_events(classified), strategy=settings.strategy, how=settings.how,
        window=settings.window, max_delay=settings.max_delay,
        impression_delay_ms=settings.impression_delay_ms, visit_delay_ms=settings.visit_delay_ms)
    if not settings.quiet:
        print("operator's promise:\n" + result.describe(), file=sys.stderr, flush=True)
    output = result.df.observe(click_join.OUTPUT_METRICS, F.count(F.lit(1)).alias("rows"))
    dead_letters = DeadLetterOutput(spark, settings, query_name="click_join_dead_letter",
                                    by_detected_date=False)
    sink = JOIN_OUTPUTS[settings.resolved_output_format()](settings.output)
    query = sink.start_stream(output, settings.checkpoint, settings.trigger, "click_join")
    follow = ClickJoinRun(query, result.expected, quiet=settings.quiet,
                          json_lines=settings.progress_json)
    follow_queries(query, dead_letters, stop, follow)
    follow.inspect()  # the last batch's plan carries the final eviction watermark
    return follow


def write_metrics(follow: ClickJoinRun, settings: JoinSettings) -> None:
    """Write ``--metrics`` (if given): see ``ClickJoinRun.metrics``.

    :param follow: the run's result.
    :param settings: the run's settings.
    """
    if settings.metrics:
        Path(settings.metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(settings.metrics).write_text(json.dumps(follow.metrics(settings), indent=2) + "\n")


class ClickJoinJob(StreamingJob):
    """The click-through join's command on the shared skeleton (``jobs.command``)."""

    settings_class = JoinSettings
    prog = "join_job.py"
    description = DESCRIPTION
    epilog = "\n".join((EXAMPLES, schema_help(), METRICS_HELP, exit_codes_help()))
    groups = {JOIN: "the join"}
    failures = {JoinSpecError: ExitCode.USAGE}

    def run(self, spark, settings: JoinSettings,
            stop: Optional[StopRequests] = None) -> ClickJoinRun:
        """Run the join as ``settings`` asks, until its input is consumed or it is stopped.

        :param spark: the ``SparkSession``.
        :param settings: the parsed options.
        :param stop: the signals that ask the query to stop, or ``None``.
        """
        return run(spark, settings, stop)

    def report(self, result: ClickJoinRun, settings: JoinSettings, stop: StopRequests) -> str:
        """The run's closing report.

        :param result: the finished run.
        :param settings: the parsed options.
        :param stop: the signals that asked to stop; the one received is named.
        """
        return result.report(settings, stop.signal_name)

    def records_read(self, result: ClickJoinRun) -> tuple[int, int, Optional[list[int]]]:
        return (result.total("records_read"), result.total("invalid"),
                [b["batch_id"] for b in result.history])

    def write_files(self, result: ClickJoinRun, settings: JoinSettings) -> None:
        """Write the run's metrics file, if the options ask for one.

        :param result: the finished run.
        :param settings: the parsed options (where the metrics go).
        """
        write_metrics(result, settings)


JOB = ClickJoinJob()
# The command line's settings, and the command itself (exit code returned): the skeleton's.
parse_args, main = JOB.parse, JOB.main

if __name__ == "__main__":
    sys.exit(main())
