"""Writing the attribution report: its tables as Parquet and CSV, two PNG charts, one HTML page.

The charts are drawn with matplotlib's Agg canvas (no display needed). The HTML page embeds
them as base64 data URIs, so ``report.html`` is one self-contained file that works offline.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from jobs.report_tables import DAY_STATUS, MEASURES, ORGANIC, PROVISIONAL, campaign_rank

TOTALS = "totals"            # totals.parquet, totals.csv
DAILY = "daily"              # daily.parquet, daily.csv
CAMPAIGNS = "campaigns"      # campaigns.parquet, campaigns.csv
CONVERSIONS_CHART = "conversions_by_campaign.png"
VALUE_CHART = "daily_credited_value.png"
HTML_PAGE = "report.html"
MAX_CHART_CAMPAIGNS = 20     # beyond this the bar chart keeps the campaigns with most conversions
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v")


def _figure(width: float = 9.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots()


def _title(figure, text: str) -> None:
    # The figure's title, above the plot and everything around it, the legend included.
    figure.suptitle(text)


def _legend(figure, entries: int) -> None:
    # Below the plot, in a row: it hides no bar or line, and stays clear of the title at the
    # top (a legend at the upper right sits level with the title, over its end once long).
    figure.legend(title="model", loc="outside lower center", ncols=min(entries, 6))


def _say_empty(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def conversions_chart(totals: pd.DataFrame, path: Path) -> None:
    """Credited conversions per campaign, one bar per model, as a PNG at ``path``.

    ``totals``: ``report_tables.campaign_totals``. The ``(organic)`` line is left out: organic
    goals credit no campaign. Campaigns are ranked, most conversions (over all models) first.

    :param totals: the campaign totals (``report_tables.campaign_totals``).
    :param path: the PNG file to write.
    """
    credited = totals[totals["campaign"] != ORGANIC]
    by_campaign = credited.pivot_table(index="campaign", columns="model", values="conversions",
                                       aggfunc="sum", fill_value=0.0)
    title = "Credited conversions per campaign, by model"
    by_campaign = by_campaign.loc[campaign_rank(credited)]
    if len(by_campaign) > MAX_CHART_CAMPAIGNS:
        by_campaign = by_campaign.iloc[:MAX_CHART_CAMPAIGNS]
        title += f" (the {MAX_CHART_CAMPAIGNS} campaigns with most conversions)"
    figure, axes = _figure(width=min(16.0, max(6.0, 2.0 + 0.35 * by_campaign.size)))
    _title(figure, title)
    if by_campaign.empty:
        _say_empty(axes, "no attributed goals")
    else:
        width = 0.8 / by_campaign.shape[1]
        for n, model in enumerate(by_campaign.columns):
            positions = [x + (n - (by_campaign.shape[1] - 1) / 2) * width
                         for x in range(len(by_campaign))]
            axes.bar(positions, by_campaign[model], width, label=model)
        axes.set_xticks(range(len(by_campaign)), by_campaign.index, rotation=30, ha="right")
        axes.set_ylabel("conversions (sum of credit)")
        _legend(figure, by_campaign.shape[1])
    figure.savefig(path, dpi=100)


def value_chart(daily: pd.DataFrame, path: Path) -> None:
    """Daily credited value per model (all campaigns) as a PNG time series at ``path``.

    ``daily``: ``report_tables.daily_summary``, possibly marked (``report_tables.mark_days``):
    provisional days are then shaded.

    :param daily: the daily summary (``report_tables.daily_summary``).
    :param path: the PNG file to write.
    """
    series = (daily.groupby(["day", "model"])["credited_value"].sum(min_count=1)
              .unstack("model").sort_index())
    figure, axes = _figure()
    _title(figure, "Daily credited value per model (UTC day of the goal)")
    if series.isna().all().all():
        _say_empty(axes, "no conversion values in this output\n(goals carry no value)")
    else:
        from matplotlib.dates import DateFormatter, DayLocator

        days = pd.to_datetime(series.index)
        # Models often agree (credits sum to 1 per goal), so lines must stay visible on top of
        # each other: each model gets its own line style and marker.
        for n, model in enumerate(series.columns):
            axes.plot(days, series[model], label=model, linestyle=LINE_STYLES[n % 4],
                      marker=MARKERS[n % 5], markersize=max(3, 10 - 3 * n))
        if DAY_STATUS in daily.columns:
            provisional = sorted(set(daily.loc[daily[DAY_STATUS] == PROVISIONAL, "day"]))
            for n, day in enumerate(provisional):
                start = pd.Timestamp(day)
                axes.axvspan(start - pd.Timedelta(hours=12), start + pd.Timedelta(hours=12),
                             color="0.9", zorder=0, label="provisional day" if n == 0 else None)
        span = (days.max() - days.min()).days
        axes.xaxis.set_major_locator(DayLocator(interval=max(1, -(-span // 10))))
        axes.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
        axes.tick_params(axis="x", labelrotation=30)
        axes.set_ylabel("credited value")
        _legend(figure, len(axes.get_legend_handles_labels()[0]))
    figure.savefig(path, dpi=100)


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; }
td:nth-child(-n+2) { text-align: left; }
img { max-width: 100%; }
"""


