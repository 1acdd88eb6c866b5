"""``make run``: the main job end to end on a small built-in example.

Generates a reproducible, out-of-order example (a few hundred users, bounded disorder below the
watermark delay, a trailing heartbeat), streams it through ``jobs/attribution_job.py`` with
``available-now`` and one file per micro-batch, prints the job's report, and checks the output
against the batch oracle's truth file. ``jobs/example_kafka.py`` (``make run-kafka``) runs the
same example through Kafka topics with the pieces shared here.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Iterable

from attribution.oracle import sort_key
from attribution.rows import Attribution
from attribution.spark.output import read_attribution_rows
from generators.dataset import GenerationResult, generate
from generators.params import GeneratorParams
from generators.truth import read_truth
from jobs import attribution_job

EXAMPLE_FILES = 12  # the example's event files: one micro-batch each, and the heartbeat's


def positive_int(text: str) -> int:
    """``text`` as a whole number of at least 1, for ``argparse`` (its error names the value).

    :param text: the option's value as given.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def example_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The options every example takes: its working directory, the users, the files, the
    backend.

    :param description: the example's ``--help`` text (its module docstring).
    :param default_out: the default working directory.
    """
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=default_out,
                        help="working directory, emptied first (default: %(default)s)")
    parser.add_argument("--users", type=int, default=300,
                        help="users to generate (default: %(default)s)")
    parser.add_argument("--files", type=positive_int, default=EXAMPLE_FILES,
                        help="event files to generate, streamed one per micro-batch; fewer "
                             "make a quicker run of fewer micro-batches (default: %(default)s)")
    parser.add_argument("--backend", default=None,
                        help="stateful backend (default: the job's default)")
    return parser


def generate_example(users: int, out: Path, truth: bool = True,
                     files: int = EXAMPLE_FILES) -> GenerationResult:
    """Generate the example's dataset (no pictures) under ``out``: bounded disorder below the
    job's watermark delay, a few redeliveries and a trailing heartbeat, so that, read one file
    per micro-batch, no record is late and the streamed output must equal the batch oracle's.

    :param users: users to generate.
    :param out: the dataset's directory.
    :param truth: also write the batch oracle's truth file.
    :param files: event files to generate (the heartbeat's comes on top).
    """
    params = GeneratorParams(users=users, seed=7, files=files, heartbeat=True,
                             disorder="bounded", max_delay="2 minutes", redelivery_rate=0.02)
    print(f"generating {users} users of out-of-order events into {out} ...", file=sys.stderr)
    return generate(params, out, truth=truth, plot=False)


def matches_oracle(produced: Iterable[Attribution], expected: Iterable[Attribution],
                   source: str) -> bool:
    """Compare the job's rows with the batch oracle's, in canonical order, and print the
    verdict.

    :param produced: the rows the job wrote.
    :param expected: the oracle's rows for the job's models.
    :param source: where the oracle's rows come from, as the verdict line says it.
    """
    produced = sorted(produced, key=sort_key)
    expected = sorted(expected, key=sort_key)
    same = produced == expected
    print(f"  matches batch oracle: {'yes' if same else 'NO'} "
          f"({len(produced)} rows vs {len(expected)} {source})")
    return same


def main(argv=None) -> int:
    """Run the job on a generated example and check it against the batch oracle.

    :param argv: the arguments (default: the command line).
    :returns: the job's exit code, or 1 when its output differs from the oracle's.
    """
    parser = example_parser(__doc__, "out/example")
    parser.add_argument("--progress-json", metavar="FILE", default=None,
                        help="also write the job's progress as JSON lines to FILE")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    dataset = generate_example(args.users, out / "data", files=args.files)

    job_args = ["--events", str(dataset.events_dir), "--output", str(out / "attributions"),
                "--checkpoint", str(out / "checkpoint"), "--max-files-per-trigger", "1"]
    if args.backend:
        job_args += ["--backend", args.backend]
    if args.progress_json:
        job_args += ["--progress-json", args.progress_json]
    status = attribution_job.main(job_args)

    same = matches_oracle(read_attribution_rows(out / "attributions"),
                          read_truth(dataset.truth_path),  # the job's models
                          f"in {dataset.truth_path}")
    return status if same else 1


if __name__ == "__main__":
    sys.exit(main())
