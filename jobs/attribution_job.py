"""spark-submit entry point: conversion attribution over a directory of spec events.

    spark-submit jobs/attribution_job.py --events DIR [options]
    python jobs/attribution_job.py --events DIR [options]

Streams the directory as a file source (or reads it once with ``--mode batch``), attributes every
goal with the engine-free core inside the chosen stateful backend, and writes Parquet rows in the
spec's output schema through Spark's exactly-once file sink.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script: make the project's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import Observation
from pyspark.sql import functions as F

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
    attribution_batch,
    attribution_stream,
    metric_name,
    output_metrics,
    state_buckets_for,
    users_counted_by_change,
)
from attribution.spark.sinks import SINKS, DeltaSink, OutputFormatRefused, Sink
from attribution.spark.sinks.kafka import TopicRefused
from attribution.spark.storage import available
from attribution.spark.validation import (
    VALIDATION_METRICS,
    classify,
    dead_letters,
    valid_events,
)
from commandline.exits import ExitCode, Failure, exit_codes_help
from commandline.options import option
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from jobs.command import StreamingJob
from jobs.progress import BatchProgress, RunReport
from jobs.runtime import (
    KAFKA_CHECK_SECONDS,
    DeadLetterOutput,
    check_dead_letter_directory,
    check_sink_directory,
    classified_stream,
    follow_queries,
)
from jobs.settings import OUTPUT, JobSettings

DESCRIPTION = """\
Conversion attribution (Streaming Systems ch. 7) on Spark Structured Streaming.

Reads spec events (visit / impression / heartbeat records; their fields: docs/semantics.md,
section 1) from --events, keeps per-user state in the chosen backend, and attributes each goal
once the event-time watermark (max event time seen - --watermark-delay) has passed it: per
attribution model (--models), a row per ad impression the model credits among those that led
there (following referer paths), with its share of the goal, or one organic row. Heartbeat
records only advance the watermark. Events behind the watermark less --allowed-lateness are
late: counted, written to --late-records, never used.
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

  # then backfill a correction of March 2024's input: the output becomes the full run's, and
  # only the goal_date partitions whose rows change are replaced, the others keep their files
  python jobs/attribution_job.py --events DIR --mode batch --output out/attr-batch \\
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


# The job's own option groups, listed in --help between the output and the dead letter.
ATTRIBUTION, LATE_DATA, BACKFILL = "attribution", "late data", "backfill"
_UNSET = "unset"


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


