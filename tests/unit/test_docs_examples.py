"""The example outputs the docs quote (``make docs-examples``, ``jobs.docs_examples``) hold the
figures the current code gives: those fixed by ``make run``'s dataset and the batch oracle
(input rows, goals, attributed and organic goals, the days of the goals, each micro-batch's
input), computed here without Spark."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from jobs import docs_examples
from jobs.example import generate_example
from support import ROOT


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """``make run``'s dataset, generated as the example generates it, with the oracle's rows."""
    result = generate_example(300, tmp_path_factory.mktemp("example") / "data")
    files = sorted(result.event_files)  # numbered in arrival order, one per micro-batch
    per_file = [sum(1 for line in f.read_text().splitlines() if line.strip()) for f in files]
    truth = result.truth.filter(pc.equal(result.truth["model"], "last_touch"))  # the default
    days = pc.min_max(truth["goal_ts"].cast(pa.timestamp("us", tz="UTC")))
    return {"per_file": per_file, "goals": truth.num_rows,
            "attributed": truth.num_rows - truth["impression_id"].null_count,
            "first_day": days["min"].as_py().date().isoformat(),
            "last_day": days["max"].as_py().date().isoformat()}


def _block(name: str) -> list[str]:
    doc, _ = docs_examples.BLOCKS[name]
    return docs_examples.block_lines((ROOT / doc).read_text(), name)


def _figure(lines: list[str], name: str) -> int:
    (value,) = [int(m[1]) for line in lines if (m := re.match(rf"\s*{name}\s*: (\d+)$", line))]
    return value


def test_the_make_run_report_in_the_readme_has_the_example_figures(example):
    lines = _block("make-run-report")
    goals, attributed = example["goals"], example["attributed"]
    assert _figure(lines, "input rows") == sum(example["per_file"])
    assert _figure(lines, "late dropped") == 0
    assert (_figure(lines, "goals"), _figure(lines, "attributed"),
            _figure(lines, "organic")) == (goals, attributed, goals - attributed)
    assert f"matches batch oracle: yes ({goals} rows vs {goals} in " in lines[-1]


def test_the_report_run_in_reading_output_has_the_example_figures(example):
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
             for line in _block("report-run") if ":" in line}
    goals = example["goals"]
    assert lines["source"].startswith("out/example/attributions (")
    assert lines["rows"] == (f"{goals} committed, {goals} after folding the changelog, "
                             f"{goals} selected")
    assert lines["goals"].startswith(f"{goals}, models last_touch, goal times "
                                     f"{example['first_day']} ")
    assert f" to {example['last_day']} " in lines["goals"]
    attributed = example["attributed"]
    assert lines["totals last_touch"].startswith(
        f"{goals} goals ({attributed} attributed, {goals - attributed} organic)")



def test_the_progress_examples_read_the_example_files_one_per_micro_batch(example):
    lines = _block("progress-lines")
    assert [line.split(" rows in ")[0] for line in lines] == [
        f"batch {n}: input {rows}" for n, rows in enumerate(example["per_file"][:2])]
    (json_line,) = _block("progress-json")
    record = json.loads(json_line)
    assert (record["batch"], record["input"]) == (1, example["per_file"][1])
    assert f"goals {record['goals']} (attributed {record['attributed']}," in lines[1]


def test_a_block_is_replaced_whole_and_found_again():
    text = "intro\n\n" + docs_examples.BEGIN.format(name="x") + "\n\n    old\n\n" + \
        docs_examples.END + "\ntail\n"
    redrawn = docs_examples.with_block(text, "x", ["new 1", "new 2"])
    assert docs_examples.block_lines(redrawn, "x") == ["new 1", "new 2"]
    assert redrawn.startswith("intro\n") and redrawn.endswith(docs_examples.END + "\ntail\n")
    with pytest.raises(ValueError, match="no block 'y'"):
        docs_examples.with_block(text, "y", [])


def test_every_command_of_the_jobs_help_examples_is_one_shell_command():
    """A command continued on the next line ends with a backslash; the help names no file the
    repository lacks."""
    from jobs.attribution_job import DESCRIPTION, EXAMPLES

    lines = EXAMPLES.splitlines()
    for line, following in zip(lines, lines[1:]):
        if following.startswith("      --"):
            assert line.endswith(" \\"), line
    for doc in re.findall(r"docs/[\w.-]+\.md", DESCRIPTION + EXAMPLES):
        assert (ROOT / doc).is_file(), doc
    assert "README's event schema" not in DESCRIPTION
