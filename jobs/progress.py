"""Per-micro-batch progress lines and the final run report of a streaming job.

Everything is read from Spark's own ``StreamingQueryProgress``: input rows, late rows dropped by
the stateful operator (``numRowsDroppedByWatermark``), state rows, the watermark, and the
observed metrics the pipeline attaches to its output (goals and attributed goals per model,
``attribution.spark.pipeline.output_metrics``).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional, Sequence, TextIO

from attribution.config import DEFAULT_MODELS
from attribution.spark.pipeline import metric_name


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
    state_rows: Optional[int] = None
    watermark: Optional[str] = None
    extra: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # one dict per micro-batch

    @property
    def organic(self) -> int:
        return self.goals - self.attributed

    def as_dict(self) -> dict:
        return {**asdict(self), "organic": self.organic}

    def render(self) -> str:
        lines = [
            f"attribution {self.mode} run ({self.backend}) finished in {self.seconds:.1f}s "
            f"over {self.batches} batch(es)",
            f"  input events : {self.input_rows}",
            f"  late dropped : {self.late_rows}",
            f"  goals        : {self.goals}",
        ]
        if len(self.attributed_by_model) > 1:
            lines += [f"  attributed   : {per_model(self.attributed_by_model)}",
                      "  organic      : " + per_model({m: self.goals - a for m, a
                                                       in self.attributed_by_model.items()})]
        else:
            lines += [f"  attributed   : {self.attributed}", f"  organic      : {self.organic}"]
        lines += [f"  {k:<13}: {v}" for k, v in self.extra.items()]
        if self.state_rows is not None:
            lines.append(f"  state rows   : {self.state_rows}")
        if self.watermark:
            lines.append(f"  watermark    : {self.watermark}")
        lines.append(f"  output       : {self.output}")
        return "\n".join(lines)


def per_model(counts: Mapping[str, int]) -> str:
    """``last_touch 80, linear 78``: a count per model."""
    return ", ".join(f"{m} {n}" for m, n in counts.items())


class BatchProgress:
    """Turns ``query.recentProgress`` into one stderr line per new micro-batch, and totals.

    :param metrics_name: the name of the observed metrics on the output.
    :param models: the models of the run, whose metrics are read.
    """

    def __init__(self, metrics_name: str, models: Sequence[str] = DEFAULT_MODELS,
                 quiet: bool = False, stream: TextIO = sys.stderr):
        self.metrics_name = metrics_name
        self.models = tuple(models)
        self.quiet = quiet
        self.stream = stream
        self.seen: set[int] = set()
        self.totals = {"input": 0, "late": 0, "goals": 0, "millis": 0,
                       "attributed": dict.fromkeys(self.models, 0)}
        self.state_rows: Optional[int] = None
        self.watermark: Optional[str] = None
        self.history: list[dict] = []

    def consume(self, progresses: Iterable) -> None:
        for p in progresses:
            # Idle triggers report progress too, but never run addBatch; skip them.
            if p.batchId in self.seen or "addBatch" not in (p.durationMs or {}):
                continue
            self.seen.add(p.batchId)
            self._account(p)

    def _account(self, p) -> None:
        ops = p.stateOperators or []
        late = sum(op.numRowsDroppedByWatermark for op in ops)
        state_rows = sum(op.numRowsTotal for op in ops) if ops else None
        observed = (p.observedMetrics or {}).get(self.metrics_name)
        by_model = {m: observed[metric_name("attributed", m)] if observed is not None else 0
                    for m in self.models}
        # Every model gives rows for every goal: any model's count is the goals'.
        goals = observed[metric_name("goals", self.models[0])] if observed is not None else 0
        attributed = by_model[self.models[0]]
        watermark = (p.eventTime or {}).get("watermark")
        t = self.totals
        t["input"] += p.numInputRows
        t["late"] += late
        t["goals"] += goals
        for m, n in by_model.items():
            t["attributed"][m] += n
        t["millis"] += (p.durationMs or {}).get("triggerExecution", 0)
        self.state_rows, self.watermark = state_rows, watermark
        self.history.append({"batch": p.batchId, "input": p.numInputRows, "late": late,
                             "goals": goals, "attributed": attributed,
                             "attributed_by_model": by_model,
                             "state_rows": state_rows, "watermark": watermark})
        if not self.quiet:
            if len(self.models) > 1:
                credited = f"to an impression per model: {per_model(by_model)}"
            else:
                credited = f"{attributed} to an impression, {goals - attributed} organic"
            print(f"batch {p.batchId}: input {p.numInputRows} rows, late dropped {late}, "
                  f"goals attributed {goals} ({credited}), state rows {state_rows}, "
                  f"watermark {watermark}", file=self.stream, flush=True)

    def report(self, **fields) -> RunReport:
        t = self.totals
        return RunReport(input_rows=t["input"], late_rows=t["late"], goals=t["goals"],
                         attributed=t["attributed"][self.models[0]],
                         attributed_by_model=dict(t["attributed"]), batches=len(self.seen),
                         seconds=t["millis"] / 1000, state_rows=self.state_rows,
                         watermark=self.watermark, history=list(self.history), **fields)
