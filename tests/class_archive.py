"""Build the class-data-sharing archive the test suite's driver JVMs start from.

``python tests/class_archive.py ARCHIVE`` (``make test`` runs it once per clone, before pytest)
starts a Spark driver JVM with ``-XX:ArchiveClassesAtExit``, runs a small workload that loads
what the suite's drivers load (both stateful backends, the Parquet and Delta sinks, the dead
letter and the late-record audit, the click join), and exits the JVM cleanly, so that HotSpot
writes the classes it loaded from the application class path (Spark's own jars) to ``ARCHIVE``.
``make test`` then starts every driver JVM (the session of each pytest worker and every job the
tests run as a subprocess) with ``-XX:SharedArchiveFile=ARCHIVE``: those classes are mapped,
already parsed and verified, instead of read from the jars again at each of the suite's many JVM
starts. A driver's start and first two queries took 10.5 to 11.6 CPU seconds
without it and 6.9 to 7.2 with it (2 cores, three runs each).

Of the classes of the jars a session adds (``spark.jars``: Delta, the Kafka connector), loaded
by Spark's own class loader, HotSpot archives only some; the rest load as before. A JVM whose
class path differs from the archive's, or another JVM build, ignores the archive and loads from
the jars, so a stale archive costs time, never a result. HotSpot refuses a truncated archive
with a crash, so the archive is written under a temporary name and renamed only once the JVM
has exited with 0.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from jobs import attribution_job, join_job
from jobs.runtime import build_spark_session
from support.datasets import CH7_DIR

# Both backends and both sinks: (backend, output format).
ATTRIBUTION_RUNS = (("transformWithState", "delta"), ("applyInPandasWithState", "parquet"))


def _workload(spark, work: Path) -> None:
    """Run each job once on the chapter 7 files."""
    for n, (backend, output_format) in enumerate(ATTRIBUTION_RUNS):
        run = work / f"attribution-{n}"
        settings = attribution_job.parse_args(
            ["--events", str(CH7_DIR), "--output", str(run / "out"), "--checkpoint",
             str(run / "checkpoint"), "--backend", backend, "--output-format", output_format,
             "--dead-letter", str(run / "dead"), "--late-records", str(run / "late"),
             "--quiet"])
        attribution_job.run(spark, settings)
    join = work / "join"
    join_job.run(spark, join_job.parse_args(
        ["--events", str(CH7_DIR), "--output", str(join / "out"), "--checkpoint",
         str(join / "checkpoint"), "--quiet"]))


def build(archive: Path) -> None:
    """Write the archive of a driver JVM that ran ``_workload`` to ``archive``.

    :param archive: where the archive goes; its directory is created.
    """
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    # The JVM's other options (the JIT's, the quiet class-sharing log) are the caller's: make's.
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [
        os.environ.get("SPARK_SUBMIT_OPTS", ""), f"-XX:ArchiveClassesAtExit={partial}"]))
    work = Path(tempfile.mkdtemp(prefix="class-archive-"))
    try:
        spark = build_spark_session("class-archive", master="local[2]", shuffle_partitions=2)
        gateway = spark.sparkContext._gateway
        _workload(spark, work)
        spark.stop()
        # The JVM writes the archive as it exits: it exits when its stdin closes.
        jvm = gateway.proc
        gateway.shutdown()
        jvm.stdin.close()
        code = jvm.wait(timeout=600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise SystemExit(f"class archive: the JVM exited with {code} and wrote no archive")
    partial.replace(archive)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/class_archive.py ARCHIVE")
    build(Path(sys.argv[1]).resolve())
