"""spark-submit entry point: conversion attribution over a directory of spec events.

    spark-submit jobs/attribution_job.py --events DIR [options]
    python jobs/attribution_job.py --events DIR [options]

Streams the directory as a file source (or reads it once with ``--mode batch``), attributes every
goal with the engine-free core inside the chosen stateful backend, and writes Parquet rows in the
spec's output schema through Spark's exactly-once file sink.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attribution.config import (
    ALL_MODELS,
    DEFAULT_ALLOWED_LATENESS,
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_HALF_LIFE,
    DEFAULT_LOOKBACK,
    DEFAULT_MODELS,
    DEFAULT_WATERMARK_DELAY,
    MODELS,
    AttributionConfig,
    parse_duration_ms,
    parse_models,
)
from attribution.spark import backfill
from attribution.spark.bucket_keys import MAX_ALIGNED_BUCKETS
from attribution.spark.checkpoint import (
    CheckpointMismatch,
    needs_shuffle_partitions,
    pin_state_layout,
    shuffle_partitions_of,
    state_users_at_start,
)
from attribution.spark.cost import state_dominates
from attribution.spark.late_records import audit as audit_late_records
from attribution.spark.late_records import dropped_by_batch
from attribution.spark.layout import DETECTED_DATE, GOAL_DATE, by_date, is_flat
from attribution.spark.pipeline import (
    BACKENDS,
    BUCKETS_PER_SHUFFLE_PARTITION,
    DEFAULT_BACKEND,
    DEFAULT_STATE_BUCKETS,
    DEFAULT_TWS_STATE,
    OUTPUT_METRICS,
    TWS_STATE_LAYOUTS,
    apply_trigger,
    attribution_batch,
    attribution_stream,
    metric_name,
    output_metrics,
    state_buckets_for,
    users_counted_by_change,
)
from attribution.spark.validation import (
    DEFAULT_MAX_FUTURE_SKEW,
    VALIDATION_METRICS,
    classify,
    dead_letters,
    max_future_skew_ms,
    read_raw_batch,
    read_raw_stream,
    start_dead_letter_stream,
    unreadable_input,
    valid_events,
)
from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from jobs.progress import BatchProgress, RunReport
from jobs.runtime import (
    add_stream_options,
    check_input,
    check_sink_directory,
    default_log_file,
    run_with_dead_letter,
    ship_packages,
    start_spark,
    unexpected_failure,
)

DESCRIPTION = """\
Conversion attribution (Streaming Systems ch. 7) on Spark Structured Streaming.