@dataclass(frozen=True)
class AttributionSettings(JobSettings):
    """The attribution job's settings: the shared groups and the job's own options.

    Derived: ``config`` (the core's ``AttributionConfig``), ``watermark_delay_ms``, ``window``
    (a backfill's ``GoalWindow``, or ``None``). ``state_buckets`` is what was asked (``None``:
    auto) until ``pin_checkpoint`` resolves it, with ``bucket_keys``; ``state_buckets_asked``
    keeps what was asked.
    """

    APP = "attribution"
    DEFAULTS = {"output": "out/attributions", "checkpoint": "out/checkpoints/attributions"}

    mode: str = option("stream", "stream: file stream with watermark and timers; batch: read "
                       "everything once, watermark at +infinity (default: %(default)s)",
                       ATTRIBUTION, choices=("stream", "batch"))
    backend: str = option(DEFAULT_BACKEND, "stateful operator for stream mode (default: "
                          "%(default)s)", ATTRIBUTION, choices=BACKENDS)
    state_buckets: Optional[int] = option(
        None, "applyInPandasWithState only: key Spark's state by N hash buckets of user_id "
        "(each bucket holds its users' state blobs and one timer, so Spark's per-key cost is "
        "paid per bucket); 0 keys it by user_id, one blob and one timer per user. 'auto' (the "
        f"default): {BUCKETS_PER_SHUFFLE_PARTITION} per shuffle partition for a new checkpoint "
        f"(at most {MAX_ALIGNED_BUCKETS}), so the stateful stage uses every core of the "
        "cluster; a checkpoint keeps the count its first run chose "
        f"({DEFAULT_STATE_BUCKETS} for one started by a version that did not record it)",
        ATTRIBUTION, type=_state_buckets, metavar="N|auto")
    tws_state: str = option(DEFAULT_TWS_STATE, "transformWithState only: 'compact' keeps one "
                            "value per user (the core's blob and its timer); 'declared' keeps "
                            "list states of visits and impressions and a value state for the "
                            "min goal. Fixed by the first run of a checkpoint (default: "
                            "%(default)s)", ATTRIBUTION, choices=TWS_STATE_LAYOUTS)
    watermark_delay: str = option(DEFAULT_WATERMARK_DELAY, "how far behind the max event time "
                                  "the watermark trails; events older than the watermark are "
                                  "late (default: %(default)s)", ATTRIBUTION, kind="duration")
    lookback: str = option(DEFAULT_LOOKBACK, "max time from impression to goal; also bounds "
                           "state (default: %(default)s)", ATTRIBUTION, kind="duration")
    dedup_window: str = option(DEFAULT_DEDUP_WINDOW, "click-spam dedup bucket: same "
                               "source/target impressions in one bucket are one logical "
                               "impression (default: %(default)s)", ATTRIBUTION,
                               kind="duration")
    models: str = option(",".join(DEFAULT_MODELS), "attribution models, comma-separated, from "
                         f"{', '.join(MODELS)}; '{ALL_MODELS}' for every one. Each gives its "
                         "own rows for every goal and consumes impressions for itself. Fixed by "
                         "the first run of a checkpoint (default: %(default)s)", ATTRIBUTION,
                         metavar="LIST")
    half_life: str = option(DEFAULT_HALF_LIFE, "time_decay: an impression this much older than "
                            "the goal weighs half as much. Fixed by the first run of a "
                            "checkpoint when time_decay is one of --models (default: "
                            "%(default)s)", ATTRIBUTION, kind="duration")
    allowed_lateness: str = option(
        DEFAULT_ALLOWED_LATENESS, "records up to this far behind the watermark are still used, "
        "and the rows they change are revised: a retraction (sign -1) of the rows emitted "
        "before, then the new rows (revision + 1, emit_timing LATE). Records further behind go "
        "to --late-records. Spark's watermark trails the on-time one by this much. Fixed by the "
        "first run of a checkpoint (default: %(default)s)", LATE_DATA, kind="duration")
    early_results: bool = option(False, "emit a goal's rows in the micro-batch it arrives in "
                                 "(emit_timing EARLY), revise them as its impressions arrive, "
                                 "and once more ON_TIME when the watermark passes it. Fixed by "
                                 "the first run of a checkpoint", LATE_DATA, action="store_true")
    late_records: Optional[str] = option(
        None, "Parquet directory for every record dropped as too late (behind the watermark "
        "minus --allowed-lateness), once each, with the watermark it was judged against, under "
        "detected_date=YYYY-MM-DD (default: <output>-late)", LATE_DATA, metavar="DIR")
    goals_from: Optional[str] = option(
        None, "batch mode: backfill a correction of the input dated DATE (UTC, YYYY-MM-DD) to "
        "--goals-to, both inclusive: --output becomes a full batch run's, later goals included, "
        "and only the goal_date partitions whose rows change are replaced (Spark's dynamic "
        "partition overwrite), the others keep their files. The dead letter is left as it is",
        BACKFILL, metavar="DATE")
    goals_to: Optional[str] = option(None, "batch mode: the last goal date of the backfill "
                                     "window (inclusive)", BACKFILL, metavar="DATE")
    backfill_history: Optional[str] = option(
        None, "backfill: read only the events from this long before the window (at least "
        "--lookback), instead of all history. Goals before the window are then attributed "
        "without the impressions before that history, and may consume other impressions than "
        "in a full run; first_touch rows from the window on can then differ from a full run's "
        "(the other models' cannot). Default: all history, exact", BACKFILL, kind="duration")
    output_topic: Optional[str] = option(
        None, "write the attribution rows to this Kafka topic of --kafka-bootstrap-servers (it "
        "must exist) instead of the --output directory: at least once, each record keyed by "
        "the row it holds, so a consumer that drops repeated keys reads every row once "
        "(docs/attribution-job.md). The dead letter and the late records still go to their "
        "directories (by default beside --output)", OUTPUT, metavar="TOPIC")
    current_table: Optional[str] = option(
        None, "stream mode, Delta --output: also keep a Delta table at DIR holding the fold of "
        "the changelog: one row per goal, model and credited impression as of its latest "
        "revision, retracted rows gone; one MERGE per micro-batch, applied once even when a "
        "micro-batch runs again after a crash", OUTPUT, metavar="DIR")
    report_json: Optional[str] = option(None, "also write the final report as JSON to FILE",
                                        OUTPUT, metavar="FILE")

    # Not options: what pin_checkpoint resolves.
    state_buckets_asked: Any = field(default=_UNSET, repr=False)
    bucket_keys: Optional[str] = None

    # Derived in __post_init__.
    watermark_delay_ms: int = field(init=False, repr=False, compare=False)
    config: AttributionConfig = field(init=False, repr=False, compare=False)
    window: Optional[backfill.GoalWindow] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.output_topic is not None and not self.kafka_bootstrap_servers:
            raise ValueError("--output-topic needs --kafka-bootstrap-servers HOST:PORT[,...]")
        if self.output_topic is not None and self.output_format is not None:
            raise ValueError(f"--output-format {self.output_format} names the format of "
                             "--output's directory; --output-topic writes JSON records to a "
                             "topic instead: give one of the two")
        try:
            models = parse_models(self.models)
        except ValueError as err:
            raise ValueError(f"--models: {err}") from None
        half_life_ms = parse_duration_ms(self.half_life, "--half-life")
        if half_life_ms == 0:
            raise ValueError(f"--half-life must be positive, got {self.half_life!r} (e.g. "
                             f"'{DEFAULT_HALF_LIFE}')")
        config = AttributionConfig(
            lookback_ms=parse_duration_ms(self.lookback, "--lookback"),
            dedup_window_ms=parse_duration_ms(self.dedup_window, "--dedup-window"),
            models=models, half_life_ms=half_life_ms,
            allowed_lateness_ms=parse_duration_ms(self.allowed_lateness, "--allowed-lateness"),
            early_results=self.early_results)
        window = backfill.parse_goal_window(self.goals_from, self.goals_to,
                                            self.backfill_history, config.lookback_ms)
        if window is not None and self.mode != "batch":
            raise ValueError("--goals-from and --goals-to backfill a --mode batch output; add "
                             "--mode batch")
        if self.mode == "batch" and self.output_topic is not None:
            # A batch run counts its rows with observed metrics, which Spark's Kafka writer
            # (a V1 data source command) does not report back.
            raise ValueError("--output-topic takes a stream's changelog; --mode batch writes "
                             "its rows to --output (a batch run's output, like a backfill's, "
                             "replaces what is there, which a topic cannot)")
        if self.current_table is not None and (self.mode == "batch" or self.output_topic):
            raise ValueError("--current-table folds a stream's changelog into a Delta table "
                             "beside --output; a --mode batch output holds no revisions (it is "
                             "its own current table), and --output-topic writes no table")
        if config.revising and self.backend == "transformWithState" \
                and self.tws_state == "declared":
            raise ValueError("--allowed-lateness and --early-results need --tws-state compact: "
                             "the declared layout keeps no emitted rows to revise")
        self._set(config=config, window=window,
                  watermark_delay_ms=parse_duration_ms(self.watermark_delay, "--watermark-delay"),
                  late_records=self.late_records or self.output.rstrip("/") + "-late",
                  state_buckets_asked=(self.state_buckets if self.state_buckets_asked == _UNSET
                                       else self.state_buckets_asked))


    def output_sink(self, flat: bool = False) -> Sink:
        """Where the attribution rows go: ``--output-topic``'s topic, else ``--output`` laid
        out by goal date, as a Delta table or Parquet files (``resolved_output_format``;
        ``OUTPUTS``).

        :param flat: the directory was written without date partitions by an earlier version
            (``kept_flat``), and keeps that layout.
        """
        kind = self.output_kind()
        if self.current_table is not None and kind != "delta":
            raise OutputFormatRefused(
                f"--current-table needs a Delta --output; {self.output} holds Parquet files: "
                "give a new --output (Delta by default), or leave --current-table out")
        return OUTPUTS[kind](self, flat)

    def output_kind(self) -> str:
        """``kafka`` with ``--output-topic``, else the format of ``--output`` (``OUTPUTS``)."""
        return "kafka" if self.output_topic else self.resolved_output_format()

    @property
    def output_name(self) -> str:
        """The output as the report names it."""
        if self.output_topic:
            return f"Kafka topic {self.output_topic} at {self.kafka_bootstrap_servers}"
        return self.output


