"""The suite's own bookkeeping (tests/timings.py): the JUnit XML read per test and per file, and
the order that starts the longest tests first on every worker."""
from __future__ import annotations

import json

import pytest

import timings

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.spark.test_a" name="test_one[x]" time="12.5"/>
<testcase classname="tests.spark.test_a" name="test_two" time="7.5"/>
<testcase classname="tests.unit.test_b" name="test_three" time="0.25">
<skipped message="no"/></testcase>
<testcase classname="tests.system.test_c" name="test_four" time="80"/>
</testsuite></testsuites>
"""


@pytest.fixture
def junit(tmp_path):
    path = tmp_path / "results.xml"
    path.write_text(JUNIT)
    return str(path)


def test_each_case_is_named_by_its_pytest_id_with_its_seconds(junit):
    assert timings.junit_seconds([junit]) == {
        "tests/spark/test_a.py::test_one[x]": 12.5, "tests/spark/test_a.py::test_two": 7.5,
        "tests/unit/test_b.py::test_three": 0.25, "tests/system/test_c.py::test_four": 80.0}


def test_the_per_file_table_sums_each_file_longest_first(junit):
    lines = timings.per_file(timings.junit_seconds([junit]))
    assert [line.split()[-1] for line in lines[:-1]] == [
        "tests/system/test_c.py", "tests/spark/test_a.py", "tests/unit/test_b.py"]
    assert lines[1].split()[:6] == ["20.0", "s", "20.0", "%", "2", "tests"]
    assert lines[-1] == "   100.2 s summed, 4 tests"


def test_record_replaces_the_durations_file(junit, tmp_path, monkeypatch, capsys):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/unit/test_gone.py::test_x": 3.0}))
    monkeypatch.setattr(timings, "DURATIONS", durations)
    assert timings.main(["record", junit]) == 0
    assert json.loads(durations.read_text()) == {
        "tests/spark/test_a.py::test_one[x]": 12.5, "tests/spark/test_a.py::test_two": 7.5,
        "tests/system/test_c.py::test_four": 80.0, "tests/unit/test_b.py::test_three": 0.2}
    assert timings.recorded_seconds() == json.loads(durations.read_text())
    assert "4 tests' seconds recorded" in capsys.readouterr().out


def test_a_missing_junit_file_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        timings.main(["per-file", str(tmp_path / "none.xml")])
    assert stop.value.code == 2
    assert f"no JUnit file {tmp_path / 'none.xml'}" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [2, 3])
def test_an_even_split_gives_each_worker_every_nth_test_longest_first(workers):
    ranked = list(range(11))  # 0 is the longest
    laid_out = timings.interleaved(ranked, workers)
    assert sorted(laid_out) == ranked
    # xdist's worksteal first sends each worker a contiguous share of what is left, divided by
    # the workers left (xdist/scheduler/worksteal.py, check_schedule)
    shares, start = [], 0
    for w in range(workers):
        size = (len(ranked) - start) // (workers - w)
        shares.append(laid_out[start:start + size])
        start += size
    firsts = sorted(share[0] for share in shares)
    assert firsts == list(range(workers))  # each worker starts on one of the longest
    for share in shares:  # and goes on with every n-th of the ranking, longest first
        assert share == list(range(share[0], len(ranked), workers))


def test_without_workers_the_ranking_is_kept():
    assert timings.interleaved([3, 2, 1], 0) == [3, 2, 1]