Reads spec events (visit / impression / heartbeat records; see the README's event schema) from
--events, keeps per-user state in the chosen backend, and attributes each goal once the
event-time watermark (max event time seen - --watermark-delay) has passed it: per attribution
model (--models), a row per ad impression the model credits among those that led there
(following referer paths), with its share of the goal, or one organic row. Heartbeat records
only advance the watermark. Events behind the watermark are late: counted, never used.
Invalid records (malformed JSON, missing or wrongly typed fields, unknown event types, strings
over 8192 chars, a value that is not a finite number, timestamps beyond --max-future-skew) never
reach the watermark: they are counted and written with their reason to --dead-letter.
"""

EXAMPLES = """\
examples:
  # everything in DIR, then stop (the default trigger), one file per micro-batch
  python jobs/attribution_job.py --events DIR --max-files-per-trigger 1

  # a long-running job polling for new files every 10 seconds, transformWithState backend
  spark-submit jobs/attribution_job.py --events DIR --trigger '10 seconds' \\
      --backend transformWithState --output out/attr --checkpoint out/ckpt

  # the same rules over the whole input at once (watermark at +infinity)
  python jobs/attribution_job.py --events DIR --mode batch --output out/attr-batch

  # then re-attribute March 2024 only: its goal_date partitions are replaced, the others kept
  python jobs/attribution_job.py --events DIR --mode batch --output out/attr-batch \
      --goals-from 2024-03-01 --goals-to 2024-03-31

  # every attribution model at once, time decay halving a click's weight per day
  python jobs/attribution_job.py --events DIR --models all --half-life '1 day'

Restarting with the same --checkpoint resumes exactly where the job stopped; the file sink's
metadata log guarantees each row is written once. A checkpoint records its input directory,
format and state layout, and refuses a run with others. Ctrl-C (SIGINT) or SIGTERM stops the
job after the current micro-batch, with the final report; a second one stops it at once.
Spark's own log goes to --log-file; the terminal shows progress, the report and, on failure,
one error line.

""" + exit_codes_help()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="attribution_job.py", description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_options(parser, default_output="out/attributions",
                       default_checkpoint="out/checkpoints/attributions")
    parser.add_argument("--mode", choices=("stream", "batch"), default="stream",
                        help="stream: file stream with watermark and timers; batch: read "
                             "everything once, watermark at +infinity (default: %(default)s)")
    parser.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                        help="stateful operator for stream mode (default: %(default)s)")
    parser.add_argument("--state-buckets", type=_state_buckets, default=None, metavar="N|auto",
                        help="applyInPandasWithState only: key Spark's state by N hash buckets "
                             "of user_id (each bucket holds its users' state blobs and one "
                             "timer, so Spark's per-key cost is paid per bucket); 0 keys it by "
                             "user_id, one blob and one timer per user. 'auto' (the default): "
                             f"{BUCKETS_PER_SHUFFLE_PARTITION} per shuffle partition for a new "
                             f"checkpoint (at most {MAX_ALIGNED_BUCKETS}), so the stateful stage "
                             "uses every core of the cluster; a checkpoint keeps the count its "
                             f"first run chose ({DEFAULT_STATE_BUCKETS} for a remote checkpoint, "
                             "which cannot record it)")
    parser.add_argument("--tws-state", choices=TWS_STATE_LAYOUTS, default=DEFAULT_TWS_STATE,
                        help="transformWithState only: 'compact' keeps one value per user (the "
                             "core's blob and its timer); 'declared' keeps list states of visits "
                             "and impressions and a value state for the min goal. Fixed by the "
                             "first run of a checkpoint (default: %(default)s)")
    parser.add_argument("--watermark-delay", default=DEFAULT_WATERMARK_DELAY, metavar="DURATION",
                        help="how far behind the max event time the watermark trails; events "
                             "older than the watermark are late (default: %(default)s)")
    parser.add_argument("--lookback", default=DEFAULT_LOOKBACK, metavar="DURATION",
                        help="max time from impression to goal; also bounds state "
                             "(default: %(default)s)")
    parser.add_argument("--dedup-window", default=DEFAULT_DEDUP_WINDOW, metavar="DURATION",
                        help="click-spam dedup bucket: same source/target impressions in one "
                             "bucket are one logical impression (default: %(default)s)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), metavar="LIST",
                        help=f"attribution models, comma-separated, from {', '.join(MODELS)}; "
                             f"'{ALL_MODELS}' for every one. Each gives its own rows for every "
                             "goal and consumes impressions for itself. Fixed by the first run "
                             "of a checkpoint (default: %(default)s)")
    parser.add_argument("--half-life", default=DEFAULT_HALF_LIFE, metavar="DURATION",
                        help="time_decay: an impression this much older than the goal weighs "
                             "half as much. Fixed by the first run of a checkpoint when "
                             "time_decay is one of --models (default: %(default)s)")
    parser.add_argument("--allowed-lateness", default=DEFAULT_ALLOWED_LATENESS, metavar="DURATION",
                        help="records up to this far behind the watermark are still used, and "
                             "the rows they change are revised: a retraction (sign -1) of the "
                             "rows emitted before, then the new rows (revision + 1, emit_timing "
                             "LATE). Records further behind go to --late-records. Spark's "
                             "watermark trails the on-time one by this much. Fixed by the first "
                             "run of a checkpoint (default: %(default)s)")
    parser.add_argument("--early-results", action="store_true",
                        help="emit a goal's rows in the micro-batch it arrives in (emit_timing "
                             "EARLY), revise them as its impressions arrive, and once more "
                             "ON_TIME when the watermark passes it. Fixed by the first run of a "
                             "checkpoint")
    parser.add_argument("--late-records", default=None, metavar="DIR",
                        help="Parquet directory for every record dropped as too late (behind "
                             "the watermark minus --allowed-lateness), once each, with the "
                             "watermark it was judged against, under detected_date=YYYY-MM-DD "
                             "(default: <output>-late)")
    parser.add_argument("--dead-letter", default=None, metavar="DIR",
                        help="Parquet directory for invalid records (raw record, reason, source "
                             "file, detection time), written by a second exactly-once streaming "
                             "query (default: <output>-dead-letter)")
    parser.add_argument("--max-future-skew", default=DEFAULT_MAX_FUTURE_SKEW, metavar="DURATION",
                        help="reject events whose ts is more than this ahead of their file's "
                             "modification time, so that one bad clock cannot drag the watermark "
                             "forward and make every later event late; every run and both "
                             "outputs judge a record alike (default: %(default)s)")
    parser.add_argument("--goals-from", default=None, metavar="DATE",
                        help="batch mode: backfill a correction of the input dated DATE (UTC, "
                             "YYYY-MM-DD) to --goals-to, both inclusive: --output becomes a full "
                             "batch run's, later goals included, and only the goal_date "
                             "partitions whose rows change are replaced (Spark's dynamic "
                             "partition overwrite), the others keep their files. The dead "
                             "letter is left as it is")
    parser.add_argument("--goals-to", default=None, metavar="DATE",
                        help="batch mode: the last goal date of the backfill window (inclusive)")
    parser.add_argument("--backfill-history", default=None, metavar="DURATION",
                        help="backfill: read only the events from this long before the window "
                             "(at least --lookback), instead of all history. Goals before the "
                             "window are then attributed without the impressions before that "
                             "history, and may consume other impressions than in a full run; "
                             "first_touch rows from the window on can then differ from a full "
                             "run's (the other models' cannot). Default: all history, exact")
    parser.add_argument("--report-json", default=None, metavar="FILE",
                        help="also write the final report as JSON to FILE")
    parser.add_argument("--quiet", action="store_true",
                        help="no start-up or per-batch progress lines")
    args = parser.parse_args(argv)
    try:
        models = parse_models(args.models)
    except ValueError as err:
        parser.error(f"--models: {err}")
    try:
        args.watermark_delay_ms = parse_duration_ms(args.watermark_delay)
        args.max_future_skew_ms = max_future_skew_ms(args.max_future_skew)
        half_life_ms = parse_duration_ms(args.half_life, "--half-life")
        if half_life_ms == 0:
            raise ValueError(f"--half-life must be positive, got {args.half_life!r} (e.g. "
                             f"'{DEFAULT_HALF_LIFE}')")
        args.config = AttributionConfig(lookback_ms=parse_duration_ms(args.lookback),
                                        dedup_window_ms=parse_duration_ms(args.dedup_window),
                                        models=models, half_life_ms=half_life_ms,
                                        allowed_lateness_ms=parse_duration_ms(
                                            args.allowed_lateness, "--allowed-lateness"),
                                        early_results=args.early_results)
        args.window = backfill.parse_goal_window(args.goals_from, args.goals_to,
                                                 args.backfill_history, args.config.lookback_ms)
    except ValueError as err:
        parser.error(str(err))
    if args.window is not None and args.mode != "batch":
        parser.error("--goals-from and --goals-to backfill a --mode batch output; add "
                     "--mode batch")
    if not Path(args.events).is_dir() and "://" not in args.events:
        parser.error(f"--events {args.events!r} is not a directory")
    # What was asked (None: auto); pin_checkpoint resolves args.state_buckets from it.
    args.state_buckets_asked = args.state_buckets
    if args.max_files_per_trigger is not None and args.max_files_per_trigger < 1:
        parser.error("--max-files-per-trigger must be >= 1")
    if args.config.revising and args.backend == "transformWithState" \
            and args.tws_state == "declared":
        parser.error("--allowed-lateness and --early-results need --tws-state compact: the "
                     "declared layout keeps no emitted rows to revise")
    if args.dead_letter is None:
        args.dead_letter = args.output.rstrip("/") + "-dead-letter"
    if args.late_records is None:
        args.late_records = args.output.rstrip("/") + "-late"
    if args.log_file is None:
        args.log_file = default_log_file("attribution")
    return args


def dead_letter_checkpoint(args) -> str:
    """The dead-letter query keeps its offsets inside the job's checkpoint: one --checkpoint
    resumes both."""
    return args.checkpoint.rstrip("/") + "/dead-letter"


def _state_buckets(text: str) -> Optional[int]:
    """``--state-buckets``: ``auto`` (``None``) or a count from 0 to ``MAX_ALIGNED_BUCKETS``."""
    if text.strip().lower() == "auto":
        return None
    try:
        buckets = int(text)
    except ValueError:
        buckets = -1
    if not 0 <= buckets <= MAX_ALIGNED_BUCKETS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'auto' or a bucket count from 0 to {MAX_ALIGNED_BUCKETS} (0 keys "
            "the state by user_id)")
    return buckets


def pin_checkpoint(args, shuffle_partitions: Optional[int] = None) -> None:
    """Check the checkpoint's record of input and state layout (``pin_state_layout``), and
    set ``args.state_buckets`` (the count, ``auto`` resolved) and ``args.bucket_keys``.
    Idempotent: ``main`` calls it before Spark starts, ``run`` for callers that skip ``main``.
    A new checkpoint with ``--state-buckets auto`` needs the query's shuffle partitions
    (``--shuffle-partitions``, or ``shuffle_partitions`` once Spark runs); without them
    nothing is pinned yet (there is nothing to check either).
    """
    shuffle_partitions = shuffle_partitions or args.shuffle_partitions
    if shuffle_partitions is None and needs_shuffle_partitions(args.checkpoint, args.backend,
                                                               args.state_buckets_asked):
        return
    args.state_buckets, args.bucket_keys = pin_state_layout(
        args.checkpoint, args.backend, args.state_buckets_asked, args.tws_state, args.config,
        events=args.events, input_format=args.format, shuffle_partitions=shuffle_partitions)


def bucket_warnings(state_buckets: int, shuffle_partitions: int) -> list[str]:
    """Why a bucket count holds the stateful stage back on ``shuffle_partitions`` partitions:
    fewer buckets than partitions leave partitions without state work; a count that the
    partitions do not divide gives some partitions a bucket more than others."""
    if not state_buckets:
        return []
    better = (f"a new --checkpoint with --state-buckets auto would use "
              f"{state_buckets_for(shuffle_partitions)}")
    if state_buckets < shuffle_partitions:
        return [f"{state_buckets} state buckets for {shuffle_partitions} shuffle partitions: "
                f"only {state_buckets} of the stateful stage's {shuffle_partitions} tasks have "
                f"state to work on; {better}"]
    if state_buckets % shuffle_partitions:
        low = state_buckets // shuffle_partitions
        return [f"{state_buckets} state buckets do not divide evenly over {shuffle_partitions} "
                f"shuffle partitions: each task holds {low} or {low + 1} buckets, and the "
                f"stateful stage waits for those with {low + 1}; {better}"]
    return []


def preflight(args) -> None:
    """Every check that needs no Spark, made before Spark starts: the input can be read in the
    chosen format, the output, dead-letter and checkpoint directories can be written (and
    belong to this query), and the checkpoint was started with this input and state layout.

    :raises Failure: with the exit code of the kind of problem.
    """
    check_input(args.events, args.format)
    if args.report_json:
        check_writable_dir(str(Path(args.report_json).parent), "--report-json's directory",
                           ExitCode.OUTPUT)
    if args.mode == "batch":  # batch mode overwrites its outputs and keeps no checkpoint
        check_writable_dir(args.output, "--output", ExitCode.OUTPUT)
        if args.window is None:
            check_writable_dir(args.dead_letter, "--dead-letter", ExitCode.OUTPUT)
            return
        try:
            backfill.check_target(args.output, args.window)
        except backfill.BackfillRefused as err:
            raise Failure(ExitCode.OUTPUT, str(err)) from None
        return
    check_writable_dir(args.checkpoint, "--checkpoint", ExitCode.CHECKPOINT)
    check_sink_directory(args.output, "--output", args.checkpoint)
    check_sink_directory(args.dead_letter, "--dead-letter", dead_letter_checkpoint(args))
    try:
        pin_checkpoint(args)
    except CheckpointMismatch as err:
        raise Failure(ExitCode.CHECKPOINT, str(err)) from None


class AttributionProgress(BatchProgress):
    """``BatchProgress`` plus the number of invalid records each micro-batch dead-lettered.

    The count comes from the validation step's observed metrics. The base class's progress line
    is captured and extended rather than re-formatted here, so its wording stays in one place.
    """

    def __init__(self, *args, revising: bool = False, bucketed: bool = False, **kwargs):
        """:param revising: the run revises rows (allowed lateness or early results): the line
        and the report also count revisions and retractions (rows).
        :param bucketed: the state is keyed by hash buckets: warn once, even with ``quiet``,
            when by the cost model the state dominates three micro-batches in a row
            (``attribution.spark.cost.state_dominates``)."""
        # The stderr of the moment, not of import time, so that redirect_stderr and test capture
        # see the progress lines.
        kwargs.setdefault("stream", sys.stderr)
        super().__init__(*args, **kwargs)
        self.revising = revising
        self.state_warning_due = bucketed
        self.recent_state_bytes: deque = deque(maxlen=3)
        self.totals.update(invalid=0, revisions=0, retractions=0)

    def _account(self, p) -> None:
        observed = p.observedMetrics or {}
        validation, output = observed.get(VALIDATION_METRICS), observed.get(self.metrics_name)
        invalid = validation["invalid"] if validation is not None else 0
        changes = {k: output[k] if output is not None else 0 for k in ("revisions", "retractions")}
        self.totals["invalid"] += invalid
        for k, n in changes.items():
            self.totals[k] += n
        stream, self.stream = self.stream, io.StringIO()
        try:
            super()._account(p)
        finally:
            line, self.stream = self.stream.getvalue(), stream
        self.history[-1].update(invalid=invalid, **changes)
        if line:
            revised = (f", revisions {changes['revisions']}, retractions "
                       f"{changes['retractions']}" if self.revising else "")
            print(f"{line.rstrip()}{revised}, invalid {invalid} (dead-lettered)",
                  file=self.stream, flush=True)
        if self.state_warning_due:
            # RocksDB's files hold overwritten values until a compaction: the smallest size of
            # the last few micro-batches is the nearest to the live state.
            self.recent_state_bytes.append(self.state_bytes)
            known = [b for b in self.recent_state_bytes if b is not None]
            warning = (state_dominates(p.numInputRows, min(known))
                       if len(known) == self.recent_state_bytes.maxlen else None)
            if warning:
                print(f"warning: {warning}", file=self.stream, flush=True)
                self.state_warning_due = False

    def report(self, **fields) -> RunReport:
        report = super().report(**fields)
        report.extra["invalid"] = self.totals["invalid"]
        if self.revising:
            report.extra["revisions"] = self.totals["revisions"]
            report.extra["retractions"] = self.totals["retractions"]
        return report


def kept_flat(args) -> list[str]:
    """The outputs (``--output``, ``--dead-letter``) a streaming run writes without date
    partitions: those already written that way (``layout.is_flat``), by a version of the job
    before partitions, whose query this run resumes. Spark reads a directory mixing both layouts
    as neither, so they keep theirs; each is named on stderr unless ``--quiet``."""
    flat = [path for path in (args.output, args.dead_letter) if is_flat(path)]
    if not args.quiet:
        for path in flat:
            print(f"{path} holds part files without date partitions, written by an earlier "
                  "version of the job: this run keeps that layout", file=sys.stderr, flush=True)
    return flat


def run_stream(spark, args, stop: Optional[StopRequests] = None) -> RunReport:
    """Run the streaming job until the trigger finishes (available-now) or ``stop`` is
    requested, and then stop it after the current micro-batch."""
    shuffle_partitions = (shuffle_partitions_of(args.checkpoint)
                          or int(spark.conf.get("spark.sql.shuffle.partitions")))
    pin_checkpoint(args, shuffle_partitions)
    if args.backend == "applyInPandasWithState":
        for warning in bucket_warnings(args.state_buckets, shuffle_partitions):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    layout = (args.backend, args.state_buckets, args.tws_state)
    users_at_start = state_users_at_start(spark, args.checkpoint, *layout)
    # Validation splits the input before withWatermark: invalid rows never move event time.
    def classified_input(max_files_per_trigger):
        return classify(read_raw_stream(spark, args.events, args.format, max_files_per_trigger),
                        args.format, args.max_future_skew_ms, args.max_future_skew)

    events = valid_events(classified_input(args.max_files_per_trigger))
    rows = attribution_stream(events, watermark_delay_ms=args.watermark_delay_ms,
                              config=args.config, backend=args.backend,
                              tws_state=args.tws_state, state_buckets=args.state_buckets,
                              bucket_keys=args.bucket_keys)
    flat = kept_flat(args)
    rows, partition_columns = by_date(rows, GOAL_DATE, partitioned=args.output not in flat)
    writer = (rows.writeStream.format("parquet").outputMode("append")
              .partitionBy(*partition_columns)
              .option("path", args.output).option("checkpointLocation", args.checkpoint)
              .queryName("attribution"))
    query = apply_trigger(writer, args.trigger).start()
    # The dead-letter query has no watermark to step, so it takes whatever files are new in one
    # micro-batch: --max-files-per-trigger would only multiply its per-batch cost.
    dead_letter_query = start_dead_letter_stream(
        classified_input(None), args.dead_letter, dead_letter_checkpoint(args), args.trigger,
        by_detected_date=args.dead_letter not in flat)
    progress = AttributionProgress(OUTPUT_METRICS, args.config.models, quiet=args.quiet,
                                   revising=args.config.revising, users_at_start=users_at_start,
                                   bucketed=args.backend == "applyInPandasWithState"
                                   and bool(args.state_buckets),
                                   users_by_change=users_counted_by_change(*layout))
    late = LateRecords(spark, args)
    def poll():
        updates = query.recentProgress
        progress.consume(updates)
        late.audit(updates)

    run_with_dead_letter(query, dead_letter_query, stop, poll)
    poll()  # what the last micro-batch committed
    report = progress.report(mode="stream", backend=args.backend, output=args.output,
                             stopped_by=stop.signal_name if stop is not None else None)
    if args.config.revising:
        report.extra["late accepted"] = late.accepted
    if args.backend == "applyInPandasWithState":
        report.extra["state keys"] = (f"{args.state_buckets} buckets of users over "
                                      f"{shuffle_partitions} shuffle partitions"
                                      if args.state_buckets else "one per user")
    report.extra["late records"] = f"{late.written} in {args.late_records}"
    report.extra["dead letter"] = args.dead_letter
    return report


class LateRecords:
    """The late-record output, kept up to date with the committed micro-batches
    (``attribution.spark.late_records``); its counts for the report. Remote checkpoints are
    not audited."""

    def __init__(self, spark, args):
        self.spark, self.args = spark, args
        self.written = self.accepted = 0

    def audit(self, progress) -> None:
        """Audit the micro-batches committed since the last call; ``progress``: the query's
        recent progress updates, whose counts of dropped rows spare most micro-batches a
        second read of their input."""
        args = self.args
        if "://" in args.checkpoint:
            return
        written, accepted = audit_late_records(
            self.spark, args.checkpoint, args.late_records, args.format, args.max_future_skew_ms,
            args.max_future_skew, args.config.allowed_lateness_ms, dropped_by_batch(progress))
        self.written += written
        self.accepted += accepted


def run_batch(spark, args) -> RunReport:
    """Batch mode: the same core over the whole input, watermark at +infinity; with a window
    (``args.window``), a backfill of its goal dates (``attribution.spark.backfill``).

    The attribution is written first, counting the invalid records as it reads them; the input
    is read a second time for the dead letters only when that count is not zero (otherwise an
    empty dead-letter output is written, as a scan finding nothing would). Reading again rather
    than caching: a cache would hold every classified row in executor memory. Every rule depends
    on the record and its file only, so both passes agree on every row. The counts come from
    observed metrics of the writes, not from extra jobs. A backfill writes no dead letter: it
    reads the input the full run read, and invalid records have no goal date to place them in the
    window; it only counts them.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    window, models = args.window, args.config.models
    classified = classify(read_raw_batch(spark, args.events, args.format), args.format,
                          args.max_future_skew_ms, args.max_future_skew)
    read, emitted = Observation("input"), Observation("output")
    events = valid_events(classified.observe(read, F.count(F.lit(1)).alias("rows"),
                                             F.count(F.when(~F.col("valid"), 1)).alias("invalid")))
    rows = attribution_batch(events, config=args.config)
    rows, columns = by_date(rows, GOAL_DATE)
    # Each goal date's rows in one task: one file per date instead of one per date and task.
    # A file costs milliseconds to open and close, and a dataset's goals span many dates (392 on
    # the 1,000,000-event benchmark, where this took the run from 13.7 to 11.0 s).
    rows = rows.repartition(*columns)
    if window is None:
        (rows.observe(emitted, *output_metrics(models)).write.mode("overwrite")
         .option("partitionOverwriteMode", "static").partitionBy(*columns).parquet(args.output))
        rejected = dead_letters(classified)
        if read.get["invalid"] == 0:
            # Nothing to find: spare the second scan (a tenth of the run on the benchmark).
            rejected = rejected.where(F.lit(False))
        rejected, dead_columns = by_date(rejected, DETECTED_DATE)
        (rejected.write.mode("overwrite").option("partitionOverwriteMode", "static")
         .partitionBy(*dead_columns).parquet(args.dead_letter))
        extra = {"dead letter": args.dead_letter}
    else:  # only the dates whose rows the corrected input changes are rewritten
        outcome = backfill.run(spark, events, args.output, window, args.config, emitted,
                               output_metrics(models))
        extra = outcome.report(args.config.dedup_window_ms)
    attributed = {m: emitted.get[metric_name("attributed", m)] for m in models}
    return RunReport(mode="batch", backend="mapInArrow", output=args.output,
                     input_rows=read.get["rows"], late_rows=0,
                     goals=emitted.get[metric_name("goals", models[0])],
                     attributed=attributed[models[0]], attributed_by_model=attributed, batches=1,
                     seconds=time.monotonic() - started,
                     extra={"invalid": read.get["invalid"], **extra})


def run(spark, args, stop: Optional[StopRequests] = None) -> RunReport:
    """Run the job on ``spark`` as ``args`` say; a stream stops early once ``stop`` is
    requested (a batch run finishes)."""
    return run_batch(spark, args) if args.mode == "batch" else run_stream(spark, args, stop)


def _ship_packages(spark) -> None:
    packages = ship_packages(spark)
    if packages is not None:
        # transformWithState starts one Python worker on the driver (Spark's "pre-init" runner),
        # which unpickles the processor without the files added by addPyFile: on a cluster whose
        # PYSPARK_PYTHON cannot import the project it fails with "No module named 'attribution'".
        # The functions' environment does reach it; on executors of other hosts the path is absent
        # and ignored, and there the shipped copy is used.
        environment = spark.sparkContext.environment
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(packages), environment.get("PYTHONPATH")) if p)


