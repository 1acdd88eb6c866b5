"""``attribution-report``: conversions and credited value per model, campaign and day, from a
job's attribution output, as tables, charts and one HTML page.

    python -m jobs.report --attributions DIR --out DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attribution.spark.changelog import InconsistentChangelog, fold_changelog
from attribution.spark.output import NotAttributionOutput, read_attributions
from jobs.report_render import write_report
from jobs.report_tables import NO_CAMPAIGN, campaign_totals, daily_summary, describe_measures

DESCRIPTION = """\
Summarise the attribution output of jobs/attribution_job.py (streaming or --mode batch).

Reads only the rows the job committed (the file sink's _spark_metadata log, or the part files
of a batch write once _SUCCESS exists; a crashed run's leftover files are ignored), folds the
changelog (a retraction cancels the row it repeats; the latest revision of every goal and model
stands), and reports per model, campaign and UTC day of the goal:
{measures}
Impressions without a campaign are reported under {no_campaign}.

Writes into --out:
  daily.parquet, daily.csv          the table above
  campaigns.parquet, campaigns.csv  the same summed over days
  conversions_by_campaign.png       credited conversions per campaign, one bar per model
  daily_credited_value.png          daily credited value per model
  report.html                       tables and charts on one page (images inlined; works offline)
""".format(measures=describe_measures(), no_campaign=NO_CAMPAIGN)

EXAMPLES = """\
example:
  make run                                   # writes out/example/attributions
  python -m jobs.report --attributions out/example/attributions --out out/example/report
  xdg-open out/example/report/report.html
"""


def parse_args(argv=None) -> argparse.Namespace:
    """The report's options from ``argv``; a bad option exits with a usage error.

    :param argv: the arguments (default: the command line).
    """
    parser = argparse.ArgumentParser(
        prog="attribution-report", description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attributions", required=True, metavar="DIR",
                        help="the job's --output directory")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for the report's files (created; files in it replaced)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Write the report of an attribution output; return the exit code.

    :param argv: the arguments (default: the command line).
    """
    args = parse_args(argv)
    if Path(args.out).resolve() == Path(args.attributions).resolve():
        print("error: --out must not be the --attributions directory: the report's Parquet "
              "files would become part of the output", file=sys.stderr)
        return 2
    try:
        changelog = read_attributions(args.attributions)
        table = fold_changelog(changelog)
    except (NotAttributionOutput, InconsistentChangelog) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if table.empty:
        print(f"error: {args.attributions} holds attribution output without any committed row "
              "yet", file=sys.stderr)
        return 2
    daily = daily_summary(table)
    summary = (f"{args.attributions}: {len(changelog)} committed rows, {len(table)} after "
               f"folding the changelog; {table['goal_event_id'].nunique()} goals; models "
               f"{', '.join(sorted(table['model'].unique()))}; days {daily['day'].min()} to "
               f"{daily['day'].max()} (UTC)")
    try:
        written = write_report(daily, campaign_totals(daily), Path(args.out), summary)
    except ImportError as err:
        print(f"error: the report's charts need matplotlib ({err}); install it with "
              "pip install '.[plot]'", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write the report to --out {args.out}: {err}", file=sys.stderr)
        return 2
    print(summary)
    for path in written:
        print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
