"""The attribution report's tables: credited conversions and value per model, campaign and day.

Input is the folded attribution table (``attribution.spark.changelog.fold_changelog``). Each
row of ``daily_summary`` is one model, one campaign and one UTC day of the goal, with the
``MEASURES`` below. Organic goals form their own line, campaign ``(organic)``: their rows carry
credit 0.0 and credited value 0.0 (spec), so that line counts them in ``organic_goals`` with zero
conversions, and their worth is ``organic_value``: the sum of their ``goal_value`` (each organic
goal has one row per model). A goal's value is either credited (its attributed rows'
``credited_value`` sum to its ``goal_value``) or organic, so per model ``credited_value`` plus
``organic_value`` is the value of all its goals.
Attributed rows whose impression has no campaign (output written without campaigns, or
impressions served without one) are grouped under ``(no campaign)``. ``mark_days`` says which
days are final under the output's completeness frontier, ``model_days`` is one line per model
and calendar day (days without goals included, their values empty), ``model_totals`` sums each
model over everything, and ``select_rows`` is the report's date and model filter.
"""
from __future__ import annotations

from datetime import date, timedelta
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
    "organic_value": f"sum of goal_value of the organic goals (on {ORGANIC}; 0 on campaign "
                     "lines; empty when no goal of the line has a value)",
}


def describe_measures() -> str:
    """``MEASURES`` as aligned text lines, one per measure."""
    width = max(map(len, MEASURES))
    return "\n".join(f"  {name:<{width}}  {text}" for name, text in MEASURES.items())


def _organic_value(table: pd.DataFrame) -> pd.Series:
    # Per row: the goal's value on an organic row, 0.0 on an attributed row (its value is
    # credited), null when the goal has no value, so that a sum with min_count=1 is empty
    # exactly where credited_value's is.
    value = table["goal_value"].astype("float64")
    return value.where(table["impression_id"].isna(), 0.0).where(value.notna())


