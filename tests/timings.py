"""Where the suite's time goes, from the JUnit XML files ``make test`` and ``make test-slow``
write (``build/test-results.xml``, ``build/test-results-slow.xml``).

``python tests/timings.py per-file FILE...`` prints each test file's summed seconds, its share and
its number of tests, longest first, then the total: the figures the README's Tests section quotes.
``python tests/timings.py record FILE...`` writes each test's seconds to ``tests/durations.json``
(test id -> seconds, replacing what it held), by which ``tests/conftest.py`` starts the longest
tests first (``recorded_seconds``, ``interleaved``).
"""
from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).parent / "durations.json"


def recorded_seconds() -> dict[str, float]:
    """Test id -> seconds of the recorded run (empty when there is none)."""
    try:
        return json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}


def interleaved(ranked: list, workers: int) -> list:
    """``ranked`` (longest first) laid out for ``workers`` workers so that xdist's first split
    (worksteal: contiguous shares by count, ``remaining // workers left`` each, so the last
    ``len % workers`` shares one longer) gives each worker every n-th test of the ranking,
    longest first: the ranking is dealt round the workers, the longer shares first.

    :param ranked: the tests, longest first.
    :param workers: the number of workers (below 2: ``ranked`` as it is).
    """
    if workers < 2:
        return list(ranked)
    longer = len(ranked) % workers
    deal_order = [*range(workers - longer, workers), *range(workers - longer)]
    shares: list[list] = [[] for _ in range(workers)]
    for position, item in enumerate(ranked):
        shares[deal_order[position % workers]].append(item)
    return [item for share in shares for item in share]


def junit_seconds(junit_files: list[str]) -> dict[str, float]:
    """Test id (``tests/dir/test_file.py::name[params]``, as pytest names it) -> seconds, for every
    test case of ``junit_files`` (skipped ones included, at the time they took).

    :param junit_files: paths of pytest's JUnit XML files.
    """
    seconds: dict[str, float] = {}
    for junit in junit_files:
        for case in ElementTree.parse(junit).iter("testcase"):
            module = case.get("classname", "")
            test_id = f"{module.replace('.', '/')}.py::{case.get('name')}"
            seconds[test_id] = seconds.get(test_id, 0.0) + float(case.get("time") or 0.0)
    return seconds


def per_file(seconds: dict[str, float]) -> list[str]:
    """The lines of the per-file table: summed seconds, share, tests, file; then the total.

    :param seconds: test id -> seconds (``junit_seconds``).
    """
    summed: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for test_id, s in seconds.items():
        name = test_id.split("::", 1)[0]
        summed[name] += s
        count[name] += 1
    total = sum(summed.values()) or 1.0
    lines = [f"{s:8.1f} s {100 * s / total:5.1f} % {count[name]:4d} tests  {name}"
             for name, s in sorted(summed.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines.append(f"{sum(summed.values()):8.1f} s summed, {len(seconds)} tests")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command line: ``per-file`` or ``record``, then one or more JUnit files.

    :param argv: the arguments (``sys.argv[1:]`` when ``None``).
    """
    parser = argparse.ArgumentParser(prog="tests/timings.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["per-file", "record"],
                        help="per-file: the summed seconds of each test file; record: each "
                             "test's seconds into tests/durations.json")
    parser.add_argument("junit", nargs="+", metavar="FILE", help="a JUnit XML file of pytest")
    args = parser.parse_args(argv)
    missing = [f for f in args.junit if not Path(f).is_file()]
    if missing:
        parser.error(f"no JUnit file {missing[0]} (run 'make test' first)")
    seconds = junit_seconds(args.junit)
    if args.command == "per-file":
        print("\n".join(per_file(seconds)))
        return 0
    DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())},
                                    indent=0) + "\n")
    print(f"{len(seconds)} tests' seconds recorded in {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
