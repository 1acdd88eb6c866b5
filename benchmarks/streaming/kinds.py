"""The kinds of run the benchmark times, in the table's order, and how the tables name them."""
from __future__ import annotations

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