def daily_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, campaign and UTC day of the goal: ``MEASURES`` (see the module docstring).

    ``table``: folded attribution rows with ``goal_ts`` (UTC timestamps), ``impression_id``,
    ``impression_campaign``, ``goal_event_id``, ``model``, ``credit``, ``goal_value``,
    ``credited_value``.
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
        "organic_value": _organic_value(table),
        "goal": table["goal_event_id"],
        "organic": organic,
    })
    grouped = frame.groupby(GROUP, sort=True)
    summary = pd.DataFrame({
        "conversions": grouped["credit"].sum(),
        "credited_value": grouped["credited_value"].sum(min_count=1),
        "organic_value": grouped["organic_value"].sum(min_count=1),
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
    totals["organic_value"] = grouped["organic_value"].sum(min_count=1)
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


TOTALS = ["model", "goals", "attributed_goals", "organic_goals", "conversions", "credited_value",
          "organic_value", "credited_share"]


def model_totals(table: pd.DataFrame) -> pd.DataFrame:
    """One row per model: its goals (attributed and organic), credited conversions (sum of
    credit), credited value (sum of ``credited_value``), organic value (sum of ``goal_value`` of
    its organic goals) and ``credited_share``, credited value over the value of all its goals
    (credited plus organic): how much of the goals' worth the model gives to ads. A value is
    empty when no row has one.

    Counted over the rows, not summed from ``daily_summary``: a goal crediting impressions of
    two campaigns is on two of its lines, and is one goal.

    :param table: the folded attribution rows reported on (``daily_summary``'s input).
    """
    organic = table["impression_id"].isna()
    grouped = table.assign(organic_goal=table["goal_event_id"].where(organic),
                           credit=table["credit"].astype("float64"),
                           credited_value=table["credited_value"].astype("float64"),
                           organic_value=_organic_value(table)
                           ).groupby("model", sort=True)
    totals = pd.DataFrame({
        "goals": grouped["goal_event_id"].nunique(),
        "organic_goals": grouped["organic_goal"].nunique(),
        "conversions": grouped["credit"].sum(),
        "credited_value": grouped["credited_value"].sum(min_count=1),
        "organic_value": grouped["organic_value"].sum(min_count=1),
    })
    totals["attributed_goals"] = totals["goals"] - totals["organic_goals"]
    # Empty, not a division by zero, when the goals are worth nothing (or carry no value).
    worth = totals["credited_value"] + totals["organic_value"]
    totals["credited_share"] = totals["credited_value"] / worth.where(worth != 0)
    return totals.reset_index()[TOTALS]


DAY_MEASURES = ["goals", "conversions", "credited_value", "organic_value"]


def model_days(table: pd.DataFrame, final_through_ms: Optional[int],
               published: bool) -> pd.DataFrame:
    """One row per model and UTC calendar day from the first goal's day to the last: the day's
    ``day_status`` and ``DAY_MEASURES`` (distinct goals; sums of credit, credited value and
    organic value, as in ``daily_summary`` but over all campaigns).

    A day without goals is a row too, with 0 goals and empty (NaN) sums: a chart then breaks
    its line there instead of drawing one across days when nothing happened, and a day with
    goals but no credited value still reads 0. Sorted by model and day.

    :param table: the folded attribution rows reported on (``daily_summary``'s input).
    :param final_through_ms: the frontier of the output read (None: nothing final yet).
    :param published: whether the output publishes a frontier at all.
    """
    frame = pd.DataFrame({
        "model": table["model"],
        "day": pd.to_datetime(table["goal_ts"], utc=True).dt.date,
        "goal": table["goal_event_id"],
        "credit": table["credit"].astype("float64"),
        "credited_value": table["credited_value"].astype("float64"),
        "organic_value": _organic_value(table),
    })
    grouped = frame.groupby(["model", "day"], sort=True)
    sums = pd.DataFrame({
        "goals": grouped["goal"].nunique(),
        "conversions": grouped["credit"].sum(),
        "credited_value": grouped["credited_value"].sum(min_count=1),
        "organic_value": grouped["organic_value"].sum(min_count=1),
    })
    calendar = pd.date_range(frame["day"].min(), frame["day"].max(), freq="D").date
    every_day = pd.MultiIndex.from_product([sorted(frame["model"].unique()), calendar],
                                           names=["model", "day"])
    days = sums.reindex(every_day)
    days["goals"] = days["goals"].fillna(0).astype("int64")
    days = days.reset_index()
    days.insert(2, DAY_STATUS, [day_status(d, final_through_ms, published)
                                for d in days["day"]])
    return days[["model", "day", DAY_STATUS] + DAY_MEASURES]


def last_final_day(final_through_ms: Optional[int]) -> Optional[date]:
    """The last UTC day that is final under the frontier ``final_through_ms`` (every day up to
    it is, every later day is not); None when no day is.

    :param final_through_ms: the frontier (epoch ms), None when nothing is final yet.
    """
    if final_through_ms is None:
        return None
    # The day holding the instant just after the frontier is the first one not wholly before it.
    first_open = (final_through_ms + 1) // DAY_MS
    return date(1970, 1, 1) + timedelta(days=first_open - 1)


def day_table(days: pd.DataFrame) -> pd.DataFrame:
    """``model_days`` as the report's page shows it: one row per day with goals, newest first
    (the provisional days, which are the newest, lead), its ``day_status`` and goals, then per
    model its credited and organic value; columns ``(model, measure)`` under a two-level header
    (``("", "day")``, ``("", "day_status")``, ``("", "goals")`` first).

    The goals of a day are the same under every model (each goal has rows under every model
    of the run), so they are one column, taken from the first model.

    :param days: the table ``model_days`` returned.
    """
    with_goals = days[days["goals"] > 0]
    values = with_goals.pivot(index="day", columns="model",
                              values=["credited_value", "organic_value"])
    values = values.swaplevel(axis=1)
    order = [(m, v) for m in sorted(with_goals["model"].unique())
             for v in ("credited_value", "organic_value")]
    first = with_goals[with_goals["model"] == with_goals["model"].min()].set_index("day")
    table = values[order]
    table.insert(0, ("", "goals"), first["goals"])
    table.insert(0, ("", DAY_STATUS), first[DAY_STATUS])
    table = table.sort_index(ascending=False).reset_index()
    table.columns = pd.MultiIndex.from_tuples([("", "day")] + list(table.columns[1:]))
    return table


def campaign_table(totals: pd.DataFrame) -> pd.DataFrame:
    """``campaign_totals`` side by side: one row per campaign (ranked as ``campaign_rank``),
    per model its conversions and credited value; columns ``(model, measure)`` after
    ``("", "campaign")``. The ``(organic)`` line is left out: it credits no campaign (its goals
    and value are in ``model_totals`` and ``model_days``).

    :param totals: the frame ``campaign_totals`` returned.
    """
    credited = totals[totals["campaign"] != ORGANIC]
    wide = credited.pivot(index="campaign", columns="model",
                          values=["conversions", "credited_value"]).swaplevel(axis=1)
    order = [(m, v) for m in sorted(credited["model"].unique())
             for v in ("conversions", "credited_value")]
    wide = wide[order].loc[campaign_rank(credited)].reset_index()
    wide.columns = pd.MultiIndex.from_tuples([("", "campaign")] + order)
    return wide