def main(argv=None) -> int:
    """Run the job; returns its exit code (``commandline.exits.ExitCode``).

    Whatever goes wrong ends with one ``error:`` line on stderr: the checks of ``preflight``
    before Spark starts, a file Spark cannot decode, and anything unforeseen (its traceback goes
    to the log file the line names).
    """
    args = parse_args(argv)
    with StopRequests(announce="stopping after the current micro-batch") as stop:
        log_file = report = None
        try:
            preflight(args)
            spark, log_file = start_spark("attribution", args.master, args.shuffle_partitions,
                                          args.log_file, args.quiet, stop)
            if not stop.requested:
                _ship_packages(spark)
                report = run(spark, args, stop)
        except Failure as failure:
            return report_failure(failure)
        except Exception as err:
            if stop.requested:  # e.g. SIGTERM sent to the whole process group: the JVM is gone
                print(f"stopped by {stop.signal_name}, which reached Spark too and ended it; "
                      "rerun with the same --checkpoint to resume (a micro-batch it cut short is "
                      "redone)", file=sys.stderr)
                return int(stop.exit_code)
            explanation = unreadable_input(err)  # a file Spark cannot decode is the user's
            if explanation is None:
                return report_failure(unexpected_failure(err, log_file or args.log_file))
            where = f" Spark's log: {log_file}." if log_file else ""
            return report_failure(Failure(ExitCode.INPUT, explanation + where))
    if report is None:  # the signal came while Spark was starting
        print(f"stopped by {stop.signal_name} before the first micro-batch; nothing was written",
              file=sys.stderr)
        return int(stop.exit_code)
    print(report.render(), flush=True)
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if stop.requested:
        print(f"stopped by {stop.signal_name}; rerun with the same --checkpoint to resume",
              file=sys.stderr)
    return int(stop.exit_code)


if __name__ == "__main__":
    sys.exit(main())