# Where the attribution rows go -> how the settings build the sink (``sinks.SINKS``).
OUTPUTS = {
    "parquet": lambda s, flat: SINKS["parquet"](s.output, None if flat else GOAL_DATE,
                                                one_file_per_date=True),
    "delta": lambda s, flat: SINKS["delta"](s.output, GOAL_DATE,
                                            s.config.allowed_lateness_ms, s.current_table),
    "kafka": lambda s, flat: SINKS["kafka"](s.kafka_bootstrap_servers, s.output_topic,
                                            s.kafka_options),
}


def pin_checkpoint(settings: AttributionSettings,
                   shuffle_partitions: Optional[int] = None) -> AttributionSettings:
    """Check the checkpoint's record of input and state layout (``pin_state_layout``), and
    return the settings with ``state_buckets`` (the count, ``auto`` resolved) and
    ``bucket_keys`` set. Idempotent: ``preflight`` calls it before Spark starts, ``run`` for
    callers that skip ``main``. A new checkpoint with ``--state-buckets auto`` needs the
    query's shuffle partitions (``--shuffle-partitions``, or ``shuffle_partitions`` once Spark
    runs); without them nothing is pinned yet (there is nothing to check either), and the
    settings are returned as they are. So they are for a checkpoint URI before Spark starts
    (``storage.available``): its Hadoop file system is read once the session runs, when ``run``
    pins it.

    :param settings: the run's settings.
    :param shuffle_partitions: the query's shuffle partitions, once Spark knows them.
    """
    if not available(settings.checkpoint):
        return settings
    shuffle_partitions = shuffle_partitions or settings.shuffle_partitions
    if shuffle_partitions is None and needs_shuffle_partitions(
            settings.checkpoint, settings.backend, settings.state_buckets_asked):
        return settings
    state_buckets, bucket_keys = pin_state_layout(
        settings.checkpoint, settings.backend, settings.state_buckets_asked, settings.tws_state,
        settings.config, events=settings.events, kafka_topics=settings.kafka_topics,
        input_format=settings.format,
        shuffle_partitions=shuffle_partitions)
    return settings.replace(state_buckets=state_buckets, bucket_keys=bucket_keys)


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


