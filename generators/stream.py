"""The endless event stream behind load mode and the Spark source, deterministic per offset.

Event time is cut into blocks of ``block_span``; block ``b`` holds the sessions that start in
``[T_b, T_b + span)`` (``T_b = start + b * span``), generated from its own random stream
``(seed, b)``, by users drawn from a fixed pool, so the same users return block after block.
Each record gets an arrival time from the disorder model, clipped below ``T_{b+2}``, and
sessions are cut at ``T_{b+2}`` too. So block ``b``'s records arrive in ``[T_b, T_{b+2})``.

Segment ``k`` is every record arriving in ``[T_k, T_{k+1})``: the tail of block ``k-1`` and
the head of block ``k``, merged by arrival time. It depends on two blocks only, so any offset
range can be regenerated on its own: a position is ``(segment, row)``, and the same position
always holds the same record, on any process, after any restart.

Disorder in the stream is record-level (there are no files): ``max_delay`` bounds how far a
record arrives behind the maximum event time before it, as in batch mode. ``late_fraction``
delays the chosen records by the watermark delay plus up to as much again, which makes them
late for a stream whose maximum event time keeps rising (best effort near a block's end, where
the clipping applies).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .behaviour import EventColumns, block_sessions, sessions_to_events
from .disorder import arrival_order
from .params import GeneratorParams
from .site import build_site, to_arrays, user_ids
from .writers import Vocabulary

# Event numbers of block b start at b * BLOCK_SEQ, so event ids never collide across blocks.
BLOCK_SEQ = 1_000_000
_STREAM_TAG = 3
_CACHED_BLOCKS = 8


@dataclass(frozen=True)
class Position:
    """A stream position: ``row`` within ``segment``, and ``events`` read before it in total."""

    segment: int = 0
    row: int = 0
    events: int = 0

    def to_offset(self) -> dict:
        return {"segment": self.segment, "row": self.row, "events": self.events}

    @classmethod
    def from_offset(cls, offset: dict) -> "Position":
        """The position an offset from ``to_offset`` holds; ``ValueError`` if it holds none.

        :param offset: the offset, as ``to_offset`` returned it.
        """
        try:
            return cls(int(offset["segment"]), int(offset["row"]), int(offset["events"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not a stream offset: {offset!r}; expected keys segment, row, "
                             "events") from None


class EventStream:
    """The endless stream for one set of parameters."""

    def __init__(self, params: GeneratorParams):
        """Build the site and the user pool; refuse blocks too large for their ids.

        :param params: the generator's parameters.
        """
        most_per_session = params.spam_max_repeats + params.max_walk + 3
        if params.sessions_per_block * most_per_session >= BLOCK_SEQ:
            raise ValueError(f"--sessions-per-block {params.sessions_per_block} is too large: a "
                             f"block may not exceed {BLOCK_SEQ:,} events")
        self.params = params
        self.span = params.block_span_ms
        self.site = to_arrays(build_site(params))
        self.vocab = Vocabulary(self.site.urls, user_ids(params.seed, params.users),
                                self.site.campaigns)
        self._block = functools.lru_cache(maxsize=_CACHED_BLOCKS)(self._make_block)
        self._segment = functools.lru_cache(maxsize=_CACHED_BLOCKS)(self._make_segment)
        self._sizes: dict[int, int] = {}

    def block_start(self, b: int) -> int:
        """The event time block ``b`` starts at, in epoch milliseconds.

        :param b: the block's index.
        """
        return self.params.start_ms + b * self.span

    def _make_block(self, b: int) -> tuple[EventColumns, np.ndarray]:
        """Block ``b``'s records (redelivered copies included) sorted by arrival, and their
        arrival times."""
        p = self.params
        rng = np.random.Generator(np.random.PCG64([p.seed, _STREAM_TAG, b]))
        t0, end = self.block_start(b), self.block_start(b + 2)
        sessions = block_sessions(p, rng, t0, self.span)
        events = sessions_to_events(p, self.site, sessions, rng, first_seq=b * BLOCK_SEQ)
        events = events.take(np.nonzero(events.ts < end)[0])
        rows, arrive, _ = arrival_order(p, events.ts, events.kind, rng)
        if p.late_fraction > 0:
            late = rng.random(len(rows)) < p.late_fraction
            delay = p.watermark_delay_ms
            arrive = np.where(late, events.ts[rows] + delay + rng.integers(1, delay + 2, len(rows)),
                              arrive)
        arrive = np.minimum(arrive, end - 1)
        order = np.argsort(arrive, kind="stable")
        return events.take(rows[order]), arrive[order]

    def _make_segment(self, k: int) -> tuple[EventColumns, np.ndarray]:
        """Records arriving in ``[T_k, T_{k+1})``, in arrival order, and their arrival times."""
        lo, hi = self.block_start(k), self.block_start(k + 1)
        parts, times = [], []
        for b in (k - 1, k):
            if b < 0:
                continue
            events, arrive = self._block(b)
            keep = np.nonzero((arrive >= lo) & (arrive < hi))[0]
            parts.append(events.take(keep))
            times.append(arrive[keep])
        merged = EventColumns.concat(parts)
        arrive = np.concatenate(times)
        order = np.argsort(arrive, kind="stable")  # ties: the older block first
        return merged.take(order), arrive[order]

    def segment(self, k: int) -> EventColumns:
        """The records arriving in segment ``k``, in arrival order.

        :param k: the segment's index.
        """
        return self._segment(k)[0]

    def segment_size(self, k: int) -> int:
        """How many records arrive in segment ``k``.

        :param k: the segment's index.
        """
        if k not in self._sizes:
            self._sizes[k] = len(self._segment(k)[0])
        return self._sizes[k]

    def arrival_time(self, pos: Position) -> int:
        """The stream's clock at ``pos``: the arrival time of the record there.

        Records arrive in arrival-time order and never before their event time, so this is at
        least the event time of every record before ``pos``, and every record from ``pos`` on
        has an event time at most its own delay below it.

        :param pos: a position in the stream.
        """
        pos = self.normalise(pos)
        return int(self._segment(pos.segment)[1][pos.row])

    def normalise(self, pos: Position) -> Position:
        """The same position with ``row`` inside a non-empty segment.

        :param pos: a position in the stream.
        """
        segment, row = pos.segment, pos.row
        while row >= self.segment_size(segment):
            row -= self.segment_size(segment)
            segment += 1
        return Position(segment, row, pos.events)

    def advance(self, pos: Position, count: int) -> Position:
        """The position ``count`` records after ``pos``.

        :param pos: a position in the stream.
        :param count: how many records to skip.
        """
        pos = self.normalise(pos)
        segment, row, left = pos.segment, pos.row, count
        while left > 0:
            room = self.segment_size(segment) - row
            step = min(room, left)
            row += step
            left -= step
            if row >= self.segment_size(segment):
                segment, row = segment + 1, 0
        return self.normalise(Position(segment, row, pos.events + count))

    def pieces(self, start: Position, end: Position) -> list[tuple[int, int, int]]:
        """``(segment, row_from, row_to)`` pieces covering ``[start, end)``.

        :param start: the first position covered.
        :param end: the position after the last one covered.
        """
        start, end = self.normalise(start), self.normalise(end)
        out = []
        segment, row = start.segment, start.row
        while (segment, row) < (end.segment, end.row):
            stop = end.row if segment == end.segment else self.segment_size(segment)
            if stop > row:
                out.append((segment, row, stop))
            segment, row = segment + 1, 0
        return out

    def read(self, start: Position, count: int) -> tuple[EventColumns, Position]:
        """The ``count`` records from ``start``, and the position after them.

        :param start: the position of the first record.
        :param count: how many records to read.
        """
        end = self.advance(start, count)
        parts = [self.segment(k).take(np.arange(lo, hi)) for k, lo, hi in self.pieces(start, end)]
        if not parts:
            return self.segment(start.segment).take(np.arange(0)), end
        return EventColumns.concat(parts), end


@functools.lru_cache(maxsize=4)
def stream_for(params: GeneratorParams) -> EventStream:
    """One ``EventStream`` per parameter set and process (site and user pool built once).

    :param params: the generator's parameters.
    """
    return EventStream(params)
