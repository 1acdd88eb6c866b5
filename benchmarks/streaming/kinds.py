"""The kinds of run the benchmark times, in the table's order, how the tables name them, and
how the attribution job runs for each of its kinds (backend, input and output format)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from joins.durations import format_duration_ms

# ``native`` is the denominator of every ratio.
NATIVE = "native"
# The attribution query alone, with the default backend: what the job costs around it is the
# difference between the two rows.
BARE = "bare"
STREAM_BACKENDS = ("applyInPandasWithState", "transformWithState")
KAFKA = "kafka"
DELTA = "delta"
BATCH = "batch"
CORE = "core"
RUN_KINDS = (NATIVE, BARE, *STREAM_BACKENDS, KAFKA, DELTA, BATCH, CORE)
RUN_LABELS = {
    NATIVE: "(a) native window count",
    BARE: "(b) bare attribution query (no validation, no dead letters)",
    "applyInPandasWithState": "(b) stream applyInPandasWithState",
    "transformWithState": "(b) stream transformWithState",
    KAFKA: "(b) stream applyInPandasWithState, Kafka source",
    DELTA: "(b) stream applyInPandasWithState, Delta sink",
    BATCH: "(c) batch (mapInArrow)",
    CORE: "(d) pure-Python core",
}
# The job's inputs (``runs.INPUTS``): the dataset's files, and the same events on a Kafka topic.
FILES = "files"
KAFKA_TOPIC = "kafka topic"
# The job's output formats (its ``--output-format``; ``runs.output_options``).
PARQUET = "parquet"
DELTA_TABLE = "delta"


@dataclass(frozen=True)
class JobRun:
    """How the attribution job runs for one kind.

    :param backend: the stateful backend it streams with; ``None``: batch mode.
    :param source: its input, a key of ``runs.INPUTS``: the dataset's files, or the same
        events on a Kafka topic.
    :param sink: the format of its output: Parquet files, or a Delta table.
    """

    backend: Optional[str]
    source: str = FILES
    sink: str = PARQUET


# The kinds that run the attribution job; the others (native, core) are not the job.
JOB_RUNS = {
    **{backend: JobRun(backend) for backend in STREAM_BACKENDS},
    KAFKA: JobRun(STREAM_BACKENDS[0], KAFKA_TOPIC),
    DELTA: JobRun(STREAM_BACKENDS[0], FILES, DELTA_TABLE),
    BATCH: JobRun(None),
}
STREAMING_KINDS = tuple(kind for kind, job in JOB_RUNS.items() if job.backend)
# The backend of the bare attribution query (``BARE``): the job's default.
BARE_BACKEND = STREAM_BACKENDS[0]
# How the ratio of a kind to its counterpart is named, by what the kind changes.
COUNTERPART_WORDS = {"source": "x files", "sink": "x Parquet"}


def counterpart(kind: str) -> Optional[tuple[str, str]]:
    """The kind that runs the same query as ``kind`` on the dataset's files into Parquet, when
    ``kind`` reads another input or writes another format (the table prints the ratio of the
    two), and how that ratio is named (``COUNTERPART_WORDS``); ``None`` otherwise.

    :param kind: a kind of ``RUN_KINDS``.
    """
    job = JOB_RUNS.get(kind)
    if job is None or (job.source, job.sink) == (FILES, PARQUET):
        return None
    other = next(k for k, run in JOB_RUNS.items() if run == JobRun(job.backend, FILES, PARQUET))
    return other, COUNTERPART_WORDS["source" if job.source != FILES else "sink"]


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
    streaming kinds once per value of ``lateness_ms`` (the others have none).

    :param kinds: the kinds to run.
    :param lateness_ms: the allowed lateness values (ms) of the streaming kinds.
    """
    return [(kind, ms) for kind in kinds
            for ms in (lateness_ms if kind in STREAMING_KINDS else [0])]


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
