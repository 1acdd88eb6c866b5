"""The README's commands as a new user types them: every indented command block, in the order
printed, in one shell, in a copy of the repository (its files as git tracks them, with this
checkout's `.venv/` and fetched jars), so that the blocks' outputs and checkpoints start empty.

A block the README marks ``<!-- readme-test: skip, WHY -->`` on the line before it is not run
(the test commands themselves, the benchmarks, the layout listing); a block between
``<!-- example-output: NAME -->`` markers is output, not commands, and is checked against what
the command before it printed. Each block must end with exit code 0; a failing command is named
with its exit code. The environment is a user's: no suite JVM settings beyond the JIT's first
tier, no Python paths of the suite's.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import docs_examples
from support import ROOT
from support.commands import assert_no_traceback, suite_jvm_options_without_spark_settings

README = ROOT / "README.md"
SKIP = re.compile(r"<!-- readme-test: skip, (.+?) -->")
EXAMPLE_OUTPUT = re.compile(r"<!-- (/?)example-output")
WAIT_SECONDS = 2400  # every block of the README on a loaded 2-core machine


def command_blocks(text: str) -> list[tuple[int, str]]:
    """The README's indented command blocks, in order, as (first line number, the block's
    text unindented); fenced code, example output and blocks marked to skip left out.

    A block starts with a line indented by four spaces after a blank line, and runs on over
    indented and blank lines; the last line of text before it may mark it to skip.

    :param text: the README.
    """
    blocks, current = [], None  # current: (first line number, lines, skipped)
    fenced = in_example = False
    before = ""  # the last line of text before the current line
    previous_blank = True
    for number, line in enumerate(text.splitlines() + [""], 1):
        if current is not None and (line.startswith("    ") or not line.strip()):
            current[1].append(line[4:])
            continue
        if current is not None:
            if not current[2]:
                blocks.append((current[0], "\n".join(current[1]).strip("\n")))
            current = None
        if line.startswith("```"):
            fenced = not fenced
        marker = EXAMPLE_OUTPUT.match(line.strip())
        if marker:
            in_example = not marker.group(1)
        if line.startswith("    ") and previous_blank and not (fenced or in_example):
            current = (number, [line[4:]], bool(SKIP.search(before)))
            continue
        previous_blank = not line.strip()
        if line.strip():
            before = line
    return blocks


def test_the_blocks_run_are_the_readmes_commands_and_the_marked_ones_are_left_out():
    text = README.read_text()
    blocks = command_blocks(text)
    firsts = [block.splitlines()[0] for _, block in blocks]
    assert firsts[0].startswith("make run")
    assert any(first.startswith(". .venv/bin/activate") for first in firsts)
    assert any(block.lstrip().startswith("spark-submit jobs/attribution_job.py")
               or "\nspark-submit jobs/attribution_job.py" in block for _, block in blocks)
    assert not any(first.startswith(("make test", "attribution/")) for first in firsts)
    assert len(SKIP.findall(text)) >= 3  # the tests, the benchmarks, the layout


def _copy_of_the_repository(target: Path) -> None:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)  # times kept: make sees the set-up as done
    for made in (".venv", "build"):
        (target / made).symlink_to(ROOT / made)


def _user_environment() -> dict:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYSPARK_", "PYTEST", "VIRTUAL_ENV"))
           and key not in ("PYTHONPATH", "SPARK_CONF_DIR", "SPARK_HOME")}
    env["SPARK_SUBMIT_OPTS"] = suite_jvm_options_without_spark_settings()
    return env


def _script(blocks: list[tuple[int, str]], log_dir: Path) -> str:
    """One bash script: each block in its own step, its output in its own file, ending the
    script at the first failing command with that command and its exit code."""
    steps = ["set -eE -o pipefail",
             "trap 'echo \"failed with exit code $?: $BASH_COMMAND\" >&2' ERR"]
    for index, (line, block) in enumerate(blocks):
        log = log_dir / f"block-{index:02d}.log"
        steps.append(f"echo 'README line {line}' > {log}")
        steps.append(f"{{\n{block}\n}} >> {log} 2>&1")
    return "\n".join(steps) + "\n"


# The second tier: every README command, some minutes of Spark and Kafka.
@pytest.mark.slow
def test_the_readme_commands_run_as_printed_in_order(tmp_path):
    text = README.read_text()
    blocks = command_blocks(text)
    repo, logs = tmp_path / "repo", tmp_path / "logs"
    repo.mkdir()
    logs.mkdir()
    _copy_of_the_repository(repo)
    script = tmp_path / "readme.sh"
    script.write_text(_script(blocks, logs))
    done = subprocess.run(["bash", str(script)], cwd=repo, env=_user_environment(),
                          capture_output=True, text=True, timeout=WAIT_SECONDS)
    outputs = [(path, path.read_text(errors="replace")) for path in sorted(logs.glob("*.log"))]
    ran = len(outputs)
    last = outputs[-1][1][-4000:] if outputs else ""
    assert done.returncode == 0 and ran == len(blocks), (
        f"block {ran} of {len(blocks)} failed: {done.stderr.strip()}\n{last}")
    for path, output in outputs:
        assert_no_traceback(output)

    with_output = "\n".join(output for _, output in outputs)
    # The make run report the README quotes, line by line ("..." stands for what varies).
    for quoted in docs_examples.block_lines(text, "make-run-report"):
        pattern = re.escape(quoted.strip()).replace(re.escape("..."), ".*")
        assert re.search(rf"^\s*{pattern}\s*$", with_output, re.M), quoted
    # Plain spark-submit wrote a Delta table; the Kafka round trip read records back.
    assert (repo / "out" / "attributions" / "_delta_log").is_dir()
    assert (repo / "out" / "attributions-all" / "_delta_log").is_dir()
    counted = re.search(r"^(\d+) records$", with_output, re.M)
    assert counted and int(counted.group(1)) > 0, with_output[-3000:]
    assert re.search(r"^stopped the broker of out/broker \(process \d+\)$", with_output, re.M)
    assert (repo / "out" / "load" / "events").is_dir()
