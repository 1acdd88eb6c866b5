"""The attribution models of spec section 6: which candidates each credits, and with what credit.

A goal's candidates under a model are given in impression order (ascending
``(ts, impression_id, event_id)``); every model credits a non-empty subset of them and the credits
of a goal sum to 1:

* ``last_touch``: the candidate with the greatest ``ts`` (ties: the smallest ``impression_id``,
  then ``event_id``), credit 1;
* ``first_touch``: the first candidate, credit 1;
* ``linear``: every candidate, ``1 / n`` each;
* ``position_based``: every candidate; one gets 1, two get 0.5 each, and from three on the first
  and the last get 0.4 each and the ones between share 0.2 equally;
* ``time_decay``: every candidate, in proportion to ``2 ** (-(goal_ts - ts) / half_life)``.

Which candidates a model credits is decided by the caller on bit masks (``paths.ReferrerIndex``):
the all-candidate models take every one, ``last_touch`` and ``first_touch`` one. This module
gives the credits of what was chosen.
"""
from __future__ import annotations

from typing import Sequence

from .config import MODELS

# The models that credit one candidate; every other model credits them all.
SINGLE_TOUCH = ("last_touch", "first_touch")

# position_based: the share of the first and of the last of three or more candidates.
ENDS_SHARE = 0.4


def credits(model: str, ts: Sequence[int], half_life_ms: int) -> list[float]:
    """The credits of the impressions ``model`` credits for one goal.

    :param model: one of ``config.MODELS``.
    :param ts: the credited impressions' times, in impression order (one for the single-touch
        models, every candidate for the others); not empty.
    :param half_life_ms: ``time_decay``'s half-life.
    :returns: one credit per impression, summing to 1 (within rounding).
    """
    n = len(ts)
    if model in SINGLE_TOUCH or n == 1:
        return [1.0] * n
    if model == "linear":
        return [1.0 / n] * n
    if model == "position_based":
        if n == 2:
            return [0.5, 0.5]
        middle = (1.0 - 2 * ENDS_SHARE) / (n - 2)
        return [ENDS_SHARE, *([middle] * (n - 2)), ENDS_SHARE]
    if model == "time_decay":
        # 2 ** (-(goal_ts - t) / h), normalised. Every weight is multiplied here by
        # 2 ** ((goal_ts - latest) / h), which the normalisation cancels (so the goal's time is
        # not needed): the latest weighs 1 and the sum cannot underflow to zero, however old the
        # candidates.
        latest = max(ts)
        weights = [2.0 ** ((t - latest) / half_life_ms) for t in ts]
        total = sum(weights)
        return [w / total for w in weights]
    raise ValueError(f"unknown attribution model {model!r}; choose from {', '.join(MODELS)}")
