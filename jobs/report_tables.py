"""The attribution report's tables: credited conversions and value per model, campaign and day.

Input is the folded attribution table (``attribution.spark.changelog.fold_changelog``). Each
row of ``daily_summary`` is one model, one campaign and one UTC day of the goal, with the
``MEASURES`` below. Organic goals form their own line, campaign ``(organic)``: their rows carry
credit 0.0 (spec), so that line counts them in ``organic_goals`` with zero conversions.
Attributed rows whose impression has no campaign (output written without campaigns, or
impressions served without one) are grouped under ``(no campaign)``.
"""
from __future__ import annotations

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
