"""``attribution-report``: what an attribution output covers, its totals, and conversions and
credited value per model, campaign and day, as tables, charts and one HTML page.

    python -m jobs.report --attributions DIR --out DIR [--from DATE] [--to DATE] [--models M,...]
"""
from __future__ import annotations

import argparse
import sys
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

import pandas as pd

from attribution.config import parse_models
from attribution.spark.changelog import InconsistentChangelog, fold_changelog
from attribution.spark.output import (
    CommittedOutput,
    NotAttributionOutput,
    read_committed_output,
)
from commandline.exits import ExitCode
from commandline.options import OneLineParser
from jobs.report_render import write_report
from jobs.report_tables import (
    DAY_STATUS,
    FINAL,
    NO_CAMPAIGN,
    PROVISIONAL,
    campaign_totals,
    daily_summary,
    describe_measures,
    last_final_day,
    mark_days,
    model_days,
    model_totals,
    ranked_campaigns,
    select_rows,
)

DESCRIPTION = """\
Summarise the attribution output of jobs/attribution_job.py: a Delta changelog, a Delta current
table (--current-table), or Parquet output (streaming or --mode batch).

Reads only committed rows: one version of a Delta table, or the files a Parquet output's
_spark_metadata log lists (a batch write's part files once _SUCCESS exists); a crashed run's
leftover files are never read. Folds the changelog (a retraction cancels the row it repeats;
the latest revision of every goal and model stands), keeps the goals of --from/--to and the
--models asked for, and reports what it covers (rows, goal times, the watermark and version
read, which days are final), the totals per model, and per model, campaign and UTC day of the
goal:
{measures}
Impressions without a campaign are reported under {no_campaign}.

A day is final when every goal it can hold is at or before the frontier final_through that the
Delta commit read published (the watermark minus the allowed lateness): its numbers can no
longer change. Other days are provisional. Parquet output publishes no frontier: its days are
marked unknown.

Writes into --out:
  totals.parquet, totals.csv        per model: goals, credited conversions, credited value,
                                    organic value and the credited share of all goals' value
  daily.parquet, daily.csv          the table above, with each day's status (final, ...)
  campaigns.parquet, campaigns.csv  the same summed over days, most conversions first
  conversions_by_campaign.png       credited conversions per campaign (one bar per model)
  daily_credited_value.png          daily credited and organic value, one panel per model,
                                    provisional days shaded
  report.html                       all of it on one page (images inlined; works offline),
                                    with the finality rule and each day's status
""".format(measures=describe_measures(), no_campaign=NO_CAMPAIGN)

EXAMPLES = """\
examples:
  make run && make report     # the example's output, report in out/example/report
  .venv/bin/attribution-report --attributions out/example/attributions --out out/example/report
  attribution-report --attributions out/current --out out/march --from 2024-03-01 \\
      --to 2024-03-31 --models last_touch,linear

exit codes:
  0    success
  2    bad arguments, or a path that holds no committed attribution output
"""


def goal_date(value: str) -> date:
    """A ``--from``/``--to`` value: a UTC date, ``YYYY-MM-DD``.

    :param value: the option's text.
    """
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date; expected YYYY-MM-DD, e.g. 2024-03-01") from None


def model_list(value: str) -> tuple[str, ...]:
    """A ``--models`` value: comma-separated model names, or ``all``.

    :param value: the option's text.
    """
    try:
        return parse_models(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv=None) -> argparse.Namespace:
    """The report's options from ``argv``; a bad option exits with one ``error:`` line.

    :param argv: the arguments (default: the command line).
    """
    parser = OneLineParser(
        prog="attribution-report", description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attributions", required=True, metavar="PATH",
                        help="the job's output: its --output directory (Delta or Parquet), or "
                             "its --current-table")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for the report's files (created; files in it replaced)")
    parser.add_argument("--from", dest="first_day", type=goal_date, metavar="DATE",
                        help="only goals of this UTC date and later (YYYY-MM-DD)")
    parser.add_argument("--to", dest="last_day", type=goal_date, metavar="DATE",
                        help="only goals of this UTC date and earlier (YYYY-MM-DD)")
    parser.add_argument("--models", type=model_list, metavar="M,...",
                        help="only these attribution models, comma-separated (default: every "
                             "model of the output)")
    parser.add_argument("--table-version", type=int, metavar="N",
                        help="report on version N of a Delta output (default: the latest)")
    args = parser.parse_args(argv)
    if args.first_day and args.last_day and args.first_day > args.last_day:
        parser.error(f"--from {args.first_day} is after --to {args.last_day}")
    return args


