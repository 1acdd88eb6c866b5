"""What every Spark job of this project shares: the session, the CLI options of a stream,
shipping the project's packages to executors, and how a job meets its operator.

Kept in one module so that the attribution job, the join job, the benchmark and the tests all
configure Spark the same way (UTC session time zone, RocksDB state store, microsecond Parquet
timestamps), and so that every job keeps Spark's log out of the terminal, checks its directories
before Spark starts, stops a query between micro-batches on SIGINT/SIGTERM, and ends a failure
with one ``error:`` line (the exit codes and signal handling themselves are
``commandline``'s, shared with the generator CLI).
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Callable, Optional

from attribution.spark.readers import FORMATS
from commandline.exits import ExitCode, Failure
from commandline.paths import check_readable_dir, check_writable_dir, is_remote
from commandline.signals import StopRequests
from jvm import artifacts as jvm_artifacts

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("attribution", "joins", "generators", "jobs", "commandline", "jvm")
ROCKSDB_PROVIDER = ("org.apache.spark.sql.execution.streaming.state."
                    "RocksDBStateStoreProvider")


def build_spark_session(app_name: str, master: Optional[str] = None,
                        shuffle_partitions: Optional[int] = None, extra_conf: Optional[dict] = None,
                        log_file: Optional[str] = None):
    """Create (or reuse) the SparkSession with the project's settings.

    :param app_name: Spark's application name.
    :param master: defaults to ``local[*]`` unless ``spark-submit`` already chose one.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions`` (default: the cores).
    :param extra_conf: more Spark settings, applied last.
    :param log_file: when this call starts the JVM, everything it prints (Spark's log4j
        console output, JVM warnings, the Python workers' stderr) goes to this file instead of
        the terminal, and so do the py4j/pyspark Python loggers; Spark then logs at WARN. A
        session that already runs (or a JVM started by ``spark-submit``) is left as it is.

    Python workers use this interpreter unless ``PYSPARK_PYTHON`` says otherwise.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {"spark.app.name": app_name}
    if master or not launched_by_spark_submit():
        settings["spark.master"] = master or "local[*]"
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "false",  # stateful queries ignore AQE; keep plans stable
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        # A Python worker has 15 s by default to connect back to its executor; on a busy host
        # (a loaded laptop, an oversubscribed node) that fails tasks for nothing.
        "spark.python.authenticate.socketTimeout": "120s",
    }
    if not launched_by_spark_submit():  # spark-submit users pass --jars or --packages
        conf.update(jvm_artifacts.spark_conf())  # Kafka connector and Delta: jvm/pom.xml
    if shuffle_partitions is not None:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra_conf or {})
    settings.update(conf)
    logging_to_file = log_file is not None and not jvm_running()
    if logging_to_file:
        _start_jvm_logging_to(log_file, settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if logging_to_file else "ERROR")
    if shuffle_partitions is None and not spark.sparkContext.getConf().contains(
            "spark.sql.shuffle.partitions"):
        # Spark's default of 200 means 200 state stores per micro-batch; one per core keeps every
        # core busy with the fewest (python -m benchmarks.streaming --levers: 1x the cores beat 2x
        # and 4x).
        spark.conf.set("spark.sql.shuffle.partitions",
                       str(max(1, spark.sparkContext.defaultParallelism)))
    return spark


def jvm_running() -> bool:
    """True when this process already talks to a JVM: a session of its own, or the driver JVM
    of ``spark-submit``. Its output can then no longer be redirected."""
    from pyspark import SparkContext

    return launched_by_spark_submit() or SparkContext._active_spark_context is not None


