"""The batch oracle: the spec applied to a whole event set, i.e. the watermark at +infinity.

This is ground truth for the generators, the tests and the benchmarks. It runs the same core as
the streaming backends, one ``UserAttribution`` per user, fed everything and fired once.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Optional, Sequence, Union

from .config import MODELS, AttributionConfig
from .core import WATERMARK_INFINITY, Attribution, UserAttribution
from .events import Event, parse_event


def attribute_batch(events: Iterable[Union[Event, Mapping]],
                    config: AttributionConfig = AttributionConfig(),
                    multi_candidate: Optional[dict[str, int]] = None) -> list[Attribution]:
    """Attribute every goal in ``events`` (``Event``s or raw records) and return the rows.

    The order of the records does not matter: of the copies of one record (one user and
    ``event_id``) the smallest in rule 1's order counts (``core.copy_order``). Heartbeats are
    ignored. Rows come sorted by ``sort_key``: per goal, the models in
    ``config.MODELS`` order, and each model's rows in impression order.
    Raises ``InvalidEvent`` on a record that breaks the schema.

    :param events: the records.
    :param config: the rules' parameters and the models to compute.
    :param multi_candidate: if given, raised per model by the number of goals with two or more
        candidates under that model (rule 4 with the model's own consumption): the goals whose
        credit a model that credits every candidate splits (``UserAttribution.fire``).
    """
    by_user: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if not isinstance(e, Event):
            e = parse_event(e)
        if e.event_type != "heartbeat":
            by_user[e.user_id].append(e)
    return attribute_users(((u, by_user[u]) for u in sorted(by_user)), config, multi_candidate)


def attribute_users(users: Iterable[tuple[str, Sequence[Event]]],
                    config: AttributionConfig = AttributionConfig(),
                    multi_candidate: Optional[dict[str, int]] = None) -> list[Attribution]:
    """``attribute_batch``'s rows for events already grouped by user: what it does after the
    grouping, for a caller that can group faster (the generator's truth).

    :param users: ``(user_id, events)`` pairs in ascending ``user_id`` order, each user once,
        with the user's visits and impressions (no heartbeat) in arrival order.
    :param config: as for ``attribute_batch``.
    :param multi_candidate: as for ``attribute_batch``.
    """
    rows: list[Attribution] = []
    # Users in order, and a firing gives its rows in goal, model and impression order: the rows
    # are in ``sort_key`` order as they come (tests check it), with no sort of every row.
    for user_id, events in users:
        state = UserAttribution(user_id, config)
        state.add(events)
        rows.extend(state.fire(WATERMARK_INFINITY, multi_candidate=multi_candidate))
    return rows


_MODEL_RANK = {m: k for k, m in enumerate(MODELS)}


def sort_key(row: Attribution) -> tuple:
    """The canonical order of output rows, for comparing one path's output with another's:
    user, goal order, model order, then impression order (``(ts, impression_id, event_id)``;
    the one organic row of a goal and model has none).

    :param row: one output row.
    """
    return (row.user_id, row.goal_ts, row.goal_event_id, _MODEL_RANK[row.model],
            row.impression_ts or 0, row.impression_id or 0, row.impression_event_id or "")
