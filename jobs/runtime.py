"""What every Spark job of this project shares: the session, the CLI options of a stream, and
shipping the project's packages to executors.

Kept in one module so that the attribution job, the join job, the benchmark and the tests all
configure Spark the same way (UTC session time zone, RocksDB state store, microsecond Parquet
timestamps).
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from attribution.spark.readers import FORMATS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("attribution", "joins", "generators", "jobs")
ROCKSDB_PROVIDER = ("org.apache.spark.sql.execution.streaming.state."
                    "RocksDBStateStoreProvider")


def build_spark_session(app_name: str, master: Optional[str] = None,
                        shuffle_partitions: Optional[int] = None, extra_conf: Optional[dict] = None):
    """Create (or reuse) the SparkSession with the project's settings.

    ``master`` defaults to ``local[*]`` unless ``spark-submit`` already chose one. Python workers
    use this interpreter unless ``PYSPARK_PYTHON`` says otherwise.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master or not launched_by_spark_submit():
        builder = builder.master(master or "local[*]")
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "false",  # stateful queries ignore AQE; keep plans stable
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
    }
    if shuffle_partitions is not None:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if shuffle_partitions is None and not spark.sparkContext.getConf().contains(
            "spark.sql.shuffle.partitions"):
        # Spark's default of 200 means 200 state stores per micro-batch; one per core keeps every
        # core busy with the fewest (python -m benchmarks.streaming --levers: 1x the cores beat 2x
        # and 4x).
        spark.conf.set("spark.sql.shuffle.partitions",
                       str(max(1, spark.sparkContext.defaultParallelism)))
    return spark


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this driver: its JVM gateway is already running, and its
    ``--master`` (or spark-defaults) must not be overridden."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def ship_packages(spark) -> Optional[Path]:
    """Zip the project's packages and ``addPyFile`` them, so executors on other machines can
    import them. Skipped (returns ``None``) when the packages are not importable from a source
    tree, e.g. when they were pip-installed on every node."""
    if not all((ROOT / pkg / "__init__.py").exists() for pkg in PACKAGES):
        return None
    scratch = Path(tempfile.mkdtemp(prefix="streamjoin-pyfiles-"))
    atexit.register(shutil.rmtree, scratch, True)  # the zip must outlive the session, no more
    target = scratch / "streamjoin.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in PACKAGES:
            for f in sorted((ROOT / pkg).rglob("*.py")):
                zf.write(f, f.relative_to(ROOT).as_posix())
    spark.sparkContext.addPyFile(str(target))
    return target


def add_stream_options(parser: argparse.ArgumentParser, *, default_output: str,
                       default_checkpoint: str) -> None:
    """The input/output/trigger options every streaming job of the project accepts."""
    parser.add_argument("--events", required=True, metavar="DIR",
                        help="directory of spec events (JSON lines, Parquet or Avro), read as a "
                             "file stream")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="input file format: JSON lines, Parquet or Avro (the generator's "
                             "formats; default: %(default)s)")
    parser.add_argument("--output", default=default_output, metavar="DIR",
                        help="Parquet output directory, written by Spark's exactly-once file sink "
                             "(default: %(default)s)")
    parser.add_argument("--checkpoint", default=default_checkpoint, metavar="DIR",
                        help="checkpoint directory; reuse it to resume after a stop or crash "
                             "(default: %(default)s)")
    parser.add_argument("--trigger", default="available-now",
                        help="'available-now' processes everything present and stops; an interval "
                             "such as '10 seconds' runs continuously (default: %(default)s)")
    parser.add_argument("--max-files-per-trigger", type=int, default=None, metavar="N",
                        help="read at most N new files per micro-batch; with N=1 every file is "
                             "one watermark step (default: no limit)")
    parser.add_argument("--master", default=None,
                        help="Spark master when run with plain python (default: local[*]; "
                             "spark-submit's --master wins)")
    parser.add_argument("--shuffle-partitions", type=int, default=None, metavar="N",
                        help="spark.sql.shuffle.partitions, fixed in the checkpoint at the first "
                             "run (default: the cores Spark reports, unless set by "
                             "spark-submit --conf)")

