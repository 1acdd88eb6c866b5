"""Writing the attribution report: its tables as Parquet and CSV, two PNG charts, one HTML page.

The charts are drawn with matplotlib's Agg canvas (no display needed). The HTML page embeds
them as base64 data URIs, so ``report.html`` is one self-contained file that works offline.
The page is laid out for a window about 1400 px wide: the charts are drawn ``CHART_WIDTH``
inches wide at ``DPI``, so that they are shown at their own size there, not scaled down.
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from jobs.report_tables import (
    DAY_STATUS,
    MEASURES,
    ORGANIC,
    PROVISIONAL,
    UNKNOWN,
    campaign_rank,
    campaign_table,
    day_table,
)

TOTALS = "totals"            # totals.parquet, totals.csv
DAILY = "daily"              # daily.parquet, daily.csv
CAMPAIGNS = "campaigns"      # campaigns.parquet, campaigns.csv
CONVERSIONS_CHART = "conversions_by_campaign.png"
VALUE_CHART = "daily_credited_value.png"
HTML_PAGE = "report.html"
MAX_CHART_CAMPAIGNS = 20     # beyond this the bar chart keeps the campaigns with most conversions
DPI = 100
CHART_WIDTH = 13.0           # inches: 1300 px, the page's width at 1400 px less its margins
# The daily chart's two series per model: what the model credits to ads, and what it does not.
CREDITED_STYLE = {"color": "#1f5fa8", "label": "credited value (paid: credited to impressions)"}
ORGANIC_STYLE = {"color": "#8c8c8c", "label": "organic value (goals no impression is credited for)"}
PROVISIONAL_COLOR = "#f4b942"
# The value axis is cut below a spike, a day worth more than SPIKE_RATIO times the next lower
# day, among the top SPIKE_SHARE of the values: one such day would otherwise set the scale and
# flatten every other. The axis then ends CUT_MARGIN above the highest day below the spike.
SPIKE_RATIO = 2.0
SPIKE_SHARE = 0.05
CUT_MARGIN = 1.15


def _figure(width: float = CHART_WIDTH, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _say_empty(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _of_models(models: list[str], several: str) -> str:
    # A title's end: the one model by name, or what several models make of it, so that a
    # one-model report does not speak of models it does not have.
    return f": {models[0]}" if len(models) == 1 else several


def conversions_chart(totals: pd.DataFrame, path: Path):
    """Credited conversions per campaign as a PNG at ``path``: one bar per model with several
    models (a legend names them), one bar per campaign with one model (named in the title).

    ``totals``: ``report_tables.campaign_totals``. The ``(organic)`` line is left out: organic
    goals credit no campaign. Campaigns are ranked, most conversions (over all models) first.
    Returns the matplotlib figure drawn (what a test reads the title and bars from).

    :param totals: the campaign totals (``report_tables.campaign_totals``).
    :param path: the PNG file to write.
    """
    models = sorted(totals["model"].unique())
    credited = totals[totals["campaign"] != ORGANIC]
    by_campaign = credited.pivot_table(index="campaign", columns="model", values="conversions",
                                       aggfunc="sum", fill_value=0.0)
    title = "Credited conversions per campaign" + _of_models(models, ", one bar per model")
    by_campaign = by_campaign.loc[campaign_rank(credited)]
    if len(by_campaign) > MAX_CHART_CAMPAIGNS:
        by_campaign = by_campaign.iloc[:MAX_CHART_CAMPAIGNS]
        title += f" (the {MAX_CHART_CAMPAIGNS} campaigns with most conversions)"
    figure = _figure(height=5.0)
    axes = figure.subplots()
    figure.suptitle(title)
    if by_campaign.empty:
        _say_empty(axes, "no attributed goals")
    else:
        width = 0.8 / by_campaign.shape[1]
        for n, model in enumerate(by_campaign.columns):
            positions = [x + (n - (by_campaign.shape[1] - 1) / 2) * width
                         for x in range(len(by_campaign))]
            axes.bar(positions, by_campaign[model], width, label=model)
        axes.set_xticks(range(len(by_campaign)), by_campaign.index, rotation=30, ha="right")
        axes.set_xlim(-0.6, len(by_campaign) - 0.4)
        axes.set_ylabel("conversions (sum of credit)")
        axes.grid(axis="y", color="0.9")
        axes.set_axisbelow(True)
        if by_campaign.shape[1] > 1:
            # Right of the plot: it hides no bar, and stays clear of the title (above the plot
            # it would sit level with it) and of the long campaign names below.
            figure.legend(title="model", loc="outside right upper")
    figure.savefig(path, dpi=DPI)
    return figure


def value_cut(values: pd.Series) -> Optional[float]:
    """Where the daily chart's value axis is cut, or None when no value is a spike.

    A spike is a value among the highest ``SPIKE_SHARE`` of the distinct values that is more
    than ``SPIKE_RATIO`` times the next lower one; the lowest spike and all above it are cut,
    at ``CUT_MARGIN`` times the value below it. A rule on jumps, not a quantile: a quantile
    also cuts ordinary busy days, and on a short report it would sit on the spike itself.

    :param values: the daily values drawn (NaN for days without goals, left out).
    """
    distinct = sorted(set(values.dropna().astype(float)))
    top = max(1, math.ceil(SPIKE_SHARE * len(distinct)))
    for position in range(max(1, len(distinct) - top), len(distinct)):
        below = distinct[position - 1]
        if below > 0 and distinct[position] > SPIKE_RATIO * below:
            return CUT_MARGIN * below
    return None


def value_chart(days: pd.DataFrame, path: Path):
    """Daily credited and organic value as a PNG at ``path``: one panel per model, the panels
    sharing their day and value axes, so that the models compare panel to panel.

    ``days``: ``report_tables.model_days``. A day without goals has no value: the lines break
    there rather than join the days around it. Small markers, so that a lone day between two
    such gaps still shows. When one day's value would flatten the others the value axis is cut
    (``value_cut``): days above the cut are drawn as triangles at the top, labelled with their
    value, and the chart says so. Provisional days are shaded in every panel; with a
    frontier-less output the chart says that day status is unknown. Returns the matplotlib
    figure drawn (what a test reads the lines, shading and notes from).

    :param days: the daily values per model (``report_tables.model_days``).
    :param path: the PNG file to write.
    """
    models = sorted(days["model"].unique())
    panel = 1.75 if len(models) > 1 else 3.4  # inches per panel: five fit a 1400 px screen
    figure = _figure(height=1.2 + panel * len(models))
    figure.suptitle("Daily credited and organic value"
                    + _of_models(models, " per model") + " (UTC day of the goal)")
    values = days[["credited_value", "organic_value"]].stack()
    if values.dropna().empty:
        _say_empty(figure.subplots(), "no conversion values in this output\n"
                   "(goals carry no value)")
        figure.savefig(path, dpi=DPI)
        return figure
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    cut = value_cut(values)
    axes = figure.subplots(len(models), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    # Each day's point in the middle of its day, inside its shading.
    x = pd.to_datetime(days["day"]) + pd.Timedelta(hours=12)
    span_days = (x.max() - x.min()).days
    marker = 2.5 if span_days > 60 else 4.0
    provisional = days.loc[days[DAY_STATUS] == PROVISIONAL, "day"]
    start = pd.Timestamp(days["day"].min())
    end = pd.Timestamp(days["day"].max()) + pd.Timedelta(days=1)
    for ax, model in zip(axes, models):
        mine = days["model"] == model
        # Organic first, so that the credited line, the one the models differ in, is on top;
        # a cut day's label goes right of its triangle for credited value, left for organic,
        # so that both labels of one day stay apart.
        for column, style, side in (("organic_value", ORGANIC_STYLE, -1),
                                    ("credited_value", CREDITED_STYLE, 1)):
            y = days.loc[mine, column]
            ax.plot(x[mine], y if cut is None else y.clip(upper=cut), linewidth=1.0,
                    marker="o", markersize=marker, **style)
            if cut is not None:
                above = mine & (days[column] > cut)
                ax.plot(x[above], [cut] * int(above.sum()), linestyle="none", marker="^",
                        markersize=6, color=style["color"])
                for when, value in zip(x[above], days.loc[above, column]):
                    ax.annotate(f"{value:,.0f}", (when, cut), xytext=(5 * side, -1),
                                textcoords="offset points", va="top", fontsize=8,
                                ha="left" if side > 0 else "right", color=style["color"])
        if not provisional.empty:
            # Status only grows towards the end (a day after a provisional one is provisional
            # too), so the provisional days are one span: from the first to the last day.
            first_open = pd.Timestamp(provisional.min())
            ax.axvspan(first_open, end, color=PROVISIONAL_COLOR, alpha=0.45, linewidth=0,
                       zorder=0, label="provisional days (may still change)")
            # An edge, so that a short provisional tail over a long range still shows.
            ax.axvline(first_open, color=PROVISIONAL_COLOR, linewidth=1.5, zorder=0)
        ax.set_title(model, loc="left", fontsize=10, fontweight="bold")
        ax.set_ylabel("value")
        ax.grid(axis="y", color="0.9")
        ax.set_axisbelow(True)
    low = min(0.0, float(values.min()))
    axes[0].set_ylim(low, None if cut is None else cut * 1.12)
    axes[0].set_xlim(start, end)
    notes = ["a break in a line: no goals that day"]
    if cut is not None:
        notes.append(f"axis cut at {cut:,.0f}: days above it (spikes, over {SPIKE_RATIO:g} times "
                     "the next lower day) are drawn as ▲ with their value")
    if (days[DAY_STATUS] == UNKNOWN).all():
        notes.append("day status unknown: this output publishes no frontier")
    axes[0].set_title("; ".join(notes), loc="right", fontsize=8, color="0.3")
    locator = AutoDateLocator(maxticks=16)
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(ConciseDateFormatter(locator))
    handles, labels = axes[0].get_legend_handles_labels()
    # Below the panels: above them it would sit level with the figure's title.
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=9)
    figure.savefig(path, dpi=DPI)
    return figure


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


_STYLE = """
body { font-family: sans-serif; margin: 1.5em 2em; color: #222; max-width: 1320px; }
h1 { font-size: 1.6em; margin-bottom: 0.3em; }
h2 { font-size: 1.25em; margin: 1.4em 0 0.5em; }
table { border-collapse: collapse; margin-bottom: 1em; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; }
th[colspan] { text-align: center; }
td.text, th.text { text-align: left; }
tr.provisional td { background: #fdf0d2; }
tr.provisional td:nth-child(2) { font-weight: bold; }
.finality { border-left: 4px solid #f4b942; padding: 0.3em 0.9em; background: #fffaf0; }
.finality p { margin: 0.35em 0; }
.covers { margin: 0.3em 0; padding-left: 1.2em; font-size: 0.92em; }
.note { font-size: 0.9em; color: #444; }
img { max-width: 100%; }
details { margin-bottom: 1.5em; }
"""

# How the page writes each kind of column: counts as integers, sums of money and credit with two
# decimals, the share as a percentage; a missing value is an empty cell.
_FORMATS: dict[str, Callable[[float], str]] = {
    "goals": lambda v: f"{v:,.0f}",
    "attributed_goals": lambda v: f"{v:,.0f}",
    "organic_goals": lambda v: f"{v:,.0f}",
    "credited_share": lambda v: f"{v:.1%}",
}
_HEADINGS = {"credited_value": "credited value", "organic_value": "organic value",
             "credited_share": "credited share", "attributed_goals": "attributed goals",
             "organic_goals": "organic goals", "day_status": "status"}
_TEXT = {"model", "campaign", "day", DAY_STATUS}


def _cell(name: str, value) -> str:
    if isinstance(value, str) or name in _TEXT:
        return f'<td class="text">{html.escape(str(value))}</td>'
    if pd.isna(value):
        return "<td></td>"
    return f"<td>{_FORMATS.get(name, lambda v: f'{v:,.2f}')(value)}</td>"


def html_table(frame: pd.DataFrame, name: str, row_class: Optional[pd.Series] = None) -> str:
    """``frame`` as an HTML table: numbers formatted by kind, text left-aligned, a two-level
    header when the columns are ``(group, measure)`` pairs (a group spans its measures).

    :param frame: the table; flat or two-level columns.
    :param name: the table's ``id`` (what a link or a test finds it by).
    :param row_class: a CSS class per row (its index as ``frame``'s), or None.
    """
    two_level = isinstance(frame.columns, pd.MultiIndex)
    names = [c[1] if two_level else c for c in frame.columns]
    head = ""
    if two_level:
        groups: list[list] = []
        for group, _ in frame.columns:
            if groups and groups[-1][0] == group:
                groups[-1][1] += 1
            else:
                groups.append([group, 1])
        head = "<tr>" + "".join(f'<th colspan="{n}">{html.escape(g)}</th>'
                                for g, n in groups) + "</tr>"
    head += "<tr>" + "".join(
        f'<th{" class=text" if n in _TEXT else ""}>{html.escape(_HEADINGS.get(n, n))}</th>'
        for n in names) + "</tr>"
    rows = []
    for position, record in enumerate(frame.itertuples(index=False)):
        css = "" if row_class is None else f' class="{row_class.iloc[position]}"'
        rows.append(f"<tr{css}>" + "".join(_cell(n, v) for n, v in zip(names, record))
                    + "</tr>")
    return (f'<table id="{name}"><thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def html_page(daily: pd.DataFrame, totals: pd.DataFrame, charts: list[Path],
              covers: list[str], models: pd.DataFrame, days: pd.DataFrame,
              finality: list[str]) -> str:
    """The report as one HTML document: what it covers, which days are final, the totals per
    model (once), the charts inlined, then the tables per day and per campaign, and the table
    per model, campaign and day folded away (it is long; daily.csv holds it too).

    :param daily: the daily summary (``report_tables.daily_summary``, marked).
    :param totals: the campaign totals (``report_tables.campaign_totals``).
    :param charts: the chart PNG files to inline.
    :param covers: lines saying what the report covers, shown first.
    :param models: the totals per model (``report_tables.model_totals``).
    :param days: the values per model and day (``report_tables.model_days``).
    :param finality: sentences saying which days are final and why, shown in a box.
    """
    names = sorted(models["model"])
    title = "Attribution report" + _of_models(names, f": {len(names)} models")
    legend = "".join(f"<li><b>{name}</b>: {html.escape(text)}</li>"
                     for name, text in MEASURES.items())
    covered = "".join(f"<li>{html.escape(line)}</li>" for line in covers)
    final = "".join(f"<p>{html.escape(line)}</p>" for line in finality)
    images = "\n".join(f'<p><img alt="{html.escape(c.stem)}" src="{_data_uri(c)}"></p>'
                       for c in charts)
    per_day = day_table(days)
    status = per_day[("", DAY_STATUS)]
    provisional = int((status == PROVISIONAL).sum())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<ul class="covers">{covered}</ul>
<h2>Which days are final</h2>
<div class="finality">{final}</div>
<h2>Totals{" per model" if len(names) > 1 else ""}</h2>
{html_table(models, "totals")}
<p class="note">Credited value is the goals' value the model credits to impressions (paid);
organic value is the value of the goals no impression is credited for; together they are the
value of all goals, and the credited share is the paid part of it.</p>
{images}
<h2>Per day (newest first; {provisional} provisional, shaded)</h2>
<p class="note">Days with goals, UTC day of the goal; each day's status as above. Days without
goals are left out (the chart breaks its lines there).</p>
{html_table(per_day, "days", status.where(status == PROVISIONAL, "").reset_index(drop=True))}
<h2>Per campaign (most conversions first)</h2>
<p class="note">Organic goals credit no campaign: their goals and value are in the totals and
per day.</p>
{html_table(campaign_table(totals), "campaigns")}
<details><summary>Per model, campaign and day ({len(daily)} lines; also daily.csv)</summary>
<p class="note">Per model, campaign and UTC day of the goal:</p>
<ul class="note">{legend}</ul>
{html_table(daily, "daily", daily[DAY_STATUS].where(daily[DAY_STATUS] == PROVISIONAL, ""))}
</details>
</body></html>
"""


def write_report(daily: pd.DataFrame, totals: pd.DataFrame, models: pd.DataFrame, out: Path,
                 covers: list[str], days: pd.DataFrame, finality: list[str]) -> list[Path]:
    """Write the tables (Parquet and CSV), the charts and ``report.html`` into ``out``.

    Returns the files written. Needs matplotlib.

    :param daily: the daily summary (``report_tables.daily_summary``, marked by ``mark_days``).
    :param totals: the campaign totals (``report_tables.campaign_totals``), ranked.
    :param models: the totals per model (``report_tables.model_totals``).
    :param out: the directory to write into (created).
    :param covers: lines saying what the report covers, atop the page.
    :param days: the values per model and day (``report_tables.model_days``), for the daily
        chart and the page's table per day.
    :param finality: sentences saying which days are final and why, for the page.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in ((TOTALS, models), (DAILY, daily), (CAMPAIGNS, totals)):
        frame.to_parquet(out / f"{name}.parquet", index=False)
        frame.to_csv(out / f"{name}.csv", index=False)
        written += [out / f"{name}.parquet", out / f"{name}.csv"]
    charts = [out / VALUE_CHART, out / CONVERSIONS_CHART]
    value_chart(days, charts[0])
    conversions_chart(totals, charts[1])
    (out / HTML_PAGE).write_text(
        html_page(daily, totals, charts, covers, models, days, finality), encoding="utf-8")
    # Listed in the order of the report's help and docs, the page's order aside.
    return written + [out / CONVERSIONS_CHART, out / VALUE_CHART, out / HTML_PAGE]
