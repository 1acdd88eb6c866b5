"""Rebuilds the checkpoints in this directory: run it with the version of the job whose state
layout they stand for (see README.md), never with a later one.

    PYTHONPATH=. python tests/data/legacy_checkpoints/make_fixture.py

For each state layout it streams ``events/part-00000.json`` and ``part-00001.json`` through the
attribution job (one file per micro-batch), under ``ROOT/<layout>``, then stores the checkpoint and
the committed output (dead-letter query included) as ``<layout>.tar.gz`` here. The paths inside
the checkpoint start with ``ROOT``; a test unpacks the archive and rewrites them to its own
directory before resuming.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from jobs.attribution_job import parse_args, run  # noqa: E402
from jobs.runtime import build_spark_session  # noqa: E402

ROOT = Path("/tmp/attribution-legacy-checkpoint")
LAYOUTS = {
    "applyInPandasWithState": ["--backend", "applyInPandasWithState"],
    "applyInPandasWithState-per-user": ["--backend", "applyInPandasWithState",
                                        "--state-buckets", "0"],
    "transformWithState": ["--backend", "transformWithState"],
    "transformWithState-declared": ["--backend", "transformWithState", "--tws-state", "declared"],
}
OLD_FILES = 2  # the files the old version reads; the rest arrive after the restart
MTIME = 1_600_000_000  # file n gets MTIME + n: a file stream reads them in name order


def main() -> None:
    spark = build_spark_session("legacy-fixture", master="local[2]", shuffle_partitions=2)
    files = sorted((HERE / "events").glob("part-*.json"))
    for layout, options in LAYOUTS.items():
        base = ROOT / layout
        shutil.rmtree(base, ignore_errors=True)
        events = base / "events"
        events.mkdir(parents=True)
        for n, f in enumerate(files[:OLD_FILES]):
            target = Path(shutil.copy(f, events))
            os.utime(target, (MTIME + n, MTIME + n))
        args = parse_args(["--events", str(events), "--output", str(base / "out"),
                           "--checkpoint", str(base / "checkpoint"), "--quiet",
                           "--max-files-per-trigger", "1", "--watermark-delay", "1 minute",
                           *options])
        report = run(spark, args)
        print(layout, json.dumps({"goals": report.goals, "attributed": report.attributed}))
        shutil.rmtree(events)
        with tarfile.open(HERE / f"{layout}.tar.gz", "w:gz") as tar:
            for entry in sorted(base.rglob("*")):
                # Spark's checksum files are not needed to read the logs back.
                if entry.is_file() and not entry.name.endswith(".crc"):
                    tar.add(entry, arcname=str(entry.relative_to(base)), recursive=False)
    spark.stop()


if __name__ == "__main__":
    print(dt.datetime.now(dt.timezone.utc).isoformat(), file=sys.stderr)
    main()
