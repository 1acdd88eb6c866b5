"""Per-micro-batch progress lines and the final run report of a streaming job.

Everything is read from Spark's own ``StreamingQueryProgress``: input rows, the micro-batch's
duration (``durationMs.triggerExecution``) and rates (``inputRowsPerSecond``,
``processedRowsPerSecond``), late rows dropped by the stateful operator
(``numRowsDroppedByWatermark``), the state's size (RocksDB's SST files), the watermark, and the
observed metrics the pipeline attaches to its output (goals and attributed goals per model,
``attribution.spark.pipeline.output_metrics``, and the change in users held where Spark's state
row count is not a user count).

The progress line and the report use the same names for the same numbers: "attributed" is
always the goals credited to an impression, "organic" the others, "goals" both; with several
models, "attributed" and "organic" are given per model.

``MicroBatchProgress`` is the one loop over ``query.recentProgress`` that every job follows its
query with: each micro-batch that ran is taken once, becomes a record (kept in ``history`` and,
with ``--progress-json``, appended to a file as one JSON line) and a progress line on stderr.
A job says what a micro-batch's record and line are; ``BatchProgress`` does it for the
attribution job's output.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, TextIO

from attribution.config import DEFAULT_MODELS
from attribution.spark.pipeline import metric_name
from attribution.spark.query_progress import micro_batch_ran

# Spark reports the watermark as epoch 0 until the first micro-batch with data has set one.
NO_WATERMARK = "1970-01-01T00:00:00.000Z"
_LABEL_WIDTH = 15


def watermark_text(watermark: Optional[str]) -> str:
    """Spark's watermark, or ``"none yet"`` while it has not been set.

    :param watermark: the watermark from a progress report, or ``None``.
    """
    return "none yet" if watermark in (None, NO_WATERMARK) else watermark


def rate_text(rows_per_second: Optional[float]) -> str:
    """A rate in rows per second, to three significant figures or so.

    :param rows_per_second: the rate, or ``None``/NaN when unknown.
    """
    if rows_per_second is None or rows_per_second != rows_per_second:  # None or NaN
        return "n/a"
    if rows_per_second >= 100:
        return f"{rows_per_second:,.0f} rows/s"
    return f"{rows_per_second:.3g} rows/s"


def size_text(size: Optional[int]) -> str:
    """A byte count in B, KB, MB or GB (powers of 1024).

    :param size: the byte count, or ``None`` when unknown.
    """
    if size is None:
        return "n/a"
    value, unit = float(size), "B"
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def _count(value: Optional[int]) -> str:
    return "n/a" if value is None else str(value)


def per_model(counts: Mapping[str, int]) -> str:
    """``last_touch 80, linear 78``: a count per model.

    :param counts: a count per model name, in the order to show.
    """
    return ", ".join(f"{m} {n}" for m, n in counts.items())


@dataclass
class RunReport:
    """What a job run did, for the final report and ``--report-json``.

    Every model gives rows for every goal, so ``goals`` is one number; ``attributed_by_model``
    counts, per model, the goals it credited to impressions, and ``attributed`` is the first
    model's count (the only one of a run of one model).
    """

    mode: str
    backend: str
    output: str
    input_rows: int = 0
    late_rows: int = 0
    goals: int = 0
    attributed: int = 0
    attributed_by_model: dict = field(default_factory=dict)
    batches: int = 0
    seconds: float = 0.0
    state_rows: Optional[int] = None      # Spark's state row count (buckets, or entries)
    users_in_state: Optional[int] = None
    state_bytes: Optional[int] = None     # the state store's files (RocksDB SST files)
    watermark: Optional[str] = None
    stopped_by: Optional[str] = None      # "SIGINT" or "SIGTERM" when a signal stopped the run
    extra: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # one dict per micro-batch

    @property
    def organic(self) -> int:
        """The goals no model credited to an impression."""
        return self.goals - self.attributed

    def as_dict(self) -> dict:
        """The report as a JSON-ready dict, ``organic`` included."""
        return {**asdict(self), "organic": self.organic}

    def render(self) -> str:
        """The report as the lines printed at the end of a run."""
        ending = f"stopped by {self.stopped_by}" if self.stopped_by else "finished"
        fields = [("input rows", self.input_rows)]
        if self.mode == "stream":
            fields.append(("processed", rate_text(self.input_rows / self.seconds
                                                  if self.seconds else None)))
        fields += [("late dropped", self.late_rows), ("goals", self.goals)]
        if len(self.attributed_by_model) > 1:
            fields += [("attributed", per_model(self.attributed_by_model)),
                       ("organic", per_model({m: self.goals - a for m, a
                                              in self.attributed_by_model.items()}))]
        else:
            fields += [("attributed", self.attributed), ("organic", self.organic)]
        fields += list(self.extra.items())
        if self.mode == "stream":
            fields += [("users in state", _count(self.users_in_state)),
                       ("state size", size_text(self.state_bytes)),
                       ("watermark", watermark_text(self.watermark))]
        fields.append(("output", self.output))
        return "\n".join([f"attribution {self.mode} run ({self.backend}) {ending} in "
                          f"{self.seconds:.1f}s over {self.batches} batch(es)"]
                         + [f"  {label:<{_LABEL_WIDTH}}: {value}" for label, value in fields])


class MicroBatchProgress:
    """Follows a query's progress updates: each micro-batch that ran, once, in batch order.

    A subclass says what a micro-batch is: ``_account`` turns its progress update into a
    record (a JSON-ready dict), ``line`` turns the record into the progress line (``None``: no
    line), and ``_after`` may warn once the line is out.

    :param quiet: keep the records, print no line.
    :param stream: where the lines go (default: the ``sys.stderr`` of the moment, so that a
        redirected or captured stderr sees them).
    :param json_lines: a file that gets one JSON line per micro-batch, appended as the batch
        is taken, for a metrics collector (``--progress-json``); ``None``: no file.
    """

    def __init__(self, quiet: bool = False, stream: Optional[TextIO] = None,
                 json_lines: Optional[str] = None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.json_lines = Path(json_lines) if json_lines else None
        self.seen: set[int] = set()
        self.history: list[dict] = []

    def consume(self, progresses: Iterable) -> None:
        """Take the micro-batches of ``progresses`` (``query.recentProgress``) not taken yet.

        :param progresses: ``StreamingQueryProgress`` objects (or their JSON dicts).
        """
        for p in progresses:
            batch = p["batchId"] if isinstance(p, dict) else p.batchId
            if batch in self.seen or not micro_batch_ran(p):
                continue
            self.seen.add(batch)
            record = self._account(p)
            self.history.append(record)
            if self.json_lines is not None:
                with open(self.json_lines, "a") as out:
                    out.write(json.dumps(record, default=str) + "\n")
            line = self.line(record)
            if line and not self.quiet:
                print(line, file=self.stream, flush=True)
            self._after(p)

    def _account(self, p) -> dict:
        raise NotImplementedError(type(self))

    def line(self, record: dict) -> Optional[str]:
        """The progress line of a micro-batch's record (``_account``'s).

        :param record: the micro-batch's record.
        """
        return None

    def _after(self, p) -> None:
        """Called once a micro-batch's line is out (warnings that follow it)."""


