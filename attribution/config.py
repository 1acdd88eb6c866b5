"""Every default of the attribution rules and jobs, in one place.

Durations are kept both as the human string the CLIs accept and as milliseconds, which is the
unit of event time throughout the core; ``joins.durations`` parses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

# The project's one duration parser (re-exported here for the attribution options).
from joins.durations import (  # noqa: F401
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    MS_PER_SECOND,
    parse_duration_ms,
    spark_interval,
)

# The attribution models, in their fixed order (spec section 6; the table is ``models``).
from .models import MODEL_TABLE, MODELS

DEFAULT_LOOKBACK = "90 days"
DEFAULT_DEDUP_WINDOW = "1 day"
DEFAULT_WATERMARK_DELAY = "10 minutes"
DEFAULT_HALF_LIFE = "7 days"
DEFAULT_ALLOWED_LATENESS = "0"

DEFAULT_MODELS = ("last_touch",)
ALL_MODELS = "all"  # what --models takes for every model

# Strings longer than this are rejected by validation: a 1 MB url is an attack or a bug, not a page.
MAX_STRING_LENGTH = 8_192


def parse_models(value: Union[str, Iterable[str]]) -> tuple[str, ...]:
    """The models named by ``value``, in ``MODELS`` order without repeats.

    :param value: a comma-separated string (``"last_touch,linear"``, or ``"all"`` for every
        model) or an iterable of model names.
    :raises ValueError: an unknown name, or no name at all; the message names the valid ones.
    """
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
        if names == [ALL_MODELS]:
            return MODELS
    else:
        names = list(value)
    valid = f"choose from {', '.join(MODELS)} (or '{ALL_MODELS}')"
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown attribution model {unknown[0]!r}; {valid}")
    if not names:
        raise ValueError(f"no attribution model given; {valid}")
    return tuple(m for m in MODELS if m in names)


@dataclass(frozen=True)
class AttributionConfig:
    """The parameters of the attribution rules (spec sections 2, 3, 6 and 8).

    ``models`` may be given in any order and as a comma-separated string; it is kept in
    ``MODELS`` order. ``half_life_ms`` is the half-life of ``time_decay``'s weights.
    ``allowed_lateness_ms`` (L) and ``early_results`` make the output a changelog (section 8):
    records up to L behind the watermark are still used and the rows they change are revised;
    early results emit a goal's rows before the watermark reaches it, and revise them.
    """

    lookback_ms: int = parse_duration_ms(DEFAULT_LOOKBACK)
    dedup_window_ms: int = parse_duration_ms(DEFAULT_DEDUP_WINDOW)
    models: tuple[str, ...] = DEFAULT_MODELS
    half_life_ms: int = parse_duration_ms(DEFAULT_HALF_LIFE)
    allowed_lateness_ms: int = parse_duration_ms(DEFAULT_ALLOWED_LATENESS)
    early_results: bool = False

    def __post_init__(self) -> None:
        if self.lookback_ms < 0:
            raise ValueError("lookback must be non-negative")
        if self.dedup_window_ms <= 0:
            raise ValueError("dedup window must be positive")
        if isinstance(self.half_life_ms, bool) or not isinstance(self.half_life_ms, int) \
                or self.half_life_ms <= 0:
            raise ValueError(f"half-life must be a positive number of milliseconds, got "
                             f"{self.half_life_ms!r}")
        if isinstance(self.allowed_lateness_ms, bool) or not isinstance(
                self.allowed_lateness_ms, int) or self.allowed_lateness_ms < 0:
            raise ValueError(f"allowed lateness must be a non-negative number of milliseconds, "
                             f"got {self.allowed_lateness_ms!r}")
        object.__setattr__(self, "models", parse_models(self.models))

    def model_options(self) -> dict[str, object]:
        """The options the configured models read (``models.Model.options``), by field name:
        what a checkpoint must keep equal, beyond the models themselves."""
        return {option: getattr(self, option)
                for model in self.models for option in MODEL_TABLE[model].options}

    @property
    def revising(self) -> bool:
        """True when rows may be revised (section 8): allowed lateness or early results."""
        return self.allowed_lateness_ms > 0 or self.early_results

    @classmethod
    def from_strings(cls, lookback: str = DEFAULT_LOOKBACK,
                     dedup_window: str = DEFAULT_DEDUP_WINDOW,
                     models: str = ",".join(DEFAULT_MODELS),
                     half_life: str = DEFAULT_HALF_LIFE) -> "AttributionConfig":
        """A configuration from the CLI's text forms (durations, comma-separated models).

        :param lookback: how far back a goal looks for impressions, as a duration (``"7 days"``).
        :param dedup_window: the width of rule 3's impression buckets, as a duration.
        :param models: the attribution models to run, comma-separated names from ``MODELS``.
        :param half_life: the half-life of ``time_decay``'s weights, as a duration.
        """
        return cls(lookback_ms=parse_duration_ms(lookback, "lookback"),
                   dedup_window_ms=parse_duration_ms(dedup_window, "dedup window"),
                   models=parse_models(models),
                   half_life_ms=parse_duration_ms(half_life, "half-life"))
