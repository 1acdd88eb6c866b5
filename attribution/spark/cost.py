"""What a micro-batch of the attribution job costs in CPU by the cost model the streaming
benchmark fits (``python -m benchmarks.streaming --cost-model``; docs/sizing.md), and the job's
warning when the bucketed state's share of that cost dominates.

With hash buckets every micro-batch moves the whole state of each bucket it touches between the
JVM and Python and writes it back; once the input touches every bucket, that is the whole state.
Its cost grows with the state, not with the input, so a user should hear of it before it
dominates every micro-batch, and what would help: fewer, larger micro-batches (the state's cost
is paid per micro-batch), or, beyond the crossover, a layout whose cost does not grow with the
state.
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class CpuFit(NamedTuple):
    """CPU seconds of one micro-batch = a + b x events + c x state MB (10^6 bytes)."""
    a: float
    b: float
    c: float

    def seconds(self, events: float, state_mb: float) -> float:
        """The fit's CPU seconds, a coefficient below zero (within noise of zero) as zero.

        :param events: the micro-batch's input rows.
        :param state_mb: the state's size in MB (10^6 bytes).
        """
        return max(self.a, 0.0) + max(self.b, 0.0) * events + max(self.c, 0.0) * state_mb


# The CPU fits per layout at commit 2c0a7e5 (docs/sizing.md: 2 cores, local mode, 2 shuffle
# partitions, 16 micro-batches per run at three sizes per layout). The per-user layouts'
# state coefficients came out below zero: their cost does not grow with the state measured.
BUCKETED = CpuFit(a=1.298, b=1.921e-5, c=0.03191)
ALTERNATIVES = {
    "transformWithState (--backend transformWithState)": CpuFit(a=2.132, b=2.814e-4, c=-0.0698),
    "one key per user (--state-buckets 0)": CpuFit(a=1.947, b=6.530e-4, c=-0.1486),
}
# The state's CPU seconds per micro-batch below which it is not worth a warning.
WARN_FROM_STATE_SECONDS = 1.0
MB = 1_000_000


def state_dominates(events: int, state_bytes: Optional[int]) -> Optional[str]:
    """The warning for a micro-batch of the bucketed layout with ``events`` input rows over
    ``state_bytes`` of state, when by ``BUCKETED`` the state costs at least
    ``WARN_FROM_STATE_SECONDS`` and more than the rest of the micro-batch; ``None`` otherwise.

    :param events: the micro-batch's input rows.
    :param state_bytes: the state's size on disk (RocksDB's SST files); ``None``: unknown.
    """
    if state_bytes is None:
        return None
    state_mb = state_bytes / MB
    state_s = max(BUCKETED.c, 0.0) * state_mb
    rest_s = BUCKETED.seconds(events, 0.0)
    if state_s < WARN_FROM_STATE_SECONDS or state_s <= rest_s:
        return None
    total = rest_s + state_s
    name, fit = min(ALTERNATIVES.items(), key=lambda item: item[1].seconds(events, state_mb))
    other = fit.seconds(events, state_mb)
    switch = (f"; at this size {name} would cost about {other:,.1f} CPU s per micro-batch "
              "(a new --checkpoint)" if other < total else
              f"; another layout would cost more at this size ({name}: about {other:,.1f} CPU s)")
    return (f"by the cost model (docs/sizing.md) the state's {state_mb:,.0f} MB cost about "
            f"{state_s:,.1f} CPU s of each micro-batch, more than the rest of it ({rest_s:,.1f} "
            f"CPU s for {events:,} events): every micro-batch rewrites each bucket it touches. "
            "Fewer, larger micro-batches (a longer --trigger, more --max-files-per-trigger) pay "
            f"that cost less often{switch}")
