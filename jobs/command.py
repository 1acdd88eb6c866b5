"""The skeleton every streaming job's command is built on: parse, check, start Spark, run,
report, and map whatever goes wrong to one ``error:`` line and its exit code.

A job subclasses ``StreamingJob``: it names its settings class (a ``jobs.settings.JobSettings``),
its ``--help`` text and its own option groups, and writes ``run`` (start its queries and follow
them) and ``report`` (the final report). ``main`` does the rest, the same way for every job:

1. the command line becomes the job's frozen settings (a bad option: one line, exit 2);
2. the checks that need no Spark (``preflight``): the input (exit 3; an empty directory or a
   missing topic too, unless the run waits for input), the output, dead-letter and checkpoint
   directories, the progress file (exit 4 or 5), then the job's own (``checks``);
3. Spark starts (``runtime.start_spark``): its log away from the terminal, the JVM's stop
   signals handed to the command, the Spark UI's address when asked for;
4. ``run``; SIGINT/SIGTERM stop it after the current micro-batch (``commandline.signals``);
5. the report on stdout, the job's files (``write_files``), and the exit code: 0, or 130/143
   after a signal, or 6 when the run read records and not one was valid (``records_read``).
   A signal while Spark starts ends the command before anything is written.

Failures: a ``Failure`` keeps its code; an exception of ``failures`` gets its code; a file Spark
cannot decode is explained (exit 3); anything else is exit 1 with its traceback in the log.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional, Sequence

from attribution.spark.sinks import OutputFormatRefused
from attribution.spark.validation import unreadable_input
from commandline.exits import ExitCode, Failure, report_failure
from commandline.options import OneLineParser, add_options, settings_from
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from jobs.runtime import (
    check_dead_letter_directory,
    check_input,
    check_sink_directory,
    ship_project,
    start_spark,
    unexpected_failure,
)
from jobs.settings import (
    DEAD_LETTER,
    INPUT,
    INPUTS,
    NO_INPUT,
    OUTPUT,
    SHARED_GROUPS,
    STREAM,
    JobSettings,
)

STOPPING = "stopping after the current micro-batch"


class StreamingJob:
    """A job's command on the shared skeleton; ``main`` runs it (see the module's docstring).

    Class attributes a job sets: ``settings_class`` (its ``JobSettings`` subclass), ``prog``,
    ``description`` and ``epilog`` (its ``--help``), ``groups`` (its own option groups: group
    -> title) and ``failures`` (exception types of the libraries it calls -> exit code).
    """

    settings_class: ClassVar[type] = JobSettings
    prog: ClassVar[str] = "job"
    description: ClassVar[str] = ""
    epilog: ClassVar[str] = ""
    groups: ClassVar[Mapping[str, str]] = {}
    failures: ClassVar[Mapping[type, ExitCode]] = {}

    # -- the command line ----------------------------------------------------------------------
    def parser(self) -> argparse.ArgumentParser:
        """The job's parser: the shared groups' options and the job's own, from the fields of
        ``settings_class``."""
        parser = OneLineParser(prog=self.prog, description=self.description,
                               epilog=self.epilog,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        titles = {INPUT: SHARED_GROUPS[INPUT], OUTPUT: SHARED_GROUPS[OUTPUT], **self.groups,
                  DEAD_LETTER: SHARED_GROUPS[DEAD_LETTER], STREAM: SHARED_GROUPS[STREAM]}
        add_options(parser, self.settings_class, titles, defaults=self.settings_class.DEFAULTS)
        return parser

    def parse(self, argv: Optional[Sequence[str]] = None) -> JobSettings:
        """The job's settings from a command line; a bad one exits 2 with one error line.

        :param argv: the arguments (default: ``sys.argv[1:]``).
        """
        parser = self.parser()
        namespace = parser.parse_args(argv)
        if not any(getattr(namespace, name) for name, _ in INPUTS.values()):
            # no input: the input's exit code, as for a missing directory
            parser.exit(int(ExitCode.INPUT), f"{self.prog}: error: {NO_INPUT} (see "
                                             f"{self.prog} --help)\n")
        try:
            return settings_from(self.settings_class, namespace)
        except ValueError as err:
            parser.error(str(err))

    # -- before Spark starts -------------------------------------------------------------------
    def waits_for_input(self, settings: JobSettings) -> bool:
        """True when the run keeps polling for input, so an empty input directory (or a topic
        not created yet) is fine.

        :param settings: the run's settings.
        """
        return settings.streaming

    def preflight(self, settings: JobSettings) -> JobSettings:
        """Every check that needs no Spark; returns the settings the run goes on with.

        :param settings: the settings parsed from the command line.
        :raises Failure: with the exit code of the kind of problem.
        """
        waiting = check_input(settings, self.waits_for_input(settings))
        if waiting and not settings.quiet:
            print(waiting, file=sys.stderr, flush=True)
        if settings.progress_json:
            check_writable_dir(_parent(settings.progress_json), "--progress-json's directory",
                               ExitCode.OUTPUT)
        self.check_outputs(settings)
        return self.checks(settings)

    def check_outputs(self, settings: JobSettings) -> None:
        """The checkpoint, output and dead-letter directories of a streaming run.

        :param settings: the run's settings.
        :raises Failure: ``ExitCode.CHECKPOINT`` or ``ExitCode.OUTPUT``.
        """
        check_writable_dir(settings.checkpoint, "--checkpoint", ExitCode.CHECKPOINT)
        try:
            settings.resolved_output_format()  # --output-format against what --output holds
        except OutputFormatRefused as err:
            raise Failure(ExitCode.OUTPUT, str(err)) from None
        check_sink_directory(settings.output, "--output", settings.checkpoint)
        check_dead_letter_directory(settings)

    def checks(self, settings: JobSettings) -> JobSettings:
        """The job's own checks before Spark starts; returns the settings to run with.

        :param settings: the run's settings, after the shared checks.
        :raises Failure: with the exit code of the kind of problem.
        """
        return settings

    # -- the job -------------------------------------------------------------------------------
    def run(self, spark, settings: JobSettings, stop: Optional[StopRequests] = None) -> Any:
        """Run the job until its trigger finishes or ``stop`` is requested; its result.

        :param spark: the session.
        :param settings: the run's settings.
        :param stop: the command's stop requests (``None``: none).
        """
        raise NotImplementedError(type(self))

    def report(self, result: Any, settings: JobSettings, stop: StopRequests) -> str:
        """The final report of ``result``, printed on stdout.

        :param result: what ``run`` returned.
        :param settings: the run's settings.
        :param stop: the command's stop requests (the report names the signal, if any).
        """
        raise NotImplementedError(type(self))

    def records_read(self, result: Any) -> tuple[int, int, Optional[list[int]]]:
        """What the run read, for the check that it found something valid: the records read,
        the invalid ones among them, and the micro-batches of this run (``None``: a batch run,
        whose dead letter is its own whole).

        :param result: what ``run`` returned.
        """
        raise NotImplementedError(type(self))

    def write_files(self, result: Any, settings: JobSettings) -> None:
        """The files a job writes after its report (``--report-json``, ``--metrics``).

        :param result: what ``run`` returned.
        :param settings: the run's settings.
        """

    # -- the skeleton --------------------------------------------------------------------------
    def main(self, argv: Optional[Sequence[str]] = None) -> int:
        """Run the command; returns its exit code (``commandline.exits.ExitCode``).

        :param argv: the arguments (default: ``sys.argv[1:]``).
        """
        settings = self.parse(argv)
        with StopRequests(announce=STOPPING) as stop:
            log_file = result = None
            restore = _nothing
            try:
                settings = self.preflight(settings)
                spark, log_file, restore = start_spark(settings, stop)
                if not stop.requested:
                    ship_project(spark)
                    result = self.run(spark, settings, stop)
            except Failure as failure:
                return report_failure(failure)
            except KeyboardInterrupt:  # Ctrl-C while PySpark's own handler was in place
                stop.signum = stop.signum or signal.SIGINT
            except Exception as err:
                failure = self.failure(err, stop, log_file, settings.log_file)
                if failure is None:
                    return int(stop.exit_code)
                return report_failure(failure)
            finally:
                restore()
        if result is None:  # the signal came while Spark was starting
            print(f"stopped by {stop.signal_name} before the first micro-batch; nothing was "
                  "written", file=sys.stderr)
            return int(stop.exit_code)
        print(self.report(result, settings, stop), flush=True)
        self.write_files(result, settings)
        if stop.requested:
            print(f"stopped by {stop.signal_name}; rerun with the same --checkpoint to resume",
                  file=sys.stderr)
            return int(stop.exit_code)
        nothing_valid = no_valid_record(*self.records_read(result), settings.dead_letter)
        return report_failure(nothing_valid) if nothing_valid else int(ExitCode.OK)

    def failure(self, error: Exception, stop: StopRequests, spark_log: Optional[str],
                log_file: str) -> Optional[Failure]:
        """What an exception from the checks or the run means for the user: ``None`` when a
        stop signal explains it (said on stderr), else the ``Failure`` to report.

        :param error: the exception.
        :param stop: the command's stop requests.
        :param spark_log: the log file Spark writes, if this command started it.
        :param log_file: where an unexpected failure's traceback goes.
        """
        if stop.requested:  # e.g. SIGTERM sent to the whole process group: the JVM is gone
            print(f"stopped by {stop.signal_name}, which reached Spark too and ended it; rerun "
                  "with the same --checkpoint to resume (a micro-batch it cut short is redone)",
                  file=sys.stderr)
            return None
        for kind, code in self.failures.items():
            if isinstance(error, kind):
                return Failure(code, str(error))
        explanation = unreadable_input(error)  # a file Spark cannot decode is the user's
        if explanation is not None:
            where = f" Spark's log: {spark_log}." if spark_log else ""
            return Failure(ExitCode.INPUT, explanation + where)
        return unexpected_failure(error, spark_log or log_file)


def no_valid_record(read: int, invalid: int, batch_ids: Optional[list[int]],
                    dead_letter: str) -> Optional[Failure]:
    """A run that read records and found every one invalid is not a success: it wrote nothing
    but its dead letter (a directory of other files given as ``--events``, a wrong topic).

    :param read: the records the run read.
    :param invalid: the invalid records among them.
    :param batch_ids: the run's micro-batches (``None``: a batch run).
    :param dead_letter: the dead-letter directory, whose reasons the line quotes.
    :returns: the failure to report (``ExitCode.NO_VALID_INPUT``), or ``None``.
    """
    from attribution.spark.dead_letter import most_frequent_reasons

    if read == 0 or invalid < read:
        return None
    reasons = "; ".join(f"{reason} ({n})"
                        for reason, n in most_frequent_reasons(dead_letter, batch_ids))
    return Failure(ExitCode.NO_VALID_INPUT,
                   f"not one of the {read} records read was valid; the most frequent reasons: "
                   f"{reasons or 'unknown'}; every record is in the dead letter {dead_letter}")


def _parent(path: str) -> str:
    return str(Path(path).parent)


def _nothing() -> None:
    pass