class ReportError(Exception):
    """A refusal of the report: one line, printed after ``error:``."""


def _utc(ms: Optional[int]) -> str:
    if ms is None:
        return "none"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(days: list) -> str:
    if not days:
        return "none"
    return f"{len(days)} ({days[0]}" + (f" to {days[-1]})" if len(days) > 1 else ")")


def select(args: argparse.Namespace, table: pd.DataFrame) -> pd.DataFrame:
    """The folded rows the options select; a ``ReportError`` when they select nothing.

    :param args: the report's options.
    :param table: the folded rows.
    """
    present = sorted(table["model"].unique())
    if args.models:
        absent = [m for m in args.models if m not in present]
        if absent:
            raise ReportError(f"--models {','.join(args.models)}: {args.attributions} has no "
                              f"rows of model {absent[0]}; it has {', '.join(present)}")
    selected = select_rows(table, args.first_day, args.last_day, args.models)
    if selected.empty:
        days = pd.to_datetime(table["goal_ts"], utc=True).dt.date
        raise ReportError(
            f"no goals dated {args.first_day or 'any day'} to {args.last_day or 'any day'} in "
            f"{args.attributions}: its goals are dated {days.min()} to {days.max()} (UTC)")
    return selected


def coverage(args: argparse.Namespace, output: CommittedOutput, table: pd.DataFrame,
             selected: pd.DataFrame, daily: pd.DataFrame) -> list[str]:
    """The lines saying what the report covers: source and version, rows, goals and their
    times, the watermark and frontier, the days final and provisional.

    :param args: the report's options.
    :param output: what was read.
    :param table: the folded rows.
    :param selected: the rows the options select.
    :param daily: the marked daily table.
    """
    if output.format == "delta":
        source = f"{args.attributions} (Delta table, version {output.version})"
    else:
        source = f"{args.attributions} (Parquet output)"
    filters = [f"goal dates {args.first_day or 'first'} to {args.last_day or 'last'}"
               if args.first_day or args.last_day else "",
               f"models {', '.join(args.models)}" if args.models else ""]
    filters = "; ".join(f for f in filters if f)
    times = pd.to_datetime(selected["goal_ts"], utc=True)
    lines = [
        f"source: {source}",
        f"rows: {len(output.rows)} committed, {len(table)} after folding the changelog, "
        f"{len(selected)} selected" + (f" ({filters})" if filters else ""),
        f"goals: {selected['goal_event_id'].nunique()}, models "
        f"{', '.join(sorted(selected['model'].unique()))}, goal times "
        f"{times.min():%Y-%m-%d %H:%M:%S} to {times.max():%Y-%m-%d %H:%M:%S} UTC",
    ]
    frontier = output.frontier
    if output.format != "delta":
        lines.append("as of: not known: Parquet output publishes no watermark or completeness "
                     "frontier (Delta output does), so no day is known to be final")
    elif frontier is None:
        lines.append(f"as of: version {output.version}; no commit of the table published a "
                     "completeness frontier, so no day is known to be final")
    else:
        lines.append(
            f"as of: watermark {_utc(frontier.watermark_ms)} (micro-batch {frontier.batch_id}, "
            f"version {frontier.version}); final through {_utc(frontier.final_through_ms)}")
    if frontier is not None:
        days = daily[["day", DAY_STATUS]].drop_duplicates()
        final = sorted(days.loc[days[DAY_STATUS] == FINAL, "day"])
        provisional = sorted(days.loc[days[DAY_STATUS] == PROVISIONAL, "day"])
        lines.append(f"days: final {_span(final)}; provisional {_span(provisional)}")
    return lines


def _duration(ms: int) -> str:
    # The allowed lateness as the job's options spell durations ("3 days", "30 minutes").
    if not ms:
        return "0"
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000),
                       ("second", 1000)):
        if ms % size == 0:
            count = ms // size
            return f"{count} {unit}" + ("s" if count != 1 else "")
    return f"{ms} ms"


def _listed(days: list) -> str:
    # A few days by name, more as a span, so that the line stays one line.
    if len(days) <= 6:
        return ", ".join(map(str, days))
    return f"{days[0]} to {days[-1]}"


