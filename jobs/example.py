"""``make run``: the main job end to end on a small built-in example.

Generates a reproducible, out-of-order example (a few hundred users, bounded disorder below the
watermark delay, a trailing heartbeat), streams it through ``jobs/attribution_job.py`` with
``available-now`` and one file per micro-batch, prints the job's report, and checks the output
against the batch oracle's truth file.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from attribution.oracle import sort_key
from attribution.spark.output import read_attribution_rows
from generators.dataset import generate
from generators.params import GeneratorParams
from generators.truth import read_truth
from jobs import attribution_job


def main(argv=None) -> int:
    """Run the job on a generated example and check it against the batch oracle.

    :param argv: the arguments (default: the command line).
    :returns: the job's exit code, or 1 when its output differs from the oracle's.
    """
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/example",
                        help="working directory (default: %(default)s)")
    parser.add_argument("--users", type=int, default=300,
                        help="users to generate (default: %(default)s)")
    parser.add_argument("--backend", default=None,
                        help="stateful backend (default: the job's default)")
    args = parser.parse_args(argv)

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    params = GeneratorParams(users=args.users, seed=7, files=12, heartbeat=True,
                             disorder="bounded", max_delay="2 minutes", redelivery_rate=0.02)
    print(f"generating {args.users} users of out-of-order events into {out / 'data'} ...",
          file=sys.stderr)
    dataset = generate(params, out / "data", plot=False)

    job_args = ["--events", str(dataset.events_dir), "--output", str(out / "attributions"),
                "--checkpoint", str(out / "checkpoint"), "--max-files-per-trigger", "1"]
    if args.backend:
        job_args += ["--backend", args.backend]
    status = attribution_job.main(job_args)

    produced = sorted(read_attribution_rows(out / "attributions"), key=sort_key)
    truth = sorted(read_truth(dataset.truth_path), key=sort_key)  # the job's models
    same = produced == truth
    print(f"  matches batch oracle: {'yes' if same else 'NO'} "
          f"({len(produced)} rows vs {len(truth)} in {dataset.truth_path})")
    return status if same else 1


if __name__ == "__main__":
    sys.exit(main())
