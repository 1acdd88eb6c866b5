"""The attribution report's tables: credited conversions and value per model, campaign and day.

Input is the folded attribution table (``attribution.spark.changelog.fold_changelog``). Each
row of ``daily_summary`` is one model, one campaign and one UTC day of the goal, with the
``MEASURES`` below. Organic goals form their own line, campaign ``(organic)``: their rows carry
credit 0.0 (spec), so that line counts them in ``organic_goals`` with zero conversions.
Attributed rows whose impression has no campaign (output written without campaigns, or
impressions served without one) are grouped under ``(no campaign)``. ``mark_days`` says which
days are final under the output's completeness frontier, ``model_totals`` sums each model over
everything, and ``select_rows`` is the report's date and model filter.
"""
from __future__ import annotations

from datetime import date
from typing import Optional, Sequence

import pandas as pd

ORGANIC = "(organic)"
NO_CAMPAIGN = "(no campaign)"
GROUP = ["model", "campaign", "day"]
# Each measure and what it means, as the report's help and page explain it.
MEASURES = {
    "conversions": "sum of credit (an attributed goal's credits sum to 1 per model)",
    "credited_value": "sum of credited_value (empty when no goal of the line has a value)",
    "attributed_goals": "goals crediting the campaign",
    "organic_goals": f"goals no impression led to, on their own campaign line {ORGANIC}",
}


def describe_measures() -> str:
    """``MEASURES`` as aligned text lines, one per measure."""
    width = max(map(len, MEASURES))
    return "\n".join(f"  {name:<{width}}  {text}" for name, text in MEASURES.items())