class AttributionProgress(BatchProgress):
    """``BatchProgress`` plus the number of invalid records each micro-batch dead-lettered.

    The count comes from the validation step's observed metrics; the line is the base class's,
    extended, so its wording stays in one place.
    """

    def __init__(self, *args, revising: bool = False, bucketed: bool = False, **kwargs):
        """:param revising: the run revises rows (allowed lateness or early results): the line
        and the report also count revisions and retractions (rows).
        :param bucketed: the state is keyed by hash buckets: warn once, even with ``quiet``,
            when by the cost model the state dominates three micro-batches in a row
            (``attribution.spark.cost.state_dominates``)."""
        super().__init__(*args, **kwargs)
        self.revising = revising
        self.state_warning_due = bucketed
        self.recent_state_bytes: deque = deque(maxlen=3)
        self.totals.update(invalid=0, revisions=0, retractions=0)

    def _account(self, p) -> dict:
        record = super()._account(p)
        observed = p.observedMetrics or {}
        validation, output = observed.get(VALIDATION_METRICS), observed.get(self.metrics_name)
        invalid = validation["invalid"] if validation is not None else 0
        changes = {k: output[k] if output is not None else 0 for k in ("revisions", "retractions")}
        self.totals["invalid"] += invalid
        for k, n in changes.items():
            self.totals[k] += n
        record.update(invalid=invalid, **changes)
        return record

    def line(self, record: dict) -> str:
        revised = (f", revisions {record['revisions']}, retractions {record['retractions']}"
                   if self.revising else "")
        return f"{super().line(record)}{revised}, invalid {record['invalid']} (dead-lettered)"

    def _after(self, p) -> None:
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


def kept_flat(settings: AttributionSettings) -> list[str]:
    """The outputs (``--output``, ``--dead-letter``) a streaming run writes without date
    partitions: those already written that way (``layout.is_flat``), by a version of the job
    before partitions, whose query this run resumes. Spark reads a directory mixing both layouts
    as neither, so they keep theirs; each is named on stderr unless ``--quiet``.

    :param settings: the run's settings.
    """
    flat = [path for path in (settings.output, settings.dead_letter) if is_flat(path)]
    if not settings.quiet:
        for path in flat:
            print(f"{path} holds part files without date partitions, written by an earlier "
                  "version of the job: this run keeps that layout", file=sys.stderr, flush=True)
    return flat


