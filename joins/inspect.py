"""Read back, from a running query, the state cleanup Spark really chose for each join.

After at least one micro-batch, the query's last executed plan contains one
``StreamingSymmetricHashJoin`` node per stream-stream join, printed like::

    StreamingSymmetricHashJoin [id#0, ts#1-T2000ms], [id#3, ts#4-T2000ms], Inner, condition = [...],
    state info [ ..., opId = 0, ... ] ..., 8000, 8000,
    state cleanup [ left key predicate: (input[1, timestamp, true] <= 8000000), right = null ], ...

``parse_plan`` turns that text into ``JoinInspection``s: per side the strategy (``state-key`` for
a key predicate, ``state-value`` for a value predicate, ``none``), the predicate text, the column
it tests and its eviction threshold; plus the operator's watermarks for late rows and eviction
(epoch ms). ``check_cleanup`` compares an inspection with the operator's ``ExpectedCleanup``.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

from .cleanup import ExpectedCleanup

JOIN_NODE = "StreamingSymmetricHashJoin"
SPARK_JOIN_TYPES = {"inner": "Inner", "left_outer": "LeftOuter", "right_outer": "RightOuter",
                    "full_outer": "FullOuter", "left_semi": "LeftSemi"}
PREDICATE_KINDS = {"key": "state-key", "value": "state-value"}

_HEAD = re.compile(r"StreamingSymmetricHashJoin \[(?P<lkeys>[^\]]*)\], \[(?P<rkeys>[^\]]*)\], "
                   r"(?P<type>\w+), condition = ")
_OP_ID = re.compile(r"opId = (\d+)")
_WATERMARKS = re.compile(r"(None|Some\(-?\d+\)|-?\d+), (None|Some\(-?\d+\)|-?\d+), "
                         r"state cleanup \[")
_THRESHOLD = re.compile(r"<= (-?\d+)\)$")
_BOUND_KEY = re.compile(r"^\(input\[(\d+), [^\]]*\](\.\w+)? <=")
_VALUE_COLUMN = re.compile(r"^\((\w+)#\d+(?:-T\d+ms)?(\.\w+)? <=")
_ATTRIBUTE = re.compile(r"^(\w+)#\d+")


class InspectionError(RuntimeError):
    """The query's plan cannot be inspected (no batch yet, or no stream-stream join in it)."""


@dataclass(frozen=True)
class DetectedSide:
    """What Spark does with one side's state: strategy, predicate and eviction threshold."""

    side: str
    strategy: str
    predicate: Optional[str] = None
    column: Optional[str] = None
    field: Optional[str] = None
    threshold_ms: Optional[int] = None

    def describe(self) -> str:
        """One line: the side's strategy, predicate and threshold."""
        if self.strategy == "none":
            return f"{self.side}: none (state never evicted)"
        return f"{self.side}: {self.strategy}, {self.predicate} (evicts <= {self.threshold_ms} ms)"


@dataclass(frozen=True)
class JoinInspection:
    """One stream-stream join operator of a query's last executed plan."""

    operator_id: Optional[int]
    join_type: str
    left: DetectedSide
    right: DetectedSide
    late_events_watermark_ms: Optional[int]
    eviction_watermark_ms: Optional[int]
    batch_id: Optional[int] = None
    node: str = ""

    def sides(self) -> tuple[DetectedSide, DetectedSide]:
        """The left and the right side, in that order."""
        return self.left, self.right

    def to_dict(self) -> dict:
        """The inspection as a JSON-ready dict, without the raw plan node."""
        out = asdict(self)
        out.pop("node")
        return out

    def describe(self) -> str:
        """One line: operator id, join type, eviction watermark and both sides."""
        return (f"join operator {self.operator_id} ({self.join_type}), eviction watermark "
                f"{self.eviction_watermark_ms} ms: {self.left.describe()}; {self.right.describe()}")


def _option_ms(text: str) -> Optional[int]:
    if text == "None":
        return None
    return int(text[5:-1]) if text.startswith("Some(") else int(text)


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesised expression starting at ``text[start] == '('``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    raise InspectionError(f"unbalanced predicate in plan: {text[start:start + 200]!r}")


def _key_names(keys_text: str) -> list[str]:
    names = []
    for key in keys_text.split(", "):
        match = _ATTRIBUTE.match(key.strip())
        names.append(match.group(1) if match else key.strip())
    return names


def _parse_side(side: str, text: str, pos: int, keys: list[str]) -> tuple[DetectedSide, int]:
    """Parse ``left = null`` / ``left key predicate: (...)`` at ``pos``; return it and the end."""
    prefix = f"{side} "
    if not text.startswith(prefix, pos):
        raise InspectionError(f"unexpected state cleanup text at {text[pos:pos + 80]!r}")
    pos += len(prefix)
    if text.startswith("= null", pos):
        return DetectedSide(side, "none"), pos + len("= null")
    match = re.compile(r"(key|value) predicate: ").match(text, pos)
    if not match:
        raise InspectionError(f"unexpected {side} cleanup text {text[pos:pos + 80]!r}")
    start = match.end()
    end = _balanced(text, start)
    predicate = text[start:end]
    threshold = _THRESHOLD.search(predicate)
    column = field = None
    key_match = _BOUND_KEY.match(predicate)
    value_match = _VALUE_COLUMN.match(predicate)
    if key_match:
        ordinal = int(key_match.group(1))
        column = keys[ordinal] if ordinal < len(keys) else None
        field = key_match.group(2)[1:] if key_match.group(2) else None
    elif value_match:
        column = value_match.group(1)
        field = value_match.group(2)[1:] if value_match.group(2) else None
    threshold_ms = None
    if threshold:
        # Spark compares microseconds; thresholds are whole milliseconds by construction.
        threshold_ms = int(threshold.group(1)) // 1000
    return DetectedSide(side, PREDICATE_KINDS[match.group(1)], predicate, column, field,
                        threshold_ms), end


