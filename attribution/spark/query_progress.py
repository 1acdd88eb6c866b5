"""What a streaming query's progress update says about its micro-batch.

Spark reports progress after every trigger, also after an idle one that ran no micro-batch: such
an update carries the id of the micro-batch still to come, no input and nothing dropped, and it
has no ``addBatch`` duration. Whatever counts micro-batches from progress updates (the job's
progress lines, its late-record audit, the benchmarks) must skip those.
"""
from __future__ import annotations

from typing import Any


def micro_batch_ran(progress: Any) -> bool:
    """True when ``progress`` reports a micro-batch that ran, not an idle trigger.

    :param progress: a ``StreamingQueryProgress`` or its JSON as a dict.
    """
    durations = (progress.get("durationMs") if isinstance(progress, dict)
                 else progress.durationMs)
    return "addBatch" in (durations or {})
