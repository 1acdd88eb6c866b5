"""The attribution models of spec section 6, in one table: per model, which of a goal's
candidates it credits and with what credit.

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

A model is an entry of ``MODEL_TABLE``: its name, a choice (which candidates it takes, decided
on the candidate bit mask of ``paths.ReferrerIndex``), a credit rule, and the options it reads
from ``AttributionConfig``. The state machine, the command lines, the output and the checkpoint
pinning all go by the table; nothing else names a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .paths import ReferrerIndex

# -- choices: which of the available candidates a model credits --------------------------------
# ``available`` is a non-empty bit mask over ``ReferrerIndex.ordered`` (impression order): the
# goal's candidates that the model has not consumed (rule 4 with the model's own consumption).


def choose_last(index: ReferrerIndex, available: int) -> int:
    """Rule 5's choice: the one candidate with the greatest ``ts`` (``ReferrerIndex.last_of``).

    :param index: the firing's index, whose impression order the mask is over.
    :param available: the candidates to choose from, as a non-empty mask.
    """
    return index.last_of(available)


def choose_first(index: ReferrerIndex, available: int) -> int:
    """The first candidate in impression order (the mask's lowest bit).

    :param index: the firing's index (unused: the lowest bit is the first).
    :param available: the candidates to choose from, as a non-empty mask.
    """
    return available & -available


def choose_all(index: ReferrerIndex, available: int) -> int:
    """Every candidate.

    :param index: the firing's index (unused).
    :param available: the candidates to choose from, as a non-empty mask.
    """
    return available


# -- credit rules: the credits of the chosen candidates -------------------------------------------
# Each takes the chosen candidates' times, in impression order (not empty), then the values of
# the model's options in their order, and returns one credit per candidate, summing to 1
# (within rounding).

# position_based: the share of the first and of the last of three or more candidates.
ENDS_SHARE = 0.4


def full_credit(ts: Sequence[int]) -> list[float]:
    """Credit 1 for each chosen candidate (the single-touch models choose one).

    :param ts: the chosen candidates' times.
    """
    return [1.0] * len(ts)


def linear_credits(ts: Sequence[int]) -> list[float]:
    """``1 / n`` for each of the ``n`` candidates.

    :param ts: the candidates' times, in impression order.
    """
    n = len(ts)
    return [1.0 / n] * n


def position_based_credits(ts: Sequence[int]) -> list[float]:
    """1 for one candidate, 0.5 each for two; from three on ``ENDS_SHARE`` for the first and the
    last and the rest shared equally by the ones between.

    :param ts: the candidates' times, in impression order.
    """
    n = len(ts)
    if n <= 2:
        return [1.0 / n] * n
    middle = (1.0 - 2 * ENDS_SHARE) / (n - 2)
    return [ENDS_SHARE, *([middle] * (n - 2)), ENDS_SHARE]


def time_decay_credits(ts: Sequence[int], half_life_ms: int) -> list[float]:
    """Credits in proportion to ``2 ** (-(goal_ts - ts) / half_life_ms)``.

    Every weight is multiplied here by ``2 ** ((goal_ts - latest) / half_life_ms)``, which the
    normalisation cancels (so the goal's time is not needed): the latest weighs 1 and the sum
    cannot underflow to zero, however old the candidates.

    :param ts: the candidates' times, in impression order.
    :param half_life_ms: the half-life of the weights (``AttributionConfig.half_life_ms``).
    """
    if len(ts) == 1:
        return [1.0]
    latest = max(ts)
    weights = [2.0 ** ((t - latest) / half_life_ms) for t in ts]
    total = sum(weights)
    return [w / total for w in weights]


@dataclass(frozen=True)
class Model:
    """One attribution model (spec section 6).

    :param name: what ``--models`` and the output's ``model`` column call it.
    :param choose: which of the available candidates it credits: ``choose_last``,
        ``choose_first``, ``choose_all`` or a function of the same shape.
    :param credits: the credits of the chosen candidates, given their times and then the values
        of ``options``.
    :param options: the ``AttributionConfig`` fields the model reads, passed to ``credits`` in
        this order. A checkpoint pins them when the model is configured
        (``AttributionConfig.model_options``).
    """

    name: str
    choose: Callable[[ReferrerIndex, int], int]
    credits: Callable[..., list[float]]
    options: tuple[str, ...] = ()


# Every model, in their fixed order. The order is fixed for good: it is the order of a goal's
# rows, and a model's position is its bit in the consumption marks of stored state
# (``paths.Impression.consumed``), so a new model may only be appended.
MODEL_TABLE: dict[str, Model] = {m.name: m for m in (
    Model("last_touch", choose_last, full_credit),
    Model("first_touch", choose_first, full_credit),
    Model("linear", choose_all, linear_credits),
    Model("position_based", choose_all, position_based_credits),
    Model("time_decay", choose_all, time_decay_credits, options=("half_life_ms",)),
)}
MODELS: tuple[str, ...] = tuple(MODEL_TABLE)


def model_bit(model: str) -> int:
    """The bit of ``model`` in a consumption mark.

    :param model: one of ``MODELS``.
    """
    return 1 << MODELS.index(model)


# last_touch's bit: what the consumed mark of state from before other models existed stands for.
LAST_TOUCH = model_bit("last_touch")
# Every model's bit, looked up once per firing.
MODEL_BITS = {m: model_bit(m) for m in MODELS}