def parse_plan(plan_text: str, batch_id: Optional[int] = None) -> list[JoinInspection]:
    """Every stream-stream join node of an executed-plan text, in plan order.

    :param plan_text: the executed physical plan as ``query.explain()`` prints it.
    :param batch_id: the micro-batch the plan belongs to, recorded in each inspection.
    :returns: one inspection per join node (empty when the plan has none).
    :raises InspectionError: a join node whose state cleanup text cannot be parsed.
    """
    inspections = []
    for line in plan_text.splitlines():
        head = _HEAD.search(line)
        if not head:
            continue
        node = line[head.start():]
        op_id = _OP_ID.search(node)
        marks = _WATERMARKS.search(node)
        if not marks:
            raise InspectionError(f"no state cleanup section in join node: {node[:300]!r}")
        pos = marks.end()
        pos = len(node) - len(node[pos:].lstrip())
        left, pos = _parse_side("left", node, pos, _key_names(head.group("lkeys")))
        if not node.startswith(", ", pos):
            raise InspectionError(f"unexpected text after the left cleanup: {node[pos:pos + 80]!r}")
        right, _ = _parse_side("right", node, pos + 2, _key_names(head.group("rkeys")))
        inspections.append(JoinInspection(
            operator_id=int(op_id.group(1)) if op_id else None, join_type=head.group("type"),
            left=left, right=right, late_events_watermark_ms=_option_ms(marks.group(1)),
            eviction_watermark_ms=_option_ms(marks.group(2)), batch_id=batch_id, node=node))
    return inspections


def executed_plan_text(query) -> str:
    """The text of the query's last executed physical plan (what ``query.explain()`` prints).

    :param query: a started ``StreamingQuery``.
    :raises InspectionError: the query has not run a micro-batch yet.
    """
    text = query._jsq.explainInternal(False)
    if JOIN_NODE not in text and "No physical plan" in text:
        raise InspectionError("the query has not run a micro-batch yet: inspect it after "
                              "processAllAvailable() or once lastProgress is set")
    return text


def inspect_joins(query) -> list[JoinInspection]:
    """All stream-stream joins of a started query, as Spark planned them for its last batch.

    :param query: a started ``StreamingQuery`` that has run at least one micro-batch.
    :raises InspectionError: no batch has run yet, or the plan has no stream-stream join.
    """
    progress = query.lastProgress
    batch_id = progress["batchId"] if progress is not None else None
    inspections = parse_plan(executed_plan_text(query), batch_id)
    if not inspections:
        raise InspectionError("the query's plan has no stream-stream join "
                              f"({JOIN_NODE}); is one of the inputs a static DataFrame?")
    return inspections


def inspect_join(query) -> JoinInspection:
    """The single stream-stream join of a query.

    :param query: a started ``StreamingQuery`` that has run at least one micro-batch.
    :raises InspectionError: as ``inspect_joins``, or the query has several joins (use
        ``inspect_joins`` then).
    """
    inspections = inspect_joins(query)
    if len(inspections) != 1:
        raise InspectionError(f"the query has {len(inspections)} stream-stream joins; "
                              "use inspect_joins() and pick one")
    return inspections[0]


def check_cleanup(expected: ExpectedCleanup, inspection: JoinInspection) -> list[str]:
    """Differences between the operator's promise and what Spark does; empty when they agree.

    Compared: the join type, and per side the strategy, the column (and window field) the
    predicate tests, and the eviction threshold implied by the operator's eviction watermark.

    :param expected: the promise ``stream_join`` returned (``JoinResult.expected``).
    :param inspection: the join as Spark runs it (``inspect_join``).
    :returns: one sentence per difference.
    """
    problems = []
    spark_type = SPARK_JOIN_TYPES[expected.how]
    if inspection.join_type != spark_type:
        problems.append(f"join type: expected {spark_type}, Spark runs {inspection.join_type}")
    for promised, detected in zip(expected.sides(), inspection.sides()):
        where = f"{promised.side} side ({promised.name})"
        if promised.strategy != detected.strategy:
            problems.append(f"{where}: expected {promised.strategy}, "
                            f"Spark chose {detected.strategy}"
                            + (f" {detected.predicate}" if detected.predicate else ""))
            continue
        if not promised.cleanable:
            continue
        if detected.column is not None and detected.column not in (promised.column,
                                                                    promised.source_column):
            problems.append(f"{where}: expected the predicate on {promised.column}, "
                            f"Spark tests {detected.column}")
        if (detected.field or None) != (promised.field or None):
            problems.append(f"{where}: expected field {promised.field}, "
                            f"Spark tests {detected.field}")
        want = promised.threshold_ms(inspection.eviction_watermark_ms)
        if want is not None and detected.threshold_ms != want:
            problems.append(f"{where}: expected eviction threshold {want} ms at watermark "
                            f"{inspection.eviction_watermark_ms} ms, "
                            f"Spark uses {detected.threshold_ms} ms")
    return problems


class CleanupMismatch(AssertionError):
    """The running join does not clean its state the way its operator promised."""


def assert_cleanup(expected: ExpectedCleanup, inspection: JoinInspection) -> None:
    """Fail when the running join does not clean its state as promised.

    :param expected: the promise ``stream_join`` returned (``JoinResult.expected``).
    :param inspection: the join as Spark runs it (``inspect_join``).
    :raises CleanupMismatch: listing every difference found by ``check_cleanup``.
    """
    problems = check_cleanup(expected, inspection)
    if problems:
        raise CleanupMismatch("; ".join(problems))
