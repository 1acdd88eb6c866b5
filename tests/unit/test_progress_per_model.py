"""Progress lines and the final report of a streaming run, fed stand-ins of Spark's progress."""
from __future__ import annotations

import io
from types import SimpleNamespace

from attribution.spark.pipeline import OUTPUT_METRICS, metric_name
from jobs.progress import BatchProgress


def _progress(batch: int, goals: int, attributed: dict) -> SimpleNamespace:
    metrics = {}
    for model, n in attributed.items():
        metrics[metric_name("goals", model)] = goals
        metrics[metric_name("attributed", model)] = n
    return SimpleNamespace(batchId=batch, numInputRows=10, inputRowsPerSecond=5.0,
                           processedRowsPerSecond=20.0,
                           durationMs={"addBatch": 1, "triggerExecution": 500},
                           stateOperators=[], observedMetrics={OUTPUT_METRICS: metrics},
                           eventTime={"watermark": "2024-01-01T00:00:00.000Z"})


def test_one_model_keeps_the_single_model_wording():
    out = io.StringIO()
    progress = BatchProgress(OUTPUT_METRICS, stream=out)
    progress.consume([_progress(0, 3, {"last_touch": 2}), _progress(1, 1, {"last_touch": 0})])
    assert out.getvalue().splitlines()[0].startswith(
        "batch 0: input 10 rows in 0.5 s (input 5 rows/s, processed 20 rows/s), late dropped 0, "
        "goals 3 (attributed 2, organic 1)")
    report = progress.report(mode="stream", backend="b", output="o")
    assert (report.goals, report.attributed, report.organic) == (4, 2, 2)
    assert report.attributed_by_model == {"last_touch": 2}
    assert "  attributed     : 2\n  organic        : 2" in report.render()


def test_several_models_are_counted_per_model():
    out = io.StringIO()
    models = ("last_touch", "linear")
    progress = BatchProgress(OUTPUT_METRICS, models, stream=out)
    progress.consume([_progress(0, 3, {"last_touch": 2, "linear": 1}),
                      _progress(1, 2, {"last_touch": 2, "linear": 2}),
                      _progress(1, 2, {"last_touch": 2, "linear": 2})])  # seen already
    assert "goals 3 (attributed per model: last_touch 2, linear 1)" in out.getvalue()
    report = progress.report(mode="stream", backend="b", output="o")
    assert (report.goals, report.attributed) == (5, 4)
    assert report.attributed_by_model == {"last_touch": 4, "linear": 3}
    assert report.history[1]["attributed_by_model"] == {"last_touch": 2, "linear": 2}
    text = report.render()
    assert "  attributed     : last_touch 4, linear 3" in text
    assert "  organic        : last_touch 1, linear 2" in text