class BatchProgress(MicroBatchProgress):
    """The attribution job's progress: one stderr line per new micro-batch, and totals.

    :param metrics_name: the observed metrics of the output (per model goals and attributed,
        users_change).
    :param models: the models of the run, whose metrics are read.
    :param quiet: keep the totals, print nothing.
    :param stream: where the lines go.
    :param users_at_start: for layouts that report users by change
        (``pipeline.users_counted_by_change``), the users held when the run started (from
        ``checkpoint.state_users_at_start``); the count then follows the reported changes.
        ``None`` takes Spark's state row count as the user count.
    :param users_by_change: the layout reports users by change; with ``users_at_start``
        unknown (``None``), the user count is then unknown too.
    :param json_lines: a file that gets each micro-batch's record as a JSON line.
    """

    def __init__(self, metrics_name: str, models: Sequence[str] = DEFAULT_MODELS,
                 quiet: bool = False, stream: Optional[TextIO] = None,
                 users_at_start: Optional[int] = None, users_by_change: bool = False,
                 json_lines: Optional[str] = None):
        super().__init__(quiet=quiet, stream=stream, json_lines=json_lines)
        self.metrics_name = metrics_name
        self.models = tuple(models)
        self.users_by_change = users_by_change
        self.totals = {"input": 0, "late": 0, "goals": 0, "millis": 0,
                       "attributed": dict.fromkeys(self.models, 0)}
        self.state_rows: Optional[int] = None
        self.users_in_state: Optional[int] = users_at_start
        self.state_bytes: Optional[int] = None
        self.watermark: Optional[str] = None

    def _account(self, p) -> dict:
        ops = p.stateOperators or []
        late = sum(op.numRowsDroppedByWatermark for op in ops)
        state_rows = sum(op.numRowsTotal for op in ops) if ops else None
        sizes = [(op.customMetrics or {}).get("rocksdbSstFileSize") for op in ops]
        state_bytes = sum(sizes) if sizes and None not in sizes else None
        observed = (p.observedMetrics or {}).get(self.metrics_name)
        by_model = {m: observed[metric_name("attributed", m)] if observed is not None else 0
                    for m in self.models}
        # Every model gives rows for every goal: any model's count is the goals'.
        goals = observed[metric_name("goals", self.models[0])] if observed is not None else 0
        attributed = by_model[self.models[0]]
        if not self.users_by_change:
            self.users_in_state = state_rows
        elif self.users_in_state is not None and observed is not None:
            self.users_in_state += observed["users_change"]
        watermark = (p.eventTime or {}).get("watermark")
        millis = (p.durationMs or {}).get("triggerExecution", 0)
        t = self.totals
        t["input"] += p.numInputRows
        t["late"] += late
        t["goals"] += goals
        for m, n in by_model.items():
            t["attributed"][m] += n
        t["millis"] += millis
        self.state_rows, self.state_bytes, self.watermark = state_rows, state_bytes, watermark
        return {"batch": p.batchId, "input": p.numInputRows, "duration_ms": millis,
                "input_rate": p.inputRowsPerSecond, "processed_rate": p.processedRowsPerSecond,
                "late": late, "goals": goals, "attributed": attributed,
                "attributed_by_model": by_model, "state_rows": state_rows,
                "users_in_state": self.users_in_state, "state_bytes": state_bytes,
                "watermark": watermark}

    def line(self, record: dict) -> str:
        """The progress line of one micro-batch.

        :param record: one micro-batch's record, as ``_record`` made it.
        """
        goals, attributed = record["goals"], record["attributed"]
        if len(self.models) > 1:
            credited = f"attributed per model: {per_model(record['attributed_by_model'])}"
        else:
            credited = f"attributed {attributed}, organic {goals - attributed}"
        return (f"batch {record['batch']}: input {record['input']} rows in "
                f"{record['duration_ms'] / 1000:.1f} s (input {rate_text(record['input_rate'])}, "
                f"processed {rate_text(record['processed_rate'])}), late dropped "
                f"{record['late']}, goals {goals} ({credited}), users in state "
                f"{_count(record['users_in_state'])}, state size "
                f"{size_text(record['state_bytes'])}, watermark "
                f"{watermark_text(record['watermark'])}")

    def report(self, **fields) -> RunReport:
        """The run's ``RunReport``: the totals over the micro-batches seen, and ``fields``.

        :param fields: the ``RunReport`` fields the totals do not give (mode, stop, ...).
        """
        t = self.totals
        return RunReport(input_rows=t["input"], late_rows=t["late"], goals=t["goals"],
                         attributed=t["attributed"][self.models[0]],
                         attributed_by_model=dict(t["attributed"]), batches=len(self.seen),
                         seconds=t["millis"] / 1000, state_rows=self.state_rows,
                         users_in_state=self.users_in_state, state_bytes=self.state_bytes,
                         watermark=self.watermark, history=list(self.history), **fields)