def _start_jvm_logging_to(log_file: str, settings: dict) -> None:
    """Start the JVM with its stdout and stderr going to ``log_file``, then the SparkContext.

    PySpark's ``launch_gateway`` takes ``popen_kwargs`` for the JVM's process (SPARK-21094, meant
    for capturing its output); ``settings`` reach spark-submit's command line as ``--conf``, as
    when PySpark starts the JVM itself. The JVM stays in this command's process group (a kill
    of the group takes it too); PySpark makes it ignore SIGINT, so Ctrl-C reaches only the
    Python driver, which stops the queries cleanly.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf()
    for key, value in settings.items():
        conf.set(key, value)
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("py4j", "pyspark", "py.warnings"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False  # not to the terminal through Python's last-resort handler
    logging.captureWarnings(True)
    with open(path, "ab") as log:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
    SparkContext(conf=conf, gateway=gateway)


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
    parser.add_argument("--log-file", default=None, metavar="FILE",
                        help="where Spark's own log goes (and its Python workers' output), "
                             "instead of the terminal; error lines name it (default: "
                             "out/logs/<job>-<start time>.log; under spark-submit Spark logs as "
                             "spark-submit is configured)")



# -- meeting the operator ------------------------------------------------------------------------

def default_log_file(app_name: str) -> str:
    """Where a job started at this moment writes Spark's log unless ``--log-file`` says."""
    return f"out/logs/{app_name}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def start_spark(app_name: str, master: Optional[str], shuffle_partitions: Optional[int],
                log_file: str, quiet: bool = False, stop: Optional[StopRequests] = None):
    """``build_spark_session`` for a command: announces the 10-20 s JVM start on stderr (unless
    ``quiet``) and sends Spark's log to ``log_file``.

    :param stop: the command's ``StopRequests``, installed again once the SparkContext has
        replaced the SIGINT handler with its own (cancel every job, raise KeyboardInterrupt).
    :returns: the session, and the log file if this call started the JVM (else ``None``: a
        running session or ``spark-submit`` logs as it was configured to).
    :raises Failure: ``log_file`` cannot be written (``ExitCode.OUTPUT``).
    """
    if jvm_running():
        spark = build_spark_session(app_name, master, shuffle_partitions)
        if stop is not None:
            stop.install()
        return spark, None
    check_writable_dir(str(Path(log_file).parent), "--log-file's directory", ExitCode.OUTPUT)
    if not quiet:
        print(f"starting Spark ({master or 'local[*]'}); Spark's log: {log_file} ...",
              file=sys.stderr, flush=True)
    started = time.monotonic()
    spark = build_spark_session(app_name, master, shuffle_partitions, log_file=log_file)
    if stop is not None:
        stop.install()
    if not quiet:
        print(f"Spark started in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return spark, log_file


def unexpected_failure(error: BaseException, log_file: Optional[str]) -> Failure:
    """An exception no check foresaw, as one line: its first line, and where its traceback is.

    The traceback (Python's, with Spark's Java one inside the message) is appended to
    ``log_file`` (or, with none, to a file of ``default_log_file``'s kind), never printed.
    """
    path = Path(log_file or default_log_file("failure"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as log:
            log.write("".join(traceback.format_exception(error)))
        where = f"the full error is in {path}"
    except OSError:
        where = "its details could not be written to a log"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if len(first) > 300:
        first = first[:300] + "..."
    return Failure(ExitCode.FAILED, f"the job failed: {first}; {where}")


def check_input(events: str, fmt: str) -> None:
    """Refuse ``--events`` unless it is a readable directory whose files are not all of another
    format than ``--format`` (which would make a run that silently reads nothing).

    :raises Failure: ``ExitCode.INPUT``.
    """
    from attribution.spark.readers import format_mismatch

    check_readable_dir(events, "--events", ExitCode.INPUT)
    mismatch = format_mismatch(events, fmt)
    if mismatch is not None:
        raise Failure(ExitCode.INPUT, mismatch)


def check_sink_directory(path: str, option: str, checkpoint: str) -> None:
    """Refuse ``path`` as a streaming file sink's directory unless it can be written, and unless
    the query writing it with ``checkpoint`` is the one that wrote what is already there.

    Spark's file sink skips every batch whose id its ``_spark_metadata`` log already holds: a new
    checkpoint writing into another query's output would lose its first batches without a word.

    :param path: the sink's directory (``--output``, ``--dead-letter``).
    :param option: the option that named it, quoted in the message.
    :param checkpoint: the checkpoint of the query that writes it.
    :raises Failure: ``ExitCode.OUTPUT``.
    """
    check_writable_dir(path, option, ExitCode.OUTPUT)
    if is_remote(path):
        return
    metadata = Path(path) / "_spark_metadata"
    if metadata.is_dir() and any(metadata.iterdir()) and not checkpoint_started(checkpoint):
        raise Failure(ExitCode.OUTPUT,
                      f"{option} {path} holds the output of another streaming query ({metadata}) "
                      f"and checkpoint {checkpoint} is new: Spark's file sink would skip this "
                      f"run's first micro-batches as already written. Give a new {option}, or "
                      "the --checkpoint that wrote it.")


def checkpoint_started(checkpoint: str) -> bool:
    """True when a query has started a micro-batch under ``checkpoint`` (its offset log has an
    entry). Remote checkpoints count as started: they are not listed."""
    if is_remote(checkpoint):
        return True
    offsets = Path(checkpoint) / "offsets"
    return offsets.is_dir() and any(not p.name.startswith(".") for p in offsets.iterdir())


def stop_after_current_batch(query, poll_seconds: float = 0.2) -> None:
    """Stop ``query`` once the micro-batch in flight (if any) has committed.

    ``query.stop()`` cancels a micro-batch in flight: its jobs are cancelled, nothing of it is
    committed, and a restart on the same checkpoint runs it again. Waiting for it first keeps
    its work. With a processing-time trigger the query then idles until its next trigger and
    stops there; under ``available-now`` the next micro-batch starts at once and is the one
    cancelled, to be redone on restart.
    """
    def last_batch():
        progress = query.lastProgress
        return None if progress is None else progress["batchId"]

    in_flight = last_batch()
    while (query.isActive and query.status["isTriggerActive"]
           and last_batch() == in_flight):
        time.sleep(poll_seconds)
    query.stop()


def run_with_dead_letter(query, dead_letter_query, stop, on_poll: Callable[[], None]) -> None:
    """Follow a job's main query and its dead-letter query until the main one ends.

    Every second ``on_poll`` runs (progress, audits). A stop request (``stop.requested``: SIGINT
    or SIGTERM) stops both queries after their micro-batch in flight. A failed dead-letter query
    stops the main one and its exception is raised, rather than running on without it. Whatever
    happens, neither query is left running.

    :param query: the main ``StreamingQuery``.
    :param dead_letter_query: the ``StreamingQuery`` writing the dead letter.
    :param stop: a ``commandline.signals.StopRequests`` or ``None`` (no signal handling).
    :param on_poll: called once per second while the main query runs.
    """
    try:
        while not query.awaitTermination(1):
            on_poll()
            if stop is not None and stop.requested:
                for running in (query, dead_letter_query):
                    stop_after_current_batch(running)
                break
            if not dead_letter_query.isActive and dead_letter_query.exception() is not None:
                query.stop()
                raise dead_letter_query.exception()
        dead_letter_query.awaitTermination()
    finally:
        for running in (query, dead_letter_query):
            if running.isActive:
                running.stop()
