"""The streaming benchmark harness's own arithmetic and command line (``benchmarks/streaming``),
without Spark: the cost model's least-squares fit and its prediction, the state-scaling check
and the state bytes per event, CPU read between samples, the batch sizes it parses, the
sustainable mode's bisection of rates and its percentiles, the interleaved run order, the
plateau verdict, and the option values it refuses with argparse's usage error (exit code 2).

The harness itself, run end to end on Spark, is ``tests/system/test_benchmark.py``.
"""
from __future__ import annotations

import statistics

import pytest

from benchmarks.streaming.cli import parse_args
from benchmarks.streaming.cost_model import (
    SCALING_LIMIT,
    fit,
    parse_batch_sizes,
    predict,
    scaling_check,
    sst_bytes_per_event,
)
from benchmarks.streaming.modes import interleaved
from benchmarks.streaming.report import plateau_verdict
from benchmarks.streaming.sampling import cpu_between
from benchmarks.streaming.sustainable import bisect_rates, percentile


def test_cost_model_fit_recovers_known_coefficients():
    points = [{"events": e, "state_mb": s, "seconds": 0.5 + 0.002 * e + 0.1 * s,
               "cpu_seconds": None}
              for e in (100, 200, 400) for s in (1.0, 2.5, 7.0)]
    model = fit(points, "seconds")
    assert (model["a"], model["b"], model["c"]) == pytest.approx((0.5, 0.002, 0.1))
    assert model["r2"] == pytest.approx(1.0) and model["rms_residual"] == pytest.approx(0, abs=1e-9)
    assert all(p["seconds_residual"] == pytest.approx(0, abs=1e-9) for p in points)
    # Points without the target are left out of its fit.
    assert fit(points + [{"events": 1, "state_mb": 1, "seconds": None}], "seconds")["points"] == 9
    # A coefficient below zero counts as zero in a prediction.
    assert predict({"a": 1.0, "b": -0.5, "c": 0.25}, 1_000, 4) == pytest.approx(2.0)


def test_cost_model_scaling_check_and_state_per_event():
    # Micro-batches 2..12 of 100 events; each costs 1 s plus 0.1 s per 100 events read.
    points = [{"batch": k, "events": 100, "events_read": 100 * k, "seconds": 1 + 0.1 * k,
               "cpu_seconds": 2 * (1 + 0.1 * k), "sst_mb": 0.01 * k, "state_rows": 10 * k}
              for k in range(2, 13)]
    check = scaling_check(points, 12)
    # n = 3: micro-batches 2..3 against 2..12, times 4.
    assert check["n"] == 3 and check["first_batches"] == [2, 3]
    assert check["ratio"] == pytest.approx(4 * 1.7 / 1.25)
    assert check["cpu_ratio"] == pytest.approx(check["ratio"])
    assert check["within"] == (check["ratio"] <= SCALING_LIMIT)
    assert check["events_read_ratio"] == 4 and check["sst_ratio"] == pytest.approx(4)
    # A micro-batch left out (it overlapped another query) is left out of both means.
    check = scaling_check(points[1:], 12)
    assert check["first_batches"] == [3] and check["ratio"] == pytest.approx(
        4 * statistics.fmean(1 + 0.1 * k for k in range(3, 13)) / 1.3)
    assert scaling_check(points[2:], 12) is None    # nothing left of the first quarter
    # SST bytes proportional to the events read: exactly that many bytes per event.
    batches = [{"input_rows": 50, "sst_bytes": 30 * 50 * k} for k in range(1, 6)]
    assert sst_bytes_per_event(batches) == pytest.approx(30)


def test_cpu_between_interpolates_the_samples():
    timeline = [(10.0, 0.0), (11.0, 2.0), (13.0, 3.0)]
    assert cpu_between(timeline, 10.5, 12.0) == pytest.approx(2.5 - 1.0)
    assert cpu_between(timeline, 11.0, 13.0) == pytest.approx(1.0)
    assert cpu_between(timeline, 9.0, 12.0) is None     # before the first sample
    assert cpu_between([], 1.0, 2.0) is None


def test_cost_model_batch_sizes():
    assert parse_batch_sizes("5000, 2500,5000") == [2500, 5000]
    for bad, message in (("2500", "has one size"), ("2500,x", "bad size 'x'"),
                         ("0,10", "bad size '0'")):
        with pytest.raises(ValueError, match=message):
            parse_batch_sizes(bad)


def test_bisection_probes_the_bounds_then_geometric_means():
    def search(limit, probes=6):
        seen = []

        def sustainable(rate):
            seen.append(rate)
            return rate <= limit
        return bisect_rates(1_000, 100_000, probes, sustainable), seen

    # Between 1,000 and 100,000: then sqrt(1,000 x 100,000), and so on between pass and fail.
    assert search(30_000) == ((23_714, 31_623), [1_000, 100_000, 10_000, 31_623, 17_783, 23_714])
    assert search(500) == ((None, 1_000), [1_000])           # the lower bound fails: stop
    assert search(10**6) == ((100_000, None), [1_000, 100_000])  # the upper bound holds: stop
    assert search(30_000, probes=2) == ((1_000, 100_000), [1_000, 100_000])


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0


def test_interleaving_rotates_the_order_each_repeat():
    plan = interleaved(["a", "b", "c"], 3)
    assert plan == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                    (2, "c"), (2, "a"), (2, "b")]


def test_plateau_verdict():
    assert plateau_verdict([5, 50, 100, 100, 102, 99, 101, 100, 98, 3]).startswith("plateau")
    assert plateau_verdict([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]).startswith("grows")
    assert plateau_verdict([1, 2]) == "too few batches to tell"


# Option values the harness refuses as it parses its command line, and words of the usage
# error each one gets. (``python -m benchmarks.streaming --help``, the real command, is run in
# tests/system/test_benchmark.py.)
BAD_ARGUMENTS = {
    "unknown kind": (["--runs", "native,fast"], ["unknown kind(s) fast"]),
    "no events": (["--events", "0"], ["--events must be at least 1"]),
    "trigger without unit": (["--sustainable-trigger", "10"],
                             ["--sustainable-trigger: '10' has no unit"]),
    "unparseable lateness": (["--allowed-lateness", "0,soon"], ["--allowed-lateness", "soon"]),
    "cost batches": (["--cost-batches", "10"], ["--cost-batches must be a multiple of 4"]),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_a_bad_argument_is_a_usage_error_with_exit_code_2(case, capsys):
    argv, words = BAD_ARGUMENTS[case]
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    for word in words:
        assert word in stderr, (word, stderr)
