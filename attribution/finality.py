"""Finality: the completeness frontier a committed micro-batch publishes with its rows.

A goal whose time is at or before a micro-batch's frontier ``final_through`` can no longer
change: every record that could still alter its attribution (a record of its user with an
earlier time) would be older than the on-time watermark minus the allowed lateness, and is
dropped as late (``docs/semantics.md``, section 8). Without allowed lateness the frontier is the
watermark itself. Before the first watermark nothing is final.

The frontier travels with the data it belongs to: each commit of a Delta output carries it in
its commit information's ``userMetadata``, as the JSON object ``frontier_metadata`` builds, so a
reader of one table version gets that version's rows and frontier together.
"""
from __future__ import annotations

import json
from typing import Optional

# The keys of the JSON object in a commit's ``userMetadata``.
BATCH_ID_KEY = "batch_id"
WATERMARK_KEY = "watermark_ms"
ALLOWED_LATENESS_KEY = "allowed_lateness_ms"
FINAL_THROUGH_KEY = "final_through_ms"


def final_through_ms(watermark_ms: Optional[int], allowed_lateness_ms: int) -> Optional[int]:
    """The time up to which goals are final, or None while nothing is.

    :param watermark_ms: the on-time watermark the micro-batch ran with (epoch milliseconds);
        None or 0 (Spark's watermark before any event time was seen) means no watermark yet.
    :param allowed_lateness_ms: the job's allowed lateness (0 without revisions).
    """
    if not watermark_ms or watermark_ms <= 0:
        return None
    return watermark_ms - allowed_lateness_ms


def frontier_metadata(batch_id: int, watermark_ms: Optional[int],
                      allowed_lateness_ms: int) -> str:
    """The ``userMetadata`` JSON of the commit of micro-batch ``batch_id``.

    :param batch_id: the micro-batch's id.
    :param watermark_ms: the on-time watermark it ran with (None or 0: none yet).
    :param allowed_lateness_ms: the job's allowed lateness.
    """
    return json.dumps({BATCH_ID_KEY: batch_id,
                       WATERMARK_KEY: watermark_ms or None,
                       ALLOWED_LATENESS_KEY: allowed_lateness_ms,
                       FINAL_THROUGH_KEY: final_through_ms(watermark_ms, allowed_lateness_ms)},
                      sort_keys=True)


def parse_frontier(user_metadata: Optional[str]) -> Optional[dict]:
    """The frontier object of a commit's ``userMetadata``, or None for a commit that carries
    none (a commit of another writer, or of a table's creation).

    :param user_metadata: the commit's ``userMetadata`` string, possibly None.
    """
    if not user_metadata:
        return None
    try:
        parsed = json.loads(user_metadata)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or FINAL_THROUGH_KEY not in parsed:
        return None
    return parsed
