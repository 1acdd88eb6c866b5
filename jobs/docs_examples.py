"""``make docs-examples``: run the documented examples on the current code and write what they
print into the docs, so that the docs quote what the code gives.

Each quoted output sits in a Markdown file between two HTML comments, which the rendered page
does not show::

    <!-- example-output: NAME -->
        (the indented block this module writes)
    <!-- /example-output -->

The blocks (``BLOCKS``) come from one run of ``make run``'s example (``jobs.example``, with
``--progress-json``) into ``out/example`` and of the report on its output (``jobs.report``):

* ``make-run-report`` (README.md): the job's final report and the oracle comparison, with the
  figures that differ from run to run (durations, rates, state size, the log) as ``...``;
* ``progress-lines`` and ``progress-json`` (docs/attribution-job.md): the first two progress
  lines (durations and rates as ``...``) and the JSON line of the second micro-batch, as
  measured;
* ``report-run`` (docs/reading-output.md): what the report prints.

``tests/unit/test_docs_examples.py`` holds the blocks to the figures the example's generator and
the batch oracle fix without Spark (input rows, goals, attributed and organic goals, days), and
to this module's markers.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
OUT = Path("out/example")  # relative to ROOT, as `make run` writes it
BEGIN = "<!-- example-output: {name} -->"
END = "<!-- /example-output -->"
# Report lines whose values differ from run to run; written as "...".
_VARYING_REPORT_LINES = ("processed", "state keys", "late records", "dead letter",
                         "users in state", "state size", "watermark", "output")


def _report_block(captured: dict) -> list[str]:
    """The job's report and the oracle line: the header's duration as ``...``, the lines up to
    ``invalid`` (run-independent but ``processed``), then ``...`` for the rest."""
    lines, shown = [], False
    for line in captured["example_stdout"].splitlines():
        if line.startswith("attribution stream run"):
            lines.append(re.sub(r"finished in [\d.]+s", "finished in ...", line))
            continue
        name = line.strip().split(":")[0].strip()
        if line.strip().startswith("matches batch oracle"):
            lines.append(line)
        elif name in _VARYING_REPORT_LINES:
            if name == "processed":
                lines.append(line.split(":")[0] + ": ...")
            elif not shown:
                lines.append("  ...")
                shown = True
        elif line.strip():
            lines.append(line)
    return lines


def _progress_lines(captured: dict) -> list[str]:
    """The first two progress lines, their duration and rates as ``...`` (they measure the
    machine, not the code)."""
    lines = [line for line in captured["example_stderr"].splitlines()
             if line.startswith("batch ")][:2]
    return [re.sub(r" rows in [\d.]+ s \(input [\d.]+ rows/s, processed [\d.]+ rows/s\)",
                   " rows in ... s (input ... rows/s, processed ... rows/s)", line)
            for line in lines]


def _progress_json(captured: dict) -> list[str]:
    return captured["progress_json"].splitlines()[1:2]


def _report_run(captured: dict) -> list[str]:
    return captured["report_stdout"].splitlines()


# name -> (the Markdown file, relative to the repository, and how its block is drawn)
BLOCKS: dict[str, tuple[str, Callable[[dict], list[str]]]] = {
    "make-run-report": ("README.md", _report_block),
    "progress-lines": ("docs/attribution-job.md", _progress_lines),
    "progress-json": ("docs/attribution-job.md", _progress_json),
    "report-run": ("docs/reading-output.md", _report_run),
}


def block_pattern(name: str) -> re.Pattern:
    """The block ``name`` in a Markdown text, its body as group 1."""
    return re.compile(re.escape(BEGIN.format(name=name)) + r"\n(.*?)" + re.escape(END),
                      re.DOTALL)


def block_lines(text: str, name: str) -> list[str]:
    """The lines of block ``name`` in ``text`` (a Markdown file), unindented.

    :raises ValueError: ``text`` has no such block.
    """
    match = block_pattern(name).search(text)
    if match is None:
        raise ValueError(f"no block {name!r} ({BEGIN.format(name=name)} ... {END})")
    return [line[4:] for line in match[1].splitlines() if line.strip()]


def with_block(text: str, name: str, lines: list[str]) -> str:
    """``text`` with block ``name`` holding ``lines``, as an indented code block.

    :raises ValueError: ``text`` has no such block.
    """
    block_lines(text, name)  # raises when absent
    body = "\n" + "".join(f"    {line}\n" for line in lines) + "\n"
    return block_pattern(name).sub(lambda _: BEGIN.format(name=name) + "\n" + body + END, text,
                                   count=1)


def run_examples(root: Path = ROOT) -> dict:
    """Run ``make run``'s example and the report on its output; what they printed.

    :param root: the repository, where ``out/example`` is written.
    """
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    progress = OUT / "progress.jsonl"
    example = subprocess.run(
        [sys.executable, "-m", "jobs.example", "--out", str(OUT), "--progress-json",
         str(progress)], cwd=root, env=env, capture_output=True, text=True, check=False)
    if example.returncode != 0:
        raise RuntimeError(f"the example failed ({example.returncode}):\n{example.stderr}")
    report = subprocess.run(
        [sys.executable, "-m", "jobs.report", "--attributions", str(OUT / "attributions"),
         "--out", str(OUT / "report")], cwd=root, env=env, capture_output=True, text=True,
        check=False)
    if report.returncode != 0:
        raise RuntimeError(f"the report failed ({report.returncode}):\n{report.stderr}")
    return {"example_stdout": example.stdout, "example_stderr": example.stderr,
            "progress_json": (root / progress).read_text(), "report_stdout": report.stdout}


def main(argv=None) -> int:
    """Redraw every block of ``BLOCKS`` from a run of the examples.

    :param argv: the arguments (default: the command line).
    """
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    captured = run_examples()
    for json_line in _progress_json(captured):
        json.loads(json_line)  # a JSON line, or the run printed something else
    files: dict[str, str] = {}
    for name, (doc, draw) in BLOCKS.items():
        text = files.get(doc) or (ROOT / doc).read_text()
        files[doc] = with_block(text, name, draw(captured))
    for doc, text in files.items():
        (ROOT / doc).write_text(text)
        print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
