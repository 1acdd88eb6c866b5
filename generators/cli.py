"""The command line: ``python -m generators generate|stream ...`` (also installed as ``streamgen``).

Every generator knob comes from ``GeneratorParams`` (its help text, default and validation), so
``--help`` always shows the defaults the library uses.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Optional, Sequence

from commandline.exits import ExitCode, Failure, exit_codes_help, report_failure
from commandline.options import add_options
from commandline.paths import check_writable_dir
from commandline.signals import StopRequests
from joins.durations import format_duration_ms

from .params import GROUPS, GeneratorParams, KafkaTarget, duration_ms
from .workers import PARALLEL_MIN_USERS

# Knobs that only shape a finite dataset, or only the endless stream.
BATCH_ONLY = {"files", "heartbeat", "span", "total_span", "sessions_per_user", "session_gap",
              "dormant_gap_prob", "lookback", "dedup_window"}
STREAM_ONLY = {"block_span", "sessions_per_block"}
_GROUP_TITLES = {
    "dataset": "dataset",
    "site": "site model (networkx page graph, Faker names)",
    "behaviour": "behaviour model (sessions, walks, clicks)",
    "value": "goal values (lognormal conversion values)",
    "disorder": "disorder model (arrival order, lateness, redelivery)",
    "stream": "endless stream (blocks of event time)",
    "kafka": "Kafka (produce the events to a topic)",
}
DURATION_HELP = ("Durations read like '90 seconds', '2 minutes', '1.5h', '3 days': a number and "
                 "a unit ('0' alone is zero); for --duration and --file-interval a bare number "
                 "is seconds.")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every option's help (not for required ones), examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Errors as one short line plus a pointer to --help, not the whole usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nRun '{self.prog} --help' for every option "
                     "and its default.\n")


def _add_params(parser: argparse.ArgumentParser, skip: set, cls: type = GeneratorParams,
                groups: tuple = GROUPS) -> None:
    add_options(parser, cls, {group: _GROUP_TITLES[group] for group in groups}, skip=skip)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m generators",
        description="Synthetic, disordered, reproducible event streams for conversion "
                    "attribution (events in the spec schema: visits, goals, ad impressions).",
        formatter_class=_HelpFormatter,
        epilog="examples:\n"
               "  python -m generators generate --out /tmp/ds\n"
               "  python -m generators generate --out /tmp/ds --format parquet --files 50 \\\n"
               "      --disorder per-source --late-fraction 0.01 --redelivery-rate 0.02 "
               "--heartbeat\n"
               "  python -m generators stream --rate 5000 --duration 2m --out /tmp/incoming   "
               "# a job reads --events /tmp/incoming/events\n"
               "  python -m generators stream --rate 5000 --duration 2m --out /tmp/state \\\n"
               "      --kafka-bootstrap-servers 127.0.0.1:9092 --topic events\n\n"
               "Run 'python -m generators generate --help' for every knob and its default.\n\n"
               + exit_codes_help(ExitCode.OK, ExitCode.USAGE, ExitCode.OUTPUT,
                                 ExitCode.INTERRUPTED, ExitCode.TERMINATED))
    commands = parser.add_subparsers(dest="command", metavar="{generate,stream}", required=True,
                                     parser_class=_Parser)

    gen = commands.add_parser(
        "generate", formatter_class=_HelpFormatter,
        help="write a finite dataset: event files, truth, manifest, pictures",
        description="Write DIR/events/part-NNNNN.<ext> in arrival order, "
                    "DIR/truth/attributions.parquet (the batch oracle over the written files), "
                    "DIR/manifest.json (seed, params, counts, event-time range, disorder "
                    "statistics, late events), DIR/skew.png (event time against arrival order, "
                    "whole and zoomed) and DIR/delays.png (arrival delay per source); with "
                    "--kafka-bootstrap-servers, then produce the event files' records to --topic "
                    "in the same order.\n"
                    + DURATION_HELP)
    gen.add_argument("--out", required=True, metavar="DIR", help="output directory")
    gen.add_argument("--overwrite", action="store_true",
                     help="replace a dataset already in DIR")
    gen.add_argument("--truth", action=argparse.BooleanOptionalAction, default=True,
                     help="compute DIR/truth/attributions.parquet with the batch oracle "
                          "(the slow part on large runs)")
    gen.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                     help="draw DIR/skew.png and DIR/delays.png (needs matplotlib; skipped with "
                          "a note if missing)")
    gen.add_argument("--processes", type=int, default=None, metavar="N",
                     help="processes for the pictures and the truth, this one included "
                          f"(default: 2 from {PARALLEL_MIN_USERS:,} users on 2 or more cores, "
                          "else 1); the output does not depend on it")
    gen.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    _add_params(gen, STREAM_ONLY)
    _add_params(gen, set(), KafkaTarget, ("kafka",))

    load = commands.add_parser(
        "stream", formatter_class=_HelpFormatter,
        help="load mode: keep writing new event files at a target rate",
        description="Write the next rate x file-interval events every file-interval into "
                    "DIR/events, as generate lays out a dataset (temporary name, then atomic "
                    "rename; a job reads --events DIR/events), or produce them to --topic with "
                    "--kafka-bootstrap-servers, until the duration is over, then "
                    "print the achieved rate. The content is reproducible: the same options "
                    "give the same records; only the timing follows the clock.\n" + DURATION_HELP)
    load.add_argument("--out", required=True, metavar="DIR",
                      help="the stream's directory: event files go to DIR/events, which a "
                           "streaming job reads, and the stream's state (for --resume) beside "
                           "it (with --topic: the state only)")
    load.add_argument("--rate", type=float, default=1000.0, metavar="EVENTS_PER_S",
                      help="target events per second")
    load.add_argument("--duration", default="60 seconds", metavar="DURATION",
                      help="how long to keep writing")
    load.add_argument("--file-interval", default="1 second", metavar="DURATION",
                      help="one new file per interval")
    load.add_argument("--resume", action="store_true",
                      help="continue the stream already in DIR where it stopped")
    load.add_argument("--final-heartbeat", action="store_true",
                      help="after the last events, write a heartbeat file at the largest event "
                           "time written + --watermark-delay + 1 ms, so that a consumer's "
                           "watermark passes every goal and it emits them all (the stream "
                           "cannot be resumed after it)")
    load.add_argument("--idle-heartbeat", default=None, metavar="DURATION",
                      help="while no file has been written for this long (a long "
                           "--file-interval, or the end of --duration), write a heartbeat file "
                           "every DURATION. Its time is the stream's clock, the arrival time of "
                           "the next record, so it never makes a later record late that its "
                           "own delay does not (and it flushes only what the data has reached: "
                           "see --final-heartbeat); a bare number is seconds")
    load.add_argument("--quiet", action="store_true", help="print only the final rate")
    _add_params(load, BATCH_ONLY)
    _add_params(load, set(), KafkaTarget, ("kafka",))
    return parser


def _seconds(text: str, option: str) -> float:
    """A duration in seconds; a bare number is seconds here."""
    try:
        return float(text)
    except ValueError:
        return duration_ms(text, option) / 1000.0


def _params(args: argparse.Namespace, cls: type = GeneratorParams):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def _topic(args: argparse.Namespace, params: GeneratorParams):
    """The producer to ``--topic``, or ``None`` without ``--kafka-bootstrap-servers``; made
    before any work, so that an unreachable broker costs seconds, not a generated dataset."""
    target = _params(args, KafkaTarget)
    if not target.enabled:
        return None
    from .topic import TopicWriter

    return TopicWriter(target, params.format)


def _generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .dataset import OutputExists, generate

    try:
        params = _params(args)
        _params(args, KafkaTarget)
    except ValueError as err:
        parser.error(str(err))
    if args.processes is not None and args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    check_writable_dir(args.out, "--out", ExitCode.OUTPUT)
    topic = _topic(args, params)
    started = time.perf_counter()
    try:
        result = generate(params, args.out, truth=args.truth, plot=args.plot,
                          overwrite=args.overwrite, progress=not args.quiet,
                          processes=args.processes)
    except OutputExists as err:
        parser.error(str(err))
    if topic is not None:
        from .writers import file_record_values

        with topic:
            produced = sum(topic.send(file_record_values(f, params.format))
                           for f in result.event_files)
    if not args.quiet:
        seconds = time.perf_counter() - started
        m = result.manifest
        lines = m["summary"]
        print(f"{result.records:,} records ({m['counts']['events']:,} events, "
              f"{m['counts']['redelivered_records']:,} redelivered) in {len(result.event_files)} "
              f"{params.format} files under {result.events_dir}")
        if "event_time" in lines:
            print(lines["event_time"])
        print(lines["disorder"])
        if "truth" in lines:
            print(f"{lines['truth']} in {result.truth_path}")
            print(lines["multi_candidate"])
        if result.pictures:
            print("pictures: " + ", ".join(str(p) for p in result.pictures))
        elif args.plot:
            print("pictures skipped: matplotlib is not installed (pip install '.[plot]')")
        stages = ", ".join(f"{name} {format_duration_ms(s * 1000)}"
                           for name, s in result.seconds.items())
        print(f"manifest: {result.out / 'manifest.json'}  ({format_duration_ms(seconds * 1000)}: "
              f"{stages})")
        if topic is not None:
            print(f"produced {produced:,} records to topic {topic.topic} at "
                  f"{args.kafka_bootstrap_servers}")
    return 0


def _stream(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .load import StreamDirError, print_progress, run_load

    check_writable_dir(args.out, "--out", ExitCode.OUTPUT)
    try:
        params = _params(args)
        duration = _seconds(args.duration, "--duration")
        interval = _seconds(args.file_interval, "--file-interval")
        idle = None if args.idle_heartbeat is None else _seconds(args.idle_heartbeat,
                                                                 "--idle-heartbeat")
        topic = _topic(args, params)
        try:
            report = run_load(params, args.out, args.rate, duration, interval,
                              resume=args.resume, log=None if args.quiet else print_progress,
                              final_heartbeat=args.final_heartbeat, idle_heartbeat_s=idle,
                              topic=topic)
        finally:
            if topic is not None:
                topic.close()
    except (ValueError, StreamDirError) as err:
        parser.error(str(err))
    print(report.summary())
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m generators`` and the ``streamgen`` console script.

    :param argv: the arguments, without the program name; ``None`` reads ``sys.argv``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    subparser = parser._subparsers._group_actions[0].choices[args.command]
    command = _generate if args.command == "generate" else _stream
    # Ctrl-C or SIGTERM ends the command with its exit code and no traceback; every file is
    # written under a temporary name and renamed, so none is left half-written.
    with StopRequests(interrupt=True) as stop:
        try:
            return command(args, subparser)
        except KeyboardInterrupt:
            print(f"stopped by {stop.signal_name or 'SIGINT'}", file=sys.stderr)
            return int(stop.exit_code or ExitCode.INTERRUPTED)
        except Failure as failure:
            return report_failure(failure)
        except OSError as err:
            return report_failure(Failure(ExitCode.OUTPUT,
                                          f"cannot write {err.filename}: {err.strerror}; "
                                          f"check --out {args.out}"))


if __name__ == "__main__":
    sys.exit(main())