def finality(output: CommittedOutput, days: pd.DataFrame) -> list[str]:
    """The sentences stating which days of the report are final and why: the rule, the frontier
    of the output read, the final days and the provisional ones (or why that is unknown).

    :param output: what was read.
    :param days: the table ``report_tables.model_days`` returned.
    """
    rule = ("A day is final when every goal it can hold is at or before the completeness "
            "frontier final_through, the watermark minus the allowed lateness: its numbers can "
            "no longer change. A later day is provisional: late records may still revise its "
            "goals.")
    frontier = output.frontier
    if output.format != "delta":
        return [rule, "This is Parquet output, which publishes no frontier (Delta output "
                      "does): whether a day is final is unknown, and every day is marked "
                      "unknown."]
    if frontier is None:
        return [rule, f"No commit of the table up to version {output.version} published a "
                      "frontier: whether a day is final is unknown, and every day is marked "
                      "unknown."]
    with_goals = days.loc[days["goals"] > 0, ["day", DAY_STATUS]].drop_duplicates()
    final = sorted(with_goals.loc[with_goals[DAY_STATUS] == FINAL, "day"])
    provisional = sorted(with_goals.loc[with_goals[DAY_STATUS] == PROVISIONAL, "day"])
    last = last_final_day(frontier.final_through_ms)
    if last is None:
        lines = [rule, "No day is final yet: the job has published no watermark yet."]
    else:
        lateness = _duration(frontier.allowed_lateness_ms or 0)
        lines = [rule,
                 f"Here final_through is {_utc(frontier.final_through_ms)}: the watermark "
                 f"{_utc(frontier.watermark_ms)} (micro-batch {frontier.batch_id}, version "
                 f"{frontier.version}) minus an allowed lateness of {lateness}.",
                 f"Final days: every day through {last}"
                 + (f"; {len(final)} with goals, {final[0]} to {final[-1]}." if final
                    else "; none of the report's days.")]
    first_open = (last + timedelta(days=1)) if last else None
    lines.append("Provisional days: " + (f"every day from {first_open} on" if first_open
                                         else "every day")
                 + (f"; {len(provisional)} with goals: {_listed(provisional)}." if provisional
                    else "; none of the report's days."))
    return lines


def _money(value: float) -> str:
    return "no values" if pd.isna(value) else f"{value:,.2f}"


def total_lines(models: pd.DataFrame) -> list[str]:
    """One line per model of ``report_tables.model_totals``.

    :param models: the totals per model.
    """
    lines = []
    for total in models.to_dict("records"):
        share = ("" if pd.isna(total["credited_share"])
                 else f" ({total['credited_share']:.0%} of all goals' value credited)")
        lines.append(f"totals {total['model']}: {total['goals']} goals "
                     f"({total['attributed_goals']} attributed, {total['organic_goals']} "
                     f"organic), {total['conversions']:,.2f} credited conversions, credited "
                     f"value {_money(total['credited_value'])}, organic value "
                     f"{_money(total['organic_value'])}{share}")
    return lines


def main(argv=None) -> int:
    """Write the report of an attribution output; return the exit code.

    :param argv: the arguments (default: the command line).
    """
    args = parse_args(argv)
    if Path(args.out).resolve() == Path(args.attributions).resolve():
        print("error: --out must not be the --attributions directory: the report's Parquet "
              "files would become part of the output", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        output = read_committed_output(args.attributions, args.table_version)
        table = fold_changelog(output.rows)
        if table.empty:
            raise ReportError(f"{args.attributions} holds attribution output without any "
                              "committed row yet")
        selected = select(args, table)
    except (NotAttributionOutput, InconsistentChangelog, ReportError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return int(ExitCode.USAGE)
    published = output.frontier is not None
    daily = mark_days(daily_summary(selected), output.final_through_ms, published)
    days = model_days(selected, output.final_through_ms, published)
    models = model_totals(selected)
    covers = coverage(args, output, table, selected, daily)
    try:
        # The page shows the totals as a table, so only what the report covers goes atop it.
        written = write_report(daily, ranked_campaigns(campaign_totals(daily)), models,
                               Path(args.out), covers, days=days,
                               finality=finality(output, days))
    except ImportError as err:
        print(f"error: the report's charts need matplotlib ({err}); install it with "
              "pip install '.[plot]'", file=sys.stderr)
        return int(ExitCode.USAGE)
    except OSError as err:
        print(f"error: cannot write the report to --out {args.out}: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    print("\n".join(covers + total_lines(models)))
    for path in written:
        print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