def html_page(daily: pd.DataFrame, totals: pd.DataFrame, charts: list[Path],
              summary: list[str], models: pd.DataFrame) -> str:
    """The report as one HTML document: ``summary``, the totals per model, the charts inlined,
    then the campaign and daily tables.

    :param daily: the daily summary (``report_tables.daily_summary``, marked).
    :param totals: the campaign totals (``report_tables.campaign_totals``).
    :param charts: the chart PNG files to inline.
    :param summary: lines saying what the report covers, shown first.
    :param models: the totals per model (``report_tables.model_totals``).
    """
    def table(frame: pd.DataFrame) -> str:
        return frame.to_html(index=False, na_rep="", float_format=lambda v: f"{v:,.2f}",
                             border=0)

    legend = "".join(f"<li><b>{name}</b>: {html.escape(text)}</li>"
                     for name, text in MEASURES.items())
    covers = "".join(f"<li>{html.escape(line)}</li>" for line in summary)
    images = "\n".join(f'<p><img alt="{html.escape(c.stem)}" src="{_data_uri(c)}"></p>'
                       for c in charts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Attribution report</title>
<style>{_STYLE}</style></head>
<body>
<h1>Attribution report</h1>
<ul>{covers}</ul>
<h2>Totals per model</h2>
{table(models)}
<p>Per model, campaign and UTC day of the goal:</p>
<ul>{legend}</ul>
{images}
<h2>Per model and campaign (most conversions first)</h2>
{table(totals)}
<h2>Per model, campaign and day</h2>
{table(daily)}
</body></html>
"""


def write_report(daily: pd.DataFrame, totals: pd.DataFrame, models: pd.DataFrame, out: Path,
                 summary: list[str]) -> list[Path]:
    """Write the tables (Parquet and CSV), the charts and ``report.html`` into ``out``.

    Returns the files written. Needs matplotlib.

    :param daily: the daily summary (``report_tables.daily_summary``, marked by ``mark_days``).
    :param totals: the campaign totals (``report_tables.campaign_totals``), ranked.
    :param models: the totals per model (``report_tables.model_totals``).
    :param out: the directory to write into (created).
    :param summary: lines saying what the report covers, atop the page.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in ((TOTALS, models), (DAILY, daily), (CAMPAIGNS, totals)):
        frame.to_parquet(out / f"{name}.parquet", index=False)
        frame.to_csv(out / f"{name}.csv", index=False)
        written += [out / f"{name}.parquet", out / f"{name}.csv"]
    charts = [out / CONVERSIONS_CHART, out / VALUE_CHART]
    conversions_chart(totals, charts[0])
    value_chart(daily, charts[1])
    (out / HTML_PAGE).write_text(html_page(daily, totals, charts, summary, models),
                                 encoding="utf-8")
    return written + charts + [out / HTML_PAGE]
