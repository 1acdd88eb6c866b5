"""The batch oracle: the spec applied to a whole event set, i.e. the watermark at +infinity.

This is ground truth for the generators, the tests and the benchmarks. It runs the same core as
the streaming backends, one ``UserAttribution`` per user, fed everything and fired once.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Union

from .config import MODELS, AttributionConfig
from .core import WATERMARK_INFINITY, Attribution, UserAttribution
from .events import Event, parse_event


def attribute_batch(events: Iterable[Union[Event, Mapping]],
                    config: AttributionConfig = AttributionConfig()) -> list[Attribution]:
    """Attribute every goal in ``events`` (``Event``s or raw records) and return the rows.

    Records are taken in the order given, so for redelivered copies the first one counts.
    Heartbeats are ignored. Rows come sorted by ``sort_key``: per goal, the models in
    ``config.MODELS`` order, and each model's rows in impression order.
    Raises ``InvalidEvent`` on a record that breaks the schema.
    """
    by_user: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if not isinstance(e, Event):
            e = parse_event(e)
        if e.event_type != "heartbeat":
            by_user[e.user_id].append(e)
    rows: list[Attribution] = []
    for user_id in sorted(by_user):
        state = UserAttribution(user_id, config)
        state.add(by_user[user_id])
        rows.extend(state.fire(WATERMARK_INFINITY))
    rows.sort(key=sort_key)
    return rows


_MODEL_RANK = {m: k for k, m in enumerate(MODELS)}


def sort_key(row: Attribution) -> tuple:
    """The canonical order of output rows, for comparing one path's output with another's:
    user, goal order, model order, then impression order (``(ts, impression_id, event_id)``;
    the one organic row of a goal and model has none)."""
    return (row.user_id, row.goal_ts, row.goal_event_id, _MODEL_RANK[row.model],
            row.impression_ts or 0, row.impression_id or 0, row.impression_event_id or "")
