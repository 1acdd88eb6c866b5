"""Per-batch state rows of the stream-stream join operators, from query progress.

Every micro-batch's progress lists its stateful operators; the join's entry
(``operatorName == "symmetricHashJoin"``) holds its state-store counters. ``join_state_rows``
extracts them from one progress; ``JoinStateCollector`` accumulates them over a query's life
(``recentProgress`` keeps only the last 100 batches, so poll it, or feed it from a
``StreamingQueryListener``), keyed by batch id so repeated polls never count a batch twice.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

JOIN_OPERATOR_NAME = "symmetricHashJoin"


@dataclass(frozen=True)
class JoinStateRows:
    """One join operator's state counters for one micro-batch.

    ``join_index`` numbers the query's join operators in plan order (0 for the first join).
    """

    batch_id: int
    join_index: int
    total: int
    updated: int
    removed: int
    dropped_by_watermark: int
    input_rows: int
    output_rows: Optional[int]
    watermark: Optional[str]

    def to_dict(self) -> dict:
        """The counters as a plain dict."""
        return asdict(self)


def progress_dict(progress: Any) -> dict:
    """A query progress as a plain dict.

    :param progress: a progress as a dict, JSON text, or PySpark ``StreamingQueryProgress``.
    :raises TypeError: it is none of these.
    """
    if isinstance(progress, dict):
        return progress
    if isinstance(progress, str):
        return json.loads(progress)
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return json.loads(text)
    raise TypeError(f"not a streaming query progress: {type(progress).__name__}")


def join_state_rows(progress: Any) -> list[JoinStateRows]:
    """The join operators' state counters in one progress.

    :param progress: one micro-batch's progress, in any form ``progress_dict`` takes.
    :returns: one entry per join operator, in plan order (empty if the batch has no join).
    """
    p = progress_dict(progress)
    operators = [op for op in p.get("stateOperators") or []
                 if op.get("operatorName") == JOIN_OPERATOR_NAME]
    sink = p.get("sink") or {}
    output_rows = sink.get("numOutputRows")
    output_rows = None if output_rows is None or output_rows < 0 else int(output_rows)
    return [JoinStateRows(batch_id=int(p["batchId"]), join_index=i,
                          total=int(op.get("numRowsTotal", 0)),
                          updated=int(op.get("numRowsUpdated", 0)),
                          removed=int(op.get("numRowsRemoved", 0)),
                          dropped_by_watermark=int(op.get("numRowsDroppedByWatermark", 0)),
                          input_rows=int(p.get("numInputRows", 0)),
                          output_rows=output_rows,
                          watermark=(p.get("eventTime") or {}).get("watermark"))
            for i, op in enumerate(operators)]


class JoinStateCollector:
    """Join state rows of every batch seen, deduplicated by (batch id, join index)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int], JoinStateRows] = {}

    def add(self, progress: Any) -> list[JoinStateRows]:
        """Record one progress.

        :param progress: one micro-batch's progress, in any form ``progress_dict`` takes.
        :returns: its join rows that were not recorded before.
        """
        new = []
        for row in join_state_rows(progress):
            key = (row.batch_id, row.join_index)
            if key not in self._rows:
                new.append(row)
            self._rows[key] = row
        return new

    def add_all(self, progresses: Iterable[Any]) -> list[JoinStateRows]:
        """Record several progresses (``add`` each).

        :param progresses: micro-batch progresses, in any form ``progress_dict`` takes.
        :returns: their join rows that were not recorded before.
        """
        new = []
        for progress in progresses:
            new += self.add(progress)
        return new

    def poll(self, query) -> list[JoinStateRows]:
        """Record the query's ``recentProgress``.

        :param query: a started ``StreamingQuery``.
        :returns: the rows not seen before.
        """
        return self.add_all(query.recentProgress)

    def rows(self, join_index: int = 0) -> list[JoinStateRows]:
        """The recorded rows of one join operator, by batch id.

        :param join_index: the operator's position in plan order (0 for the first join).
        """
        return sorted((r for (b, j), r in self._rows.items() if j == join_index),
                      key=lambda r: r.batch_id)

    def totals(self, join_index: int = 0) -> list[int]:
        """``numRowsTotal`` per batch, in batch order.

        :param join_index: the operator's position in plan order (0 for the first join).
        """
        return [r.total for r in self.rows(join_index)]

    def to_records(self) -> list[dict]:
        """Every recorded row as a dict, by batch id then join index."""
        return [r.to_dict() for r in sorted(self._rows.values(),
                                             key=lambda r: (r.batch_id, r.join_index))]