def run_stream(spark, settings: AttributionSettings,
               stop: Optional[StopRequests] = None) -> RunReport:
    """Run the streaming job until the trigger finishes (available-now) or ``stop`` is
    requested, and then stop it after the current micro-batch.

    :param spark: the session.
    :param settings: the run's settings.
    :param stop: the command's stop requests (``None``: none).
    """
    shuffle_partitions = (shuffle_partitions_of(settings.checkpoint)
                          or int(spark.conf.get("spark.sql.shuffle.partitions")))
    settings = pin_checkpoint(settings, shuffle_partitions)
    if settings.backend == "applyInPandasWithState":
        for warning in bucket_warnings(settings.state_buckets, shuffle_partitions):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    layout = (settings.backend, settings.state_buckets, settings.tws_state)
    users_at_start = state_users_at_start(spark, settings.checkpoint, *layout)
    # Checked before Spark started only where no URI was involved (``storage.available``).
    if settings.output_topic is None:
        check_sink_directory(settings.output, "--output", settings.checkpoint)
    check_dead_letter_directory(settings)
    flat = kept_flat(settings)
    dead_letters = DeadLetterOutput(spark, settings,
                                    by_detected_date=settings.dead_letter not in flat)
    # An input file Spark cannot decode is left out and dead-lettered by its source, and the
    # query restarted without it, where the dead letter re-reads committed micro-batches (the
    # second query of earlier versions cannot leave it out: the job stops there, exit code 3).
    leaves_out = dead_letters.query is None
    if leaves_out:
        settings.source.restore_left_out(settings.checkpoint)
    progress = AttributionProgress(OUTPUT_METRICS, settings.config.models, quiet=settings.quiet,
                                   revising=settings.config.revising,
                                   users_at_start=users_at_start,
                                   bucketed=settings.backend == "applyInPandasWithState"
                                   and bool(settings.state_buckets),
                                   users_by_change=users_counted_by_change(*layout),
                                   json_lines=settings.progress_json)
    late = LateRecords(spark, settings, dead_letters.seen)
    while True:
        events = valid_events(classified_stream(spark, settings))
        rows = attribution_stream(events, watermark_delay_ms=settings.watermark_delay_ms,
                                  config=settings.config, backend=settings.backend,
                                  tws_state=settings.tws_state,
                                  state_buckets=settings.state_buckets,
                                  bucket_keys=settings.bucket_keys)
        query = settings.output_sink(settings.output in flat).start_stream(
            rows, settings.checkpoint, settings.trigger, "attribution")
        try:
            follow_queries(query, dead_letters, stop, progress, late.audit)
            break
        except Exception as err:  # the source tells a file it can leave out from the rest
            left_out = settings.source.leave_out(err, settings.checkpoint) if leaves_out else None
            if left_out is None:
                raise
            print(f"warning: {left_out}", file=sys.stderr, flush=True)
    report = progress.report(mode="stream", backend=settings.backend, output=settings.output_name,
                             stopped_by=stop.signal_name if stop is not None else None)
    if settings.config.revising:
        report.extra["late accepted"] = late.accepted
    if settings.backend == "applyInPandasWithState":
        report.extra["state keys"] = (f"{settings.state_buckets} buckets of users over "
                                      f"{shuffle_partitions} shuffle partitions"
                                      if settings.state_buckets else "one per user")
    report.extra["late records"] = f"{late.written} in {settings.late_records}"
    report.extra["dead letter"] = settings.dead_letter
    left_out = settings.source.left_out_parts()
    if left_out:
        report.extra["unreadable files"] = f"{len(left_out)} (their rows are in the dead letter)"
    return report


class LateRecords:
    """The late-record output, kept up to date with the committed micro-batches
    (``attribution.spark.late_records``); its counts for the report. The checkpoint and the
    output are read and written through ``attribution.spark.storage``, wherever they are.

    :param spark: the session.
    :param settings: the run's settings.
    :param seen: which micro-batches may be audited without their progress update (a
        ``jobs.runtime.ProgressSeen`` built before the query started); ``None``: all.
    """

    def __init__(self, spark, settings: AttributionSettings, seen=None):
        self.spark, self.settings, self.seen = spark, settings, seen
        self.written = self.accepted = 0

    def audit(self, progress) -> None:
        """Audit the micro-batches committed since the last call; ``progress``: the query's
        recent progress updates, whose counts of dropped rows spare most micro-batches a
        second read of their input."""
        settings = self.settings
        written, accepted = audit_late_records(
            self.spark, settings.checkpoint, settings.late_records, settings.source,
            settings.max_future_skew_ms, settings.max_future_skew,
            settings.config.allowed_lateness_ms, dropped_by_batch(progress),
            self.seen.decided if self.seen is not None else None)
        self.written += written
        self.accepted += accepted


