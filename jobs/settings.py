"""The options every streaming job shares, declared once per group, and the settings they make.

``JobSettings`` is a frozen dataclass whose fields are the command-line options of the groups
every job has: the input (``--events``, or ``--kafka-topics`` with the Kafka options;
``--format``, the per-trigger limits, ``--max-future-skew``), the output (``--output``), the
dead letter (``--dead-letter``) and the stream (``--checkpoint``, ``--trigger``, Spark's
settings, the log, the progress). A job's own settings subclass it with the fields of its own
groups, and its ``DEFAULTS`` give the outputs their per-job default paths. The fields are
declared with ``commandline.options.option``, so one declaration gives the flag, its ``--help``
and its default; ``__post_init__`` checks the values and derives the ones a run needs
(milliseconds, default paths, the input's ``EventSource``), so a settings object is valid
however it was made, from a command line or in code.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from attribution.config import parse_duration_ms
from attribution.spark.formats import FORMATS
from attribution.spark.pipeline import AVAILABLE_NOW, trigger_interval_ms
from attribution.spark.sinks import DEFAULT_OUTPUT_FORMAT, OUTPUT_FORMATS, choose_output_format
from attribution.spark.sources import SOURCES, EventSource
from attribution.spark.sources.kafka import STARTING_OFFSETS
from attribution.spark.validation import DEFAULT_MAX_FUTURE_SKEW
from commandline.options import option
from jvm.artifacts import SPARK_CAPABILITIES

INPUT, OUTPUT, DEAD_LETTER, STREAM = "input", "output", "dead letter", "stream"
NO_INPUT = ("--events DIR or --kafka-topics T1[,T2,...] is required: the input events (a "
            "directory of files, or Kafka topics)")
# The --help sections of the shared groups, in the order they are listed after a job's own.
SHARED_GROUPS = {INPUT: "input", OUTPUT: "output", DEAD_LETTER: "dead letter (invalid records)",
                 STREAM: "stream, Spark and progress"}


def duration(text: str) -> str:
    """argparse type of a duration option: the text, once ``joins.durations`` can read it.

    :param text: the option's value.
    """
    try:
        parse_duration_ms(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def spark_setting(text: str) -> str:
    """argparse type of ``--conf``: ``KEY=VALUE`` with a non-empty key.

    :param text: the option's value.
    """
    return _key_value(text, "spark.ui.enabled=true")


def kafka_setting(text: str) -> str:
    """argparse type of ``--kafka-option``: ``KEY=VALUE`` with a non-empty key.

    :param text: the option's value.
    """
    return _key_value(text, "kafka.security.protocol=SASL_SSL")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _key_value(text: str, example: str) -> str:
    key, equals, _ = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. {example})")
    return text


# Where the events come from -> the option that selects it and how the settings build its
# source (``attribution.spark.sources``). A run names exactly one of these options.
INPUTS = {
    "files": ("events", lambda s: SOURCES["files"](s.format, s.events, s.max_files_per_trigger)),
    "kafka": ("kafka_topics", lambda s: SOURCES["kafka"](
        s.kafka_bootstrap_servers or "", s.kafka_topics, s.format, s.kafka_starting_offsets,
        s.max_offsets_per_trigger, s.kafka_options)),
}
# An option that applies to one input only -> that input.
_INPUT_ONLY = {"max_files_per_trigger": "files", "max_offsets_per_trigger": "kafka"}


def default_log_file(app_name: str) -> str:
    """Where a job started at this moment writes Spark's log unless ``--log-file`` says.

    :param app_name: the job's name (``JobSettings.APP``).
    """
    return f"out/logs/{app_name}-{time.strftime('%Y%m%d-%H%M%S')}.log"


@dataclass(frozen=True)
class JobSettings:
    """The settings every streaming job shares; a job subclasses it with its own options.

    ``APP`` names the job (Spark's application name, the default log file's stem);
    ``DEFAULTS`` holds its defaults of ``output`` and ``checkpoint``.
    """

    APP: ClassVar[str] = "job"
    DEFAULTS: ClassVar[dict] = {"output": "out/output", "checkpoint": "out/checkpoints/job"}

    # -- input -----------------------------------------------------------------------------
    events: Optional[str] = option(None, "the directory of the input events (JSON lines, "
                                   "Parquet or Avro), read as a file stream; this or "
                                   "--kafka-topics is required (without either: exit code 3, "
                                   "no input)", INPUT, metavar="DIR")
    kafka_topics: Optional[str] = option(
        None, "read the events from these Kafka topics instead of --events, each record's value "
        "one event in --format json or avro; needs --kafka-bootstrap-servers", INPUT,
        metavar="T1[,T2,...]")
    kafka_bootstrap_servers: Optional[str] = option(
        None, "the Kafka cluster of --kafka-topics (and of --output-topic)", INPUT,
        metavar="HOST:PORT[,...]")
    format: str = option("json", "the events' format: of the input files (JSON lines, Parquet "
                         "or Avro, the generator's formats), or of each Kafka record's value "
                         "(json, or avro: Avro binary in the event schema) (default: "
                         "%(default)s)", INPUT, choices=FORMATS)
    max_files_per_trigger: Optional[int] = option(
        None, "read at most N new files per micro-batch; with N=1 every file is one watermark "
        "step (default: no limit)", INPUT, type=int, metavar="N")
    max_offsets_per_trigger: Optional[int] = option(
        None, "Kafka input: read at most N records per micro-batch over all partitions "
        "(default: no limit)", INPUT, type=int, metavar="N")
    kafka_starting_offsets: str = option(
        "earliest", "where a new checkpoint starts reading the topics; a checkpoint that has "
        "run resumes at its own offsets (default: %(default)s)", INPUT, choices=STARTING_OFFSETS)
    kafka_option: tuple = option(
        None, "an option of Spark's Kafka source and sink, passed as given (repeatable; the "
        "client's own settings are prefixed with 'kafka.', e.g. "
        "kafka.security.protocol=SASL_SSL)", INPUT,
        type=kafka_setting, action="append", metavar="KEY=VALUE")
    max_future_skew: str = option(
        DEFAULT_MAX_FUTURE_SKEW, "reject events whose ts is more than this ahead of their "
        "arrival (their file's modification time, their Kafka record's timestamp), so that "
        "one bad clock cannot drag the watermark forward and "
        "make every later event late; every run and both outputs judge a record alike "
        "(default: %(default)s)", INPUT, kind="duration", type=duration)

    # -- output ----------------------------------------------------------------------------
    output: Optional[str] = option(None, "output directory: a Delta table or Parquet files "
                                   "(--output-format), written exactly once (default: "
                                   "%(default)s)", OUTPUT, metavar="DIR")
    output_format: Optional[str] = option(
        None, "the table format of a new --output: delta (a Delta Lake table: every reader, "
        "Spark, pandas, DuckDB, sees committed versions only) or parquet (Parquet files and "
        "Spark's file sink log). An existing --output keeps its format, detected; a format "
        f"contradicting it is refused (default: {DEFAULT_OUTPUT_FORMAT} for a new output)",
        OUTPUT, choices=OUTPUT_FORMATS)

    # -- dead letter -----------------------------------------------------------------------
    dead_letter: Optional[str] = option(
        None, "Parquet directory for invalid records (raw record, reason, origin: source "
        "file, or topic, partition and offset; detection time), written by a second "
        "exactly-once streaming query (default: "
        "<output>-dead-letter)", DEAD_LETTER, metavar="DIR")

    # -- the stream, Spark and progress ----------------------------------------------------
    checkpoint: Optional[str] = option(None, "checkpoint directory; reuse it to resume after a "
                                       "stop or crash (default: %(default)s)", STREAM,
                                       metavar="DIR")
    trigger: str = option(AVAILABLE_NOW, "'available-now' processes everything present and "
                          "stops; an interval such as '10 seconds' runs continuously and waits "
                          "for new files or records (default: %(default)s)", STREAM)
    master: Optional[str] = option(None, "Spark master when run with plain python (default: "
                                   "local[*]; spark-submit's --master wins)", STREAM)
    shuffle_partitions: Optional[int] = option(
        None, "spark.sql.shuffle.partitions, fixed in the checkpoint at the first run "
        "(default: the cores Spark reports, unless set by spark-submit --conf)", STREAM,
        type=int, metavar="N")
    conf: tuple = option(None, "a Spark setting, as spark-submit's --conf (repeatable; e.g. "
                         "spark.ui.enabled=true opens the Spark UI, whose address is printed; "
                         "default: the UI is off)", STREAM, type=spark_setting, action="append",
                         metavar="KEY=VALUE")
    log_file: Optional[str] = option(
        None, "where Spark's own log goes (and its Python workers' output), instead of the "
        "terminal; error lines name it (default: out/logs/<job>-<start time>.log)", STREAM,
        metavar="FILE")
    progress_json: Optional[str] = option(
        None, "append one JSON line per micro-batch to FILE while the job runs (its counts, "
        "duration, rates and watermark), for a metrics collector", STREAM, metavar="FILE")
    quiet: bool = option(False, "no start-up or per-batch progress lines", STREAM,
                         action="store_true")

    # Derived in __post_init__.
    max_future_skew_ms: int = field(init=False, repr=False, compare=False)
    source: EventSource = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [kind for kind, (name, _) in INPUTS.items() if getattr(self, name)]
        if len(given) != 1:
            both = " and ".join(_flag(INPUTS[k][0]) for k in given)
            raise ValueError(f"give one input, not {both}" if given else NO_INPUT)
        kind = given[0]
        for name, only in _INPUT_ONLY.items():
            if getattr(self, name) and only != kind:
                raise ValueError(f"{_flag(name)} applies to {_flag(INPUTS[only][0])} input "
                                 "only")
        for name in ("kafka_topics", "kafka_option"):
            if getattr(self, name) and not self.kafka_bootstrap_servers:
                raise ValueError(f"{_flag(name)} needs --kafka-bootstrap-servers "
                                 "HOST:PORT[,...]")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError("--max-offsets-per-trigger must be >= 1")
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ValueError("--max-files-per-trigger must be >= 1")
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise ValueError("--shuffle-partitions must be >= 1")
        trigger_interval_ms(self.trigger, "--trigger")
        output = self.output or self.DEFAULTS["output"]
        self._set(output=output,
                  checkpoint=self.checkpoint or self.DEFAULTS["checkpoint"],
                  dead_letter=self.dead_letter or output.rstrip("/") + "-dead-letter",
                  log_file=self.log_file or default_log_file(self.APP),
                  conf=tuple(self.conf or ()), kafka_option=tuple(self.kafka_option or ()),
                  max_future_skew_ms=parse_duration_ms(self.max_future_skew,
                                                       "--max-future-skew"))
        self._set(source=INPUTS[kind][1](self))

    def _set(self, **values: Any) -> None:
        """Set fields of this frozen object while ``__post_init__`` completes it."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def input_kind(self) -> str:
        """The key of ``INPUTS`` this run reads: ``files`` or ``kafka``."""
        return next(kind for kind, (name, _) in INPUTS.items() if getattr(self, name))

    @property
    def kafka_options(self) -> dict:
        """``--kafka-option`` as a dict, the last of a repeated key winning."""
        return dict(setting.split("=", 1) for setting in self.kafka_option)

    @property
    def spark_conf(self) -> dict:
        """``--conf`` as a dict, the last of a repeated key winning."""
        return dict(setting.split("=", 1) for setting in self.conf)

    @property
    def streaming(self) -> bool:
        """True when the trigger keeps the query running, waiting for new files."""
        return trigger_interval_ms(self.trigger) is not None

    def resolved_output_format(self) -> str:
        """The format ``--output`` is written in (``sinks.choose_output_format``): the one it
        holds, else ``--output-format``, else the default. A URI ``--output`` is looked at once
        Spark runs (before, it counts as new).

        :raises OutputFormatRefused: ``--output-format`` contradicts what ``--output`` holds.
        """
        return choose_output_format(self.output, self.output_format)

    def output_kind(self) -> str:
        """What the run writes to: the key of its job's table of outputs (here the output
        format).

        :raises OutputFormatRefused: ``--output-format`` contradicts what ``--output`` holds.
        """
        return self.resolved_output_format()

    def jvm_needs(self) -> set:
        """What the run's input and output need of the JVM (keys of
        ``jvm.artifacts.SPARK_CAPABILITIES``): ``kafka``, ``delta``, both or none.

        :raises OutputFormatRefused: ``--output-format`` contradicts what ``--output`` holds.
        """
        return {self.input_kind, self.output_kind()} & set(SPARK_CAPABILITIES)

    @property
    def dead_letter_checkpoint(self) -> str:
        """The dead-letter query keeps its offsets inside the job's checkpoint: one
        ``--checkpoint`` resumes both."""
        return self.checkpoint.rstrip("/") + "/dead-letter"

    def replace(self, **changes: Any) -> "JobSettings":
        """A copy with ``changes`` (derived fields derived again).

        :param changes: field name -> new value.
        """
        return dataclasses.replace(self, **changes)
