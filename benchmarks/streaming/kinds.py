"""The kinds of run the benchmark times, in the table's order, and how the tables name them."""
from __future__ import annotations

from joins.durations import format_duration_ms

# ``native`` is the denominator of every ratio.
NATIVE = "native"
STREAM_BACKENDS = ("applyInPandasWithState", "transformWithState")
BATCH = "batch"
CORE = "core"
RUN_KINDS = (NATIVE, *STREAM_BACKENDS, BATCH, CORE)
RUN_LABELS = {
    NATIVE: "(a) native window count",
    "applyInPandasWithState": "(b) stream applyInPandasWithState",
    "transformWithState": "(b) stream transformWithState",
    BATCH: "(c) batch (mapInArrow)",
    CORE: "(d) pure-Python core",
}


def run_label(kind: str, allowed_lateness_ms: int = 0) -> str:
    """How the tables name a run of ``kind`` (one of ``RUN_KINDS``), with its allowed lateness
    when it has one.

    :param kind: the run's kind, one of ``RUN_KINDS``.
    :param allowed_lateness_ms: the run's allowed lateness, ms (0: none).
    """
    label = RUN_LABELS.get(kind, kind)
    if allowed_lateness_ms:
        label += f", allowed lateness {format_duration_ms(allowed_lateness_ms)}"
    return label


def table_variants(kinds: list[str], lateness_ms: list[int]) -> list[tuple[str, int]]:
    """The rows of a main table: ``(kind, allowed lateness)`` for every kind of ``kinds``, the
    streaming backends once per value of ``lateness_ms`` (the others have none).

    :param kinds: the kinds to run.
    :param lateness_ms: the allowed lateness values (ms) of the streaming backends.
    """
    return [(kind, ms) for kind in kinds
            for ms in (lateness_ms if kind in STREAM_BACKENDS else [0])]


# The native count's event-time window.
NATIVE_WINDOW = "10 minutes"
# The attribution job's state layouts, as the sustainable and cost-model modes run them: the
# backend and the job's further command-line options.
JOB_LAYOUTS = {
    "job": ("applyInPandasWithState", ()),
    "job-per-user": ("applyInPandasWithState", ("--state-buckets", "0")),
    "job-tws": ("transformWithState", ()),
}
JOB_LAYOUT_LABELS = {
    "job": "attribution job, bucketed state (default)",
    "job-per-user": "attribution job, per-user keys",
    "job-tws": "attribution job, transformWithState",
}
DEFAULT_LAYOUT = "job"