def run_batch(spark, settings: AttributionSettings) -> RunReport:
    """Batch mode: the same core over the whole input, watermark at +infinity; with a window
    (``settings.window``), a backfill of its goal dates (``attribution.spark.backfill``).

    The attribution is written first, counting the invalid records as it reads them; the input
    is read a second time for the dead letters only when that count is not zero (otherwise an
    empty dead-letter output is written, as a scan finding nothing would). Reading again rather
    than caching: a cache would hold every classified row in executor memory. Every rule depends
    on the record and its file only, so both passes agree on every row. The counts come from
    observed metrics of the writes, not from extra jobs. A backfill writes no dead letter: it
    reads the input the full run read, and invalid records have no goal date to place them in the
    window; it only counts them.
    """
    started = time.monotonic()
    while True:
        try:
            return _batch(spark, settings, started)
        except Exception as err:  # a file the source can leave out: dead-lettered, run again
            left_out = settings.source.leave_out(err) if settings.window is None else None
            if left_out is None:
                raise
            print(f"warning: {left_out}", file=sys.stderr, flush=True)


def _batch(spark, settings: AttributionSettings, started: float) -> RunReport:
    """One attempt of ``run_batch``; the input files its source left out are dead letters."""
    window, models = settings.window, settings.config.models
    classified = classify(settings.source.read_batch(spark), settings.source,
                          settings.max_future_skew_ms, settings.max_future_skew)
    read, emitted = Observation("input"), Observation("output")
    events = valid_events(classified.observe(read, F.count(F.lit(1)).alias("rows"),
                                             F.count(F.when(~F.col("valid"), 1)).alias("invalid")))
    rows = attribution_batch(events, config=settings.config)
    extra: dict[str, Any] = {}
    if window is None:
        # Files: each goal date's rows in one task (``one_file_per_date``), one file per date
        # instead of one per date and task. A file costs milliseconds to open and close, and a
        # dataset's goals span many dates (392 on the 1,000,000-event benchmark, where this
        # took the run from 13.7 to 11.0 s).
        settings.output_sink().write_batch(
            rows.observe(emitted, *output_metrics(models)))
        rejected = dead_letters(classified)
        if read.get["invalid"] == 0:
            # Nothing to find: spare the second scan (a tenth of the run on the benchmark).
            rejected = rejected.where(F.lit(False))
        left_out = settings.source.left_out_parts()
        unreadable = settings.source.unreadable_dead_letters(left_out)
        if unreadable is not None:
            rejected = rejected.unionByName(spark.createDataFrame(unreadable.to_pandas())
                                            .withColumn("detected_at", F.current_timestamp()))
            extra["unreadable files"] = f"{len(left_out)} (their rows are in the dead letter)"
        rejected, dead_columns = by_date(rejected, DETECTED_DATE)
        (rejected.write.mode("overwrite").option("partitionOverwriteMode", "static")
         .partitionBy(*dead_columns).parquet(settings.dead_letter))
        extra["dead letter"] = settings.dead_letter
    else:  # only the dates whose rows the corrected input changes are rewritten
        backfill.check_target(settings.output, window)  # before Spark only for a local path
        sink = settings.output_sink()
        outcome = backfill.run(spark, events, settings.output, window, settings.config, emitted,
                               output_metrics(models),
                               sink if isinstance(sink, DeltaSink) else None)
        extra = outcome.report(settings.config.dedup_window_ms)
    attributed = {m: emitted.get[metric_name("attributed", m)] for m in models}
    return RunReport(mode="batch", backend="mapInArrow", output=settings.output_name,
                     input_rows=read.get["rows"], late_rows=0,
                     goals=emitted.get[metric_name("goals", models[0])],
                     attributed=attributed[models[0]], attributed_by_model=attributed, batches=1,
                     seconds=time.monotonic() - started,
                     extra={"invalid": read.get["invalid"], **extra})


