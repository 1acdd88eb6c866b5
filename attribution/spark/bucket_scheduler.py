"""Who in a bucket of users is due: the scheduling of the applyInPandasWithState bucket layout,
free of Spark and pandas.

A bucket holds many users under one Spark key. For each user it keeps ``(wakeup, blob, inbox)``:
the core's state blob (empty while the user has only an inbox), the events received but not yet
given to the core (as the JSON objects they arrived in, comma-joined) and the user's next
wake-up: its earliest pending goal, or a lower bound of the time its state expires. Most events
arrive while nothing about their user is due, and go to the inbox without being parsed or the
blob decoded. A user is handed to the core (inbox in, then ``advance``) only once its wake-up is
at or below the watermark.

Deferring ``add`` changes no row: Spark has already dropped every row at or below the previous
watermark, so no event in an inbox is late for the core, and ``add`` keeps no order but arrival
order. Deferring garbage collection changes none either: it only drops what no goal at or after
the watermark can use. So each user's rows and their timing are those of one key per user.
With allowed lateness or early results (section 8) nothing is deferred: a record may revise rows
already emitted, in the micro-batch it arrives in.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..config import AttributionConfig
from ..core import Attribution, UserAttribution
from ..events import Event

# user_id -> (wakeup, core blob or b"", inbox of comma-joined JSON objects or "")
_NOW = -(2 ** 62)  # a wake-up at or below every watermark: due at once
BucketUsers = dict[str, tuple[int, bytes, str]]


class BucketScheduler:
    """The users of one bucket and the rule that decides which of them the core must see.

    :param config: the attribution rules.
    :param parse_inbox: turns ``(user_id, inbox)`` into that user's events, in arrival order.
    :param users: the bucket's users as stored (``BucketUsers``); empty for a new bucket.
    """

    def __init__(self, config: AttributionConfig, parse_inbox: Callable[[str, str], list[Event]],
                 users: Optional[BucketUsers] = None):
        self.config = config
        self.parse_inbox = parse_inbox
        self.users: BucketUsers = users if users is not None else {}

    def receive(self, user_id: str, packed: str, max_ts_ms: int,
                min_goal_ms: Optional[int]) -> None:
        """Put a micro-batch's events of one user in its inbox and move its wake-up forward to
        its earliest new goal, if that is sooner.

        :param packed: the events as comma-joined JSON objects, in arrival order.
        :param max_ts_ms: the latest event time among them (a new user's state cannot expire
            before it has outlived that event).
        :param min_goal_ms: the earliest goal among them, or None.
        """
        held = self.users.get(user_id)
        if held is None:
            wakeup, blob, inbox = UserAttribution.earliest_expiry(max_ts_ms, self.config), b"", ""
        else:
            wakeup, blob, inbox = held
        if min_goal_ms is not None and min_goal_ms < wakeup:
            wakeup = min_goal_ms
        if self.config.revising:
            # With revisions a record may be late and change emitted rows (or, with early
            # results, any record may): the core sees it in the micro-batch it arrives in.
            wakeup = _NOW
        self.users[user_id] = (wakeup, blob, f"{inbox},{packed}" if inbox else packed)

    def due(self, watermark: int) -> list[str]:
        """The users whose wake-up is at or below ``watermark``."""
        return [u for u, (wakeup, _, _) in self.users.items() if wakeup <= watermark]

    def advance(self, watermark: int) -> list[Attribution]:
        """Hand every due user to the core (its inbox, then ``advance(watermark)``) and keep what
        remains: the rows of every goal that fired."""
        rows: list[Attribution] = []
        for user_id in self.due(watermark):
            _, blob, inbox = self.users[user_id]
            core = (UserAttribution.from_bytes(blob, self.config) if blob
                    else UserAttribution(user_id, self.config))
            if inbox:
                core.add(self.parse_inbox(user_id, inbox))
            rows.extend(core.advance(watermark))
            if core.is_empty:
                del self.users[user_id]
            else:
                self.users[user_id] = (core.next_wakeup(), core.to_bytes(), "")
        return rows

    def next_wakeup(self) -> Optional[int]:
        """The earliest wake-up of the bucket's users (where its timer belongs), or None when the
        bucket is empty."""
        return min((wakeup for wakeup, _, _ in self.users.values()), default=None)

    def __len__(self) -> int:
        """The number of users held."""
        return len(self.users)