def daily_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, campaign and UTC day of the goal: ``MEASURES`` (see the module docstring).

    ``table``: folded attribution rows with ``goal_ts`` (UTC timestamps), ``impression_id``,
    ``impression_campaign``, ``goal_event_id``, ``model``, ``credit``, ``credited_value``.
    Rows are sorted by model, day and campaign.

    :param table: the folded attribution rows (columns above).
    """
    organic = table["impression_id"].isna()
    campaign = table["impression_campaign"].astype("object")
    campaign = campaign.where(campaign.notna(), NO_CAMPAIGN).where(~organic, ORGANIC)
    frame = pd.DataFrame({
        "model": table["model"],
        "campaign": campaign,
        "day": pd.to_datetime(table["goal_ts"], utc=True).dt.date,
        "credit": table["credit"].astype("float64"),
        "credited_value": table["credited_value"].astype("float64"),
        "goal": table["goal_event_id"],
        "organic": organic,
    })
    grouped = frame.groupby(GROUP, sort=True)
    summary = pd.DataFrame({
        "conversions": grouped["credit"].sum(),
        "credited_value": grouped["credited_value"].sum(min_count=1),
        "goals": grouped["goal"].nunique(),
        "organic": grouped["organic"].any(),
    })
    # A group is all organic or all attributed: its campaign says which.
    summary["attributed_goals"] = summary["goals"].where(~summary["organic"], 0)
    summary["organic_goals"] = summary["goals"].where(summary["organic"], 0)
    return summary[list(MEASURES)].reset_index()


def campaign_totals(daily: pd.DataFrame) -> pd.DataFrame:
    """``daily_summary`` summed over days: one row per model and campaign.

    Goal counts add up across days because every goal has exactly one day.

    :param daily: the frame ``daily_summary`` returned.
    """
    grouped = daily.groupby(["model", "campaign"], sort=True)
    totals = grouped[["conversions", "attributed_goals", "organic_goals"]].sum()
    totals["credited_value"] = grouped["credited_value"].sum(min_count=1)
    return totals[list(MEASURES)].reset_index()


# What a day's numbers are worth, from the completeness frontier of the output read.
FINAL = "final"              # every goal of the day is at or before final_through: fixed
PROVISIONAL = "provisional"  # late records may still revise the day's goals
UNKNOWN = "unknown"          # the output publishes no frontier (Parquet output)
DAY_STATUS = "day_status"
DAY_MS = 86_400_000


def day_status(day: date, final_through_ms: Optional[int], published: bool) -> str:
    """``FINAL`` when every instant of the UTC ``day`` is at or before ``final_through_ms``,
    ``PROVISIONAL`` when not, ``UNKNOWN`` when the output publishes no frontier.

    :param day: a UTC date of goals.
    :param final_through_ms: the frontier (epoch ms), None when nothing is final yet.
    :param published: whether the output publishes a frontier at all.
    """
    if not published:
        return UNKNOWN
    if final_through_ms is None:
        return PROVISIONAL
    last_ms = (day - date(1970, 1, 1)).days * DAY_MS + DAY_MS - 1  # the day's last millisecond
    return FINAL if last_ms <= final_through_ms else PROVISIONAL


def mark_days(daily: pd.DataFrame, final_through_ms: Optional[int],
              published: bool) -> pd.DataFrame:
    """``daily`` with a ``day_status`` column after ``day`` (see ``day_status``).

    :param daily: the frame ``daily_summary`` returned.
    :param final_through_ms: the frontier of the output read (None: nothing final yet).
    :param published: whether the output publishes a frontier at all.
    """
    marked = daily.copy()
    status = [day_status(d, final_through_ms, published) for d in marked["day"]]
    marked.insert(marked.columns.get_loc("day") + 1, DAY_STATUS, status)
    return marked


def select_rows(table: pd.DataFrame, first_day: Optional[date], last_day: Optional[date],
                models: Optional[Sequence[str]]) -> pd.DataFrame:
    """The rows of goals dated ``first_day`` to ``last_day`` (UTC, both included; None: no
    bound) under ``models`` (None: all).

    :param table: attribution rows with ``goal_ts`` and ``model``.
    :param first_day: the first goal date kept, or None.
    :param last_day: the last goal date kept, or None.
    :param models: the models kept, or None for every model.
    """
    days = pd.to_datetime(table["goal_ts"], utc=True).dt.date
    keep = pd.Series(True, index=table.index)
    if first_day is not None:
        keep &= days >= first_day
    if last_day is not None:
        keep &= days <= last_day
    if models is not None:
        keep &= table["model"].isin(list(models))
    return table[keep].reset_index(drop=True)


def ranked_campaigns(totals: pd.DataFrame) -> pd.DataFrame:
    """``campaign_totals`` ranked: per model, the campaigns with most conversions first (then
    the highest credited value, then the name, so that ties have one order).

    :param totals: the frame ``campaign_totals`` returned.
    """
    return totals.sort_values(["model", "conversions", "credited_value", "campaign"],
                              ascending=[True, False, False, True],
                              na_position="last").reset_index(drop=True)


def campaign_rank(totals: pd.DataFrame) -> list[str]:
    """The campaigns of ``totals`` ranked by their conversions summed over every model, most
    first; ties by name, so that the order is the same on every run.

    :param totals: the frame ``campaign_totals`` returned (or rows of it).
    """
    summed = totals.groupby("campaign")["conversions"].sum().reset_index()
    return list(summed.sort_values(["conversions", "campaign"], ascending=[False, True])
                ["campaign"])


TOTALS = ["model", "goals", "attributed_goals", "organic_goals", "conversions", "credited_value"]


def model_totals(table: pd.DataFrame) -> pd.DataFrame:
    """One row per model: its goals (attributed and organic), credited conversions (sum of
    credit) and credited value (sum of ``credited_value``; empty when no row has one).

    Counted over the rows, not summed from ``daily_summary``: a goal crediting impressions of
    two campaigns is on two of its lines, and is one goal.

    :param table: the folded attribution rows reported on (``daily_summary``'s input).
    """
    organic = table["impression_id"].isna()
    grouped = table.assign(organic_goal=table["goal_event_id"].where(organic),
                           credit=table["credit"].astype("float64"),
                           credited_value=table["credited_value"].astype("float64")
                           ).groupby("model", sort=True)
    totals = pd.DataFrame({
        "goals": grouped["goal_event_id"].nunique(),
        "organic_goals": grouped["organic_goal"].nunique(),
        "conversions": grouped["credit"].sum(),
        "credited_value": grouped["credited_value"].sum(min_count=1),
    })
    totals["attributed_goals"] = totals["goals"] - totals["organic_goals"]
    return totals.reset_index()[TOTALS]
