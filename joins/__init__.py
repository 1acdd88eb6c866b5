"""Reusable stream-to-stream join operators with an explicit state-cleanup strategy.

Declare the two sides (``JoinSide``), the equality keys and a time condition
(``StateKeyCondition``, ``StateValueCondition`` or both), then call ``stream_join``: it refuses
joins whose state Spark could never clean, builds the join, and returns it with the cleanup it
promises (``ExpectedCleanup``). ``inspect_join`` reads back what Spark actually does from a running
query, ``check_cleanup`` compares the two, and ``JoinStateCollector`` records the join's state
rows per micro-batch. See the README section "Stream-to-stream joins".
"""
from .build import JoinResult, filter_above_watermark, stream_join
from .cleanup import ExpectedCleanup, SideCleanup
from .guardrails import UnboundedStateError, UnsupportedOuterJoinError
from .inspect import (
                      CleanupMismatch,
                      DetectedSide,
                      InspectionError,
                      JoinInspection,
                      assert_cleanup,
                      check_cleanup,
                      inspect_join,
                      inspect_joins,
                      parse_plan,
)
from .metrics import JoinStateCollector, JoinStateRows, join_state_rows
from .spec import (
                      JOIN_TYPES,
                      STRATEGIES,
                      JoinSide,
                      JoinSpecError,
                      StateKeyCondition,
                      StateValueCondition,
)

__all__ = [
    "JoinSide", "StateKeyCondition", "StateValueCondition", "JOIN_TYPES", "STRATEGIES",
    "stream_join", "JoinResult", "filter_above_watermark", "ExpectedCleanup", "SideCleanup",
    "JoinSpecError", "UnboundedStateError", "UnsupportedOuterJoinError",
    "inspect_join", "inspect_joins", "parse_plan", "JoinInspection", "DetectedSide",
    "check_cleanup", "assert_cleanup", "CleanupMismatch", "InspectionError",
    "JoinStateCollector", "JoinStateRows", "join_state_rows",
]
