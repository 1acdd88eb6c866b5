"""The output row of attribution (spec sections 4, 6-8): ``Attribution``, the one row type that
the state machine (``core``), the changelog (``revisions``), the state codec and every backend
pass around.

A leaf module: it imports only the output schema, so every other module of the core can import
it without a cycle.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from .schema import OUTPUT_DEFAULTS


class Attribution(NamedTuple):
    """One output row (spec sections 4, 6-8): a goal, a model and the impression it credits
    (none for an organic row). Timestamps are epoch milliseconds. The fields with a default are
    the output schema's optional columns, with its defaults.

    A named tuple with the output schema's fields in its order (``schema.OUTPUT_FIELDS``): a
    firing creates one per goal, model and credited impression, and a tuple is built several
    times faster than a frozen dataclass.
    """

    user_id: str
    goal_event_id: str
    goal_url: str
    goal_ts: int
    impression_id: Optional[int]
    impression_event_id: Optional[str]
    impression_source_url: Optional[str]
    impression_target_url: Optional[str]
    impression_ts: Optional[int]
    trail: tuple[str, ...]
    model: str
    credit: float
    impression_campaign: Optional[str] = OUTPUT_DEFAULTS["impression_campaign"]
    goal_value: Optional[float] = OUTPUT_DEFAULTS["goal_value"]
    credited_value: Optional[float] = OUTPUT_DEFAULTS["credited_value"]
    sign: int = OUTPUT_DEFAULTS["sign"]
    revision: int = OUTPUT_DEFAULTS["revision"]
    emit_timing: str = OUTPUT_DEFAULTS["emit_timing"]

    @property
    def organic(self) -> bool:
        return self.impression_id is None

    def to_record(self) -> dict:
        """The row as a dict in the Avro output schema (``trail`` as a list)."""
        record = self._asdict()
        record["trail"] = list(self.trail)
        return record


# A row from every field in order, skipping the Python frame of the named tuple's constructor
# (a firing builds one row per goal and model).
make_row = Attribution._make
# The changelog columns at their defaults, the last three fields of a row that is not revised.
CHANGELOG_DEFAULTS = tuple(OUTPUT_DEFAULTS[name] for name in ("sign", "revision", "emit_timing"))
