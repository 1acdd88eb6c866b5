"""The options every streaming job shares, declared once per group, and the settings they make.

``JobSettings`` is a frozen dataclass whose fields are the command-line options of the groups
every job has: the input (``--events``, ``--format``, ``--max-files-per-trigger``,
``--max-future-skew``), the output (``--output``), the dead letter (``--dead-letter``) and the
stream (``--checkpoint``, ``--trigger``, Spark's settings, the log, the progress). A job's own
settings subclass it with the fields of its own groups, and its ``DEFAULTS`` give the outputs
their per-job default paths. The fields are declared with ``commandline.options.option``, so
one declaration gives the flag, its ``--help`` and its default; ``__post_init__`` checks the
values and derives the ones a run needs (milliseconds, default paths), so a settings object is
valid however it was made, from a command line or in code.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from attribution.config import parse_duration_ms
from attribution.spark.formats import FORMATS
from attribution.spark.validation import DEFAULT_MAX_FUTURE_SKEW
from commandline.options import option

INPUT, OUTPUT, DEAD_LETTER, STREAM = "input", "output", "dead letter", "stream"
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
    key, equals, _ = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. spark.ui.enabled=true)")
    return text


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
    events: Optional[str] = option(None, "required: the directory of the input events (JSON "
                                   "lines, Parquet or Avro), read as a file stream; without "
                                   "it, exit code 3 (no input)", INPUT, metavar="DIR")
    format: str = option("json", "input file format: JSON lines, Parquet or Avro (the "
                         "generator's formats; default: %(default)s)", INPUT, choices=FORMATS)
    max_files_per_trigger: Optional[int] = option(
        None, "read at most N new files per micro-batch; with N=1 every file is one watermark "
        "step (default: no limit)", INPUT, type=int, metavar="N")
    max_future_skew: str = option(
        DEFAULT_MAX_FUTURE_SKEW, "reject events whose ts is more than this ahead of their "
        "file's modification time, so that one bad clock cannot drag the watermark forward and "
        "make every later event late; every run and both outputs judge a record alike "
        "(default: %(default)s)", INPUT, kind="duration", type=duration)

    # -- output ----------------------------------------------------------------------------
    output: Optional[str] = option(None, "Parquet output directory, written by Spark's "
                                   "exactly-once file sink (default: %(default)s)", OUTPUT,
                                   metavar="DIR")

    # -- dead letter -----------------------------------------------------------------------
    dead_letter: Optional[str] = option(
        None, "Parquet directory for invalid records (raw record, reason, source file, "
        "detection time), written by a second exactly-once streaming query (default: "
        "<output>-dead-letter)", DEAD_LETTER, metavar="DIR")

    # -- the stream, Spark and progress ----------------------------------------------------
    checkpoint: Optional[str] = option(None, "checkpoint directory; reuse it to resume after a "
                                       "stop or crash (default: %(default)s)", STREAM,
                                       metavar="DIR")
    trigger: str = option("available-now", "'available-now' processes everything present and "
                          "stops; an interval such as '10 seconds' runs continuously and waits "
                          "for new files (default: %(default)s)", STREAM)
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

    def __post_init__(self) -> None:
        if not self.events:
            raise ValueError("--events is required: the directory of input files")
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ValueError("--max-files-per-trigger must be >= 1")
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise ValueError("--shuffle-partitions must be >= 1")
        output = self.output or self.DEFAULTS["output"]
        self._set(output=output,
                  checkpoint=self.checkpoint or self.DEFAULTS["checkpoint"],
                  dead_letter=self.dead_letter or output.rstrip("/") + "-dead-letter",
                  log_file=self.log_file or default_log_file(self.APP),
                  conf=tuple(self.conf or ()),
                  max_future_skew_ms=parse_duration_ms(self.max_future_skew,
                                                       "--max-future-skew"))

    def _set(self, **values: Any) -> None:
        """Set fields of this frozen object while ``__post_init__`` completes it."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def spark_conf(self) -> dict:
        """``--conf`` as a dict, the last of a repeated key winning."""
        return dict(setting.split("=", 1) for setting in self.conf)

    @property
    def streaming(self) -> bool:
        """True when the trigger keeps the query running, waiting for new files."""
        return self.trigger not in ("available-now", "once")

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