def run(spark, settings: AttributionSettings, stop: Optional[StopRequests] = None) -> RunReport:
    """Run the job on ``spark`` as ``settings`` say; a stream stops early once ``stop`` is
    requested (a batch run finishes).

    :param spark: the session.
    :param settings: the run's settings (``parse_args``).
    :param stop: the command's stop requests (``None``: none).
    """
    if settings.mode == "batch":
        return run_batch(spark, settings)
    return run_stream(spark, settings, stop)


class AttributionJob(StreamingJob):
    """The attribution job's command on the shared skeleton (``jobs.command``)."""

    settings_class = AttributionSettings
    prog = "attribution_job.py"
    description = DESCRIPTION
    epilog = EXAMPLES
    groups = {ATTRIBUTION: "attribution", LATE_DATA: "late data (allowed lateness, early "
              "results)", BACKFILL: "backfill (batch mode)"}
    failures = {CheckpointMismatch: ExitCode.CHECKPOINT, TopicRefused: ExitCode.OUTPUT,
                backfill.BackfillRefused: ExitCode.OUTPUT, OutputFormatRefused: ExitCode.OUTPUT}

    def waits_for_input(self, settings: AttributionSettings) -> bool:
        return settings.mode == "stream" and settings.streaming

    def check_outputs(self, settings: AttributionSettings) -> None:
        """Batch mode overwrites its outputs and keeps no checkpoint; a backfill replaces
        partitions of a finished batch output only, and writes no dead letter."""
        if settings.report_json:
            check_writable_dir(str(Path(settings.report_json).parent),
                               "--report-json's directory", ExitCode.OUTPUT)
        if settings.output_topic is not None:
            self.check_topic_outputs(settings)
            return
        try:
            settings.output_sink()  # an --output-format that contradicts --output's
        except OutputFormatRefused as err:
            raise Failure(ExitCode.OUTPUT, str(err)) from None
        if settings.current_table is not None:
            check_writable_dir(settings.current_table, "--current-table", ExitCode.OUTPUT)
        if settings.mode != "batch":
            super().check_outputs(settings)
            return
        check_writable_dir(settings.output, "--output", ExitCode.OUTPUT)
        if settings.window is None:
            check_writable_dir(settings.dead_letter, "--dead-letter", ExitCode.OUTPUT)
            return
        if available(settings.output):  # else checked once Spark runs (``run_batch``)
            backfill.check_target(settings.output, settings.window)

    def check_topic_outputs(self, settings: AttributionSettings) -> None:
        """With ``--output-topic`` (stream mode only): the sink's own check, the directories
        that stay files, and the topic itself, asked by the Python Kafka client (it exists, and
        holds no record for a new checkpoint; asked again once Spark runs)."""
        sink = settings.output_sink()
        problem = sink.check()
        if problem is not None:
            raise Failure(ExitCode.OUTPUT, problem)
        check_writable_dir(settings.checkpoint, "--checkpoint", ExitCode.CHECKPOINT)
        check_dead_letter_directory(settings)
        problem = sink.refusal_before_start(settings.checkpoint, KAFKA_CHECK_SECONDS)
        if problem is not None:
            raise Failure(ExitCode.OUTPUT, problem)

    def checks(self, settings: AttributionSettings) -> AttributionSettings:
        """The checkpoint was started with this input and state layout."""
        return settings if settings.mode == "batch" else pin_checkpoint(settings)

    def run(self, spark, settings: AttributionSettings,
            stop: Optional[StopRequests] = None) -> RunReport:
        return run(spark, settings, stop)

    def report(self, result: RunReport, settings: AttributionSettings,
               stop: StopRequests) -> str:
        return result.render()

    def records_read(self, result: RunReport) -> tuple[int, int, Optional[list[int]]]:
        batches = [b["batch"] for b in result.history] if result.mode == "stream" else None
        return result.input_rows, result.extra.get("invalid", 0), batches

    def write_files(self, result: RunReport, settings: AttributionSettings) -> None:
        if settings.report_json:
            Path(settings.report_json).write_text(json.dumps(result.as_dict(), indent=2) + "\n")


JOB = AttributionJob()
# The command line's settings, and the command itself (exit code returned): the skeleton's.
parse_args, main = JOB.parse, JOB.main

if __name__ == "__main__":
    sys.exit(main())
