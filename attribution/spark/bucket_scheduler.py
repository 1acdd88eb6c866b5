"""Who in a bucket of users is due: the scheduling of the applyInPandasWithState bucket layout,
free of Spark and pandas.

A bucket holds many users under one Spark key. For each user it keeps ``(wakeup, blob, inbox)``:
the core's state blob (empty while the user has only an inbox), the events received but not yet
given to the core (as the JSON objects they arrived in, comma-joined) and the user's next
wake-up (``UserAttribution.next_wakeup``, or for a user with only an inbox its earliest goal or a
lower bound of the time its state expires). Most events arrive while nothing about their user is
due, and go to the inbox without being parsed or the blob decoded. A user is handed to the core
(inbox in, then ``advance``) only once its wake-up is at or below the watermark.

Deferring ``add`` changes no row: Spark has already dropped every row at or below the previous
watermark, so no event in an inbox is late for the core, and what ``add`` keeps does not depend
on the order or the calls its records come in (rule 1 keeps the smallest copy). Deferring
garbage collection changes none either: it only drops what no goal at or after the watermark
can use. So each user's rows and their timing are those of one key per user.

With allowed lateness or early results (section 8) the bucket also keeps the watermark it last
advanced to and asks to be woken at every move of the watermark, so that in micro-batch ``k`` it
knows ``W[k-1]``, by which lateness and ``emit_timing`` are judged; waking a bucket decodes no
user. A record at or behind ``W[k-1]`` (late, but within the allowed lateness) may change rows
already emitted, and with early results any record may: such a user is handed to the core in the
micro-batch the record arrives in. An on-time record cannot change an emitted row (it is later
than every goal the watermark has passed, so it is no smaller copy of one either), and it waits
in the inbox like any other.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..config import AttributionConfig
from ..core import UserAttribution
from ..events import Event
from ..rows import Attribution

# user_id -> (wakeup, core blob or b"", inbox of comma-joined JSON objects or "")
_NOW = -(2 ** 62)  # a wake-up at or below every watermark: due at once
BucketUsers = dict[str, tuple[int, bytes, str]]


class BucketScheduler:
    """The users of one bucket and the rule that decides which of them the core must see.

    :param config: the attribution rules.
    :param parse_inbox: turns ``(user_id, inbox)`` into that user's events, in arrival order.
    :param users: the bucket's users as stored (``BucketUsers``); empty for a new bucket.
    :param watermark: the watermark the bucket last advanced to, as stored; None if unknown
        (a new bucket, or one stored without it).
    """

    def __init__(self, config: AttributionConfig, parse_inbox: Callable[[str, str], list[Event]],
                 users: Optional[BucketUsers] = None, watermark: Optional[int] = None):
        self.config = config
        self.parse_inbox = parse_inbox
        self.users: BucketUsers = users if users is not None else {}
        self.watermark = watermark

    def receive(self, user_id: str, packed: str, min_ts_ms: int, max_ts_ms: int,
                min_goal_ms: Optional[int]) -> None:
        """Put a micro-batch's events of one user in its inbox and move its wake-up forward to
        its earliest new goal, if that is sooner (with revisions, to now if they may change
        emitted rows: see the module docstring).

        :param user_id: the user the events belong to.
        :param packed: the events as comma-joined JSON objects, in arrival order.
        :param min_ts_ms: the earliest event time among them.
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
        if self.config.revising and (self.config.early_results or self.watermark is None
                                     or min_ts_ms <= self.watermark):
            # A late record (or, with early results, any record) may change emitted rows: the
            # core sees it in the micro-batch it arrives in. (Not knowing W[k-1], in a bucket's
            # first call, every record counts as possibly late.)
            wakeup = _NOW
        self.users[user_id] = (wakeup, blob, f"{inbox},{packed}" if inbox else packed)

    def due(self, watermark: int) -> list[str]:
        """The users whose wake-up is at or below a watermark.

        :param watermark: the watermark (epoch ms).
        """
        return [u for u, (wakeup, _, _) in self.users.items() if wakeup <= watermark]

    def advance(self, watermark: int) -> list[Attribution]:
        """Hand every due user to the core (its inbox, then ``advance(watermark)``) and keep what
        remains.

        :param watermark: the micro-batch's watermark (epoch ms).
        :returns: the rows of every goal that fired.
        """
        rows: list[Attribution] = []
        for user_id in self.due(watermark):
            _, blob, inbox = self.users[user_id]
            core = (UserAttribution.from_bytes(blob, self.config) if blob
                    else UserAttribution(user_id, self.config))
            if inbox:
                # Not judged against W[k-1]: records that waited in the inbox were on time
                # when they arrived, however far the watermark has moved since.
                core.add(self.parse_inbox(user_id, inbox))
            rows.extend(core.advance(watermark, previous=self.watermark))
            if core.is_empty:
                del self.users[user_id]
            else:
                self.users[user_id] = (core.next_wakeup(), core.to_bytes(), "")
        if self.watermark is None or watermark > self.watermark:
            self.watermark = watermark
        return rows

    def next_wakeup(self) -> Optional[int]:
        """Where the bucket's timer belongs: the earliest wake-up of its users and, with
        revisions, the watermark's next move; None when there is nothing to wake for (the
        bucket can then be dropped)."""
        wakeup = min((wakeup for wakeup, _, _ in self.users.values()), default=None)
        if self.config.revising and self.watermark is not None:
            wakeup = self.watermark + 1 if wakeup is None else min(wakeup, self.watermark + 1)
        return wakeup

    def __len__(self) -> int:
        """The number of users held."""
        return len(self.users)
