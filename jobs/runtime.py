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

from attribution.spark.query_progress import RecentProgress
from attribution.spark.storage import available, location
from commandline.exits import ExitCode, Failure
from commandline.paths import check_readable_dir, check_writable_dir, is_remote
from commandline.signals import StopRequests
from jobs.settings import default_log_file
from jvm import artifacts as jvm_artifacts

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("attribution", "joins", "generators", "jobs", "commandline", "jvm")
# Settings the project turns off by default and a user may turn on (--conf or spark-submit's).
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
USER_CHOICES = ("spark.ui.enabled", "spark.ui.showConsoleProgress", DATAFRAME_DEBUGGING)
DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
ROCKSDB_PROVIDER = ("org.apache.spark.sql.execution.streaming.state."
                    "RocksDBStateStoreProvider")


def build_spark_session(app_name: str, master: Optional[str] = None,
                        shuffle_partitions: Optional[int] = None, extra_conf: Optional[dict] = None,
                        log_file: Optional[str] = None):
    """Create (or reuse) the SparkSession with the project's settings.

    :param app_name: Spark's application name.
    :param master: defaults to ``local[*]`` unless ``spark-submit`` already chose one.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions`` (default: the cores).
    :param extra_conf: more Spark settings, applied last (Delta's
        ``spark.databricks.delta.snapshotPartitions`` is the cores unless given here).
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
        # PySpark's call-site capture: on by default, it costs every DataFrame function call
        # a Python stack walk and some eight py4j round trips; the validation rules alone are
        # thousands of calls per query built. Off, errors lose the Python line in their query
        # context; --conf spark.python.sql.dataFrameDebugging.enabled=true brings it back.
        DATAFRAME_DEBUGGING: "false",
    }
    if not launched_by_spark_submit():  # spark-submit users pass --jars or --packages
        conf.update(jvm_artifacts.spark_conf())  # Kafka connector and Delta: jvm/pom.xml
    if shuffle_partitions is not None:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra_conf or {})
    if launched_by_spark_submit():
        # The UI is off unless asked for: spark-submit's --conf asks too.
        from pyspark import SparkConf

        launch_conf = SparkConf()
        for key in USER_CHOICES:
            if launch_conf.contains(key) and key not in (extra_conf or {}):
                conf[key] = launch_conf.get(key)
    settings.update(conf)
    logging_to_file = log_file is not None and not jvm_running()
    if logging_to_file:
        _start_jvm_logging_to(log_file, settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if logging_to_file else "ERROR")
    given = spark.sparkContext.getConf()
    one_per_core = str(max(1, spark.sparkContext.defaultParallelism))
    if shuffle_partitions is None and not given.contains("spark.sql.shuffle.partitions"):
        # Spark's default of 200 means 200 state stores per micro-batch; one per core keeps every
        # core busy with the fewest (python -m benchmarks.streaming --levers: 1x the cores beat 2x
        # and 4x).
        spark.conf.set("spark.sql.shuffle.partitions", one_per_core)
    if not given.contains(DELTA_SNAPSHOT_PARTITIONS):
        # Every Delta commit (one per micro-batch, two with --current-table) first rebuilds the
        # table's list of files in Delta's default of 50 partitions, sized for tables of millions
        # of files: on local[2] the chapter 7 stream into Delta took 88 s with 50 and 25 s with
        # one per core (Parquet: 18 s).
        spark.conf.set(DELTA_SNAPSHOT_PARTITIONS, one_per_core)
    return spark


def check_submitted_jars(jvm, settings) -> None:
    """Under ``spark-submit`` the jars come from its command line, not from the job: refuse in
    one line a run whose input or output needs jars the JVM lacks, before Spark starts.

    :param jvm: py4j's view of spark-submit's JVM.
    :param settings: the command's ``jobs.settings.JobSettings``.
    :raises Failure: ``ExitCode.USAGE``, naming what is missing and the options that add it.
    """
    missing = jvm_artifacts.missing_capabilities(jvm, settings.jvm_needs())
    if missing:
        delta = " (or --output-format parquet)" if "Delta Lake" in missing else ""
        raise Failure(ExitCode.USAGE, f"{' and '.join(missing)} not on spark-submit's "
                      "classpath: add the --jars or --packages options that 'python -m "
                      f"jvm.artifacts --spark-submit' prints{delta}; see docs/deployment.md")


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
    python_loggers_to(path)
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
    tree, e.g. when they were pip-installed on every node.

    :param spark: the ``SparkSession`` whose executors get the zip.
    """
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


def ship_project(spark) -> None:
    """``ship_packages``, and the shipped zip on the Python workers' path of the driver too.

    transformWithState starts one Python worker on the driver (Spark's "pre-init" runner),
    which unpickles the processor without the files added by addPyFile: on a cluster whose
    PYSPARK_PYTHON cannot import the project it fails with "No module named 'attribution'".
    The functions' environment does reach it; on executors of other hosts the path is absent
    and ignored, and there the shipped copy is used.

    :param spark: the ``SparkSession`` whose executors and driver workers get the zip.
    """
    packages = ship_packages(spark)
    if packages is not None:
        environment = spark.sparkContext.environment
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(packages), environment.get("PYTHONPATH")) if p)


# -- meeting the operator ------------------------------------------------------------------------

def start_spark(settings, stop: Optional[StopRequests] = None):
    """``build_spark_session`` for a command: announces the 10-20 s JVM start on stderr (unless
    ``--quiet``), keeps Spark's log out of the terminal, has the JVM hand its stop signals to
    ``stop``, and prints the Spark UI's address when ``--conf spark.ui.enabled=true`` opens it.

    Started with plain python, the JVM is this command's child and writes everything to
    ``--log-file``. Under ``spark-submit`` the JVM is the process a user or a scheduler signals,
    and it started before this driver: before the SparkContext starts, its SIGTERM and SIGINT
    handlers are replaced by ones that call ``stop`` (``forward_jvm_signals``), so the signal
    stops the run after the current micro-batch instead of shutting the JVM down under the
    driver, and its log4j output is sent to ``--log-file`` (``route_jvm_log``), unless the
    driver runs in the cluster (``--deploy-mode cluster``), whose manager keeps its log.

    :param settings: the command's ``jobs.settings.JobSettings``.
    :param stop: the command's ``StopRequests``, installed again once the SparkContext has
        replaced the SIGINT handler with its own (cancel every job, raise KeyboardInterrupt).
    :returns: the session, the log file Spark writes (``None`` for a session that ran already,
        which logs as it was configured to), and a function that restores the JVM's signal
        handlers (call it when the command ends).
    :raises Failure: the log file cannot be written (``ExitCode.OUTPUT``), or spark-submit
        was not given the jars the run needs (``check_submitted_jars``).
    """
    log_file, app, quiet = settings.log_file, settings.APP, settings.quiet
    options = dict(master=settings.master, shuffle_partitions=settings.shuffle_partitions,
                   extra_conf=settings.spark_conf)
    if jvm_running() and not launched_by_spark_submit():
        spark = build_spark_session(app, **options)
        if stop is not None:
            stop.install()
        return spark, None, lambda: None
    check_writable_dir(str(Path(log_file).parent), "--log-file's directory", ExitCode.OUTPUT)
    started = time.monotonic()
    if launched_by_spark_submit():
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the gateway to spark-submit's JVM, no context yet
        check_submitted_jars(SparkContext._jvm, settings)
        restore = forward_jvm_signals(stop, ("TERM", "INT")) if stop else (lambda: None)
        if SparkConf().get("spark.submit.deployMode", "client") == "cluster" \
                or not LOG4J2_PROPERTIES.exists():
            log_file = None  # the cluster manager keeps the driver's log (e.g. YARN's)
        else:
            route_jvm_log(log_file)
        if not quiet:
            where = log_file or "as the cluster keeps it"
            print(f"starting Spark under spark-submit; Spark's log: {where} ...",
                  file=sys.stderr, flush=True)
        spark = build_spark_session(app, **options)
    else:
        if not quiet:
            print(f"starting Spark ({settings.master or 'local[*]'}); Spark's log: {log_file} "
                  "...", file=sys.stderr, flush=True)
        spark = build_spark_session(app, **options, log_file=log_file)
        # PySpark's JVM ignores SIGINT already; a SIGTERM to the whole process group then
        # reaches it too, and is handed to ``stop`` instead of shutting it down.
        restore = forward_jvm_signals(stop, ("TERM",)) if stop else (lambda: None)
    if stop is not None:
        stop.install()
    if not quiet:
        print(f"Spark started in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    url = spark.sparkContext.uiWebUrl
    if url:
        print(f"Spark UI: {url}", file=sys.stderr, flush=True)
    return spark, log_file, restore


class _JvmSignalHandler:
    """A ``sun.misc.SignalHandler`` implemented in Python (a py4j callback): the JVM calls
    ``handle`` on its signal thread when the signal arrives."""

    def __init__(self, stop: StopRequests):
        self.stop = stop

    def handle(self, signal) -> None:
        self.stop.forwarded(signal.getNumber())

    class Java:
        implements = ["sun.misc.SignalHandler"]


def forward_jvm_signals(stop: StopRequests, names: tuple) -> Callable[[], None]:
    """Make the running JVM hand the signals ``names`` (``"TERM"``, ``"INT"``) to ``stop``
    instead of running its shutdown hooks, which stop the SparkContext (and under
    ``spark-submit`` end the Python driver with it).

    The handler is a py4j callback, served by PySpark's callback server in this process. A
    signal the JVM ignores (PySpark starts its JVM ignoring SIGINT) is left as it is.

    :param stop: the command's stop requests.
    :param names: the signals, by the JVM's names.
    :returns: a function that puts the JVM's own handlers back.
    """
    from py4j.protocol import Py4JError
    from pyspark import SparkContext
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(SparkContext._gateway)
    jsignal = SparkContext._jvm.sun.misc.Signal
    handler = _JvmSignalHandler(stop)
    previous = {}
    for name in names:
        try:
            previous[name] = jsignal.handle(jsignal(name), handler)
        except Py4JError:  # "Signal already used by VM or OS", or ignored
            continue

    def restore() -> None:
        for name, old in previous.items():
            try:
                jsignal.handle(jsignal(name), old)
            except Py4JError:  # the JVM is gone already
                pass

    return restore


# Spark's log4j2 configuration for a driver started by spark-submit: everything to one file.
LOG4J2_PROPERTIES = Path(__file__).resolve().parent / "log4j2.properties"
LOG_FILE_PROPERTY = "streamjoin.log.file"


def route_jvm_log(log_file: str) -> None:
    """Send the running JVM's log4j output to ``log_file`` from now on, with the project's
    ``jobs/log4j2.properties`` (the file named by the ``streamjoin.log.file`` system property),
    and the py4j and pyspark Python loggers too.

    For a JVM started before this driver (``spark-submit``): called before the SparkContext
    starts, it keeps Spark's start-up log off the terminal. What the JVM printed before the
    driver started (a JVM warning, a hostname WARN line) was printed already; spark-submit's
    ``--driver-java-options "-Dlog4j2.configurationFile=jobs/log4j2.properties
    -Dstreamjoin.log.file=FILE"`` routes those as well.

    :param log_file: the file (created, appended to).
    """
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    path = Path(log_file).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    jvm = SparkContext._jvm
    try:
        # spark-submit's JVM started with Spark's default profile and remembers it, and the
        # SparkContext applies that profile again when it starts. Spark keeps that memory in a
        # flag of its Logging object (org.apache.spark.internal.Logging$, Spark 3.3 to 4.x);
        # cleared, the context keeps the configuration below.
        logging_object = jvm.java.lang.Class.forName("org.apache.spark.internal.Logging$")
        remembered = logging_object.getDeclaredField(
            "org$apache$spark$internal$Logging$$defaultSparkLog4jConfig")
        remembered.setAccessible(True)
        remembered.setBoolean(None, False)
    except Py4JError:  # another Spark version: its start-up lines may reach the terminal
        pass
    jvm.java.lang.System.setProperty(LOG_FILE_PROPERTY, str(path))
    jvm.org.apache.logging.log4j.core.config.Configurator.reconfigure(
        jvm.java.net.URI(LOG4J2_PROPERTIES.as_uri()))
    python_loggers_to(path)


def python_loggers_to(path: Path) -> None:
    """Send the py4j and pyspark Python loggers, and Python's warnings, to ``path``.

    :param path: the log file (appended to).
    """
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("py4j", "pyspark", "py.warnings"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False  # not to the terminal through Python's last-resort handler
    logging.captureWarnings(True)


def unexpected_failure(error: BaseException, log_file: Optional[str]) -> Failure:
    """An exception no check foresaw, as one line: its first line, and where its traceback is.

    The traceback (Python's, with Spark's Java one inside the message) is appended to
    ``log_file`` (or, with none, to a file of ``default_log_file``'s kind), never printed.

    :param error: the exception.
    :param log_file: the file the traceback is appended to; ``None``: a default log file.
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


def check_input(settings, waits: bool = False) -> Optional[str]:
    """Refuse the run's input when it cannot give events (``INPUT_CHECKS``, by the kind of
    input, each asking its source's ``check`` too): a problem is one line with the input's
    exit code.

    :param settings: the job's ``JobSettings`` (its ``source`` and the options that made it).
    :param waits: the run keeps polling for new input (a processing-time trigger), so an empty
        directory or a topic not created yet is one that will receive events.
    :returns: for input a run waits on, the line that says so; else ``None``.
    :raises Failure: ``ExitCode.INPUT``.
    """
    return INPUT_CHECKS[settings.input_kind](settings, waits)


def _check_files(settings, waits: bool) -> Optional[str]:
    """``--events`` is a readable directory whose files are not all of another format than
    ``--format`` (the source's check: such a run would silently read nothing), and that holds
    a file to read, unless the run waits for files (a remote directory is left to Spark)."""
    from attribution.spark.formats import event_format
    from generators.layout import EVENTS_DIR, MANIFEST_FILE

    events = settings.events
    check_readable_dir(events, "--events", ExitCode.INPUT)
    if not is_remote(events) and (Path(events) / MANIFEST_FILE).is_file() \
            and (Path(events) / EVENTS_DIR).is_dir():
        raise Failure(ExitCode.INPUT, f"--events {events} is a generated dataset (it holds "
                                      f"{MANIFEST_FILE}); its events are in "
                                      f"--events {Path(events) / EVENTS_DIR}")
    problem = settings.source.check()
    if problem is not None:
        raise Failure(ExitCode.INPUT, problem)
    extensions = event_format(settings.format).extensions
    if is_remote(events) or _holds_a_file(events, extensions):
        return None
    names = "/".join(extensions)
    if waits:
        return (f"--events {events} holds no {names} file yet: the job waits for them (new "
                "files are read at each trigger)")
    raise Failure(ExitCode.INPUT, f"--events {events} holds no {names} file to read; give the "
                                  "directory of the input files, or a processing-time --trigger "
                                  "(e.g. '10 seconds') to wait for files to arrive")


def _check_kafka(settings, waits: bool) -> Optional[str]:
    """A broker of ``--kafka-bootstrap-servers`` answers, and the topics exist, unless the run
    waits for them (a topic created later is read from its start)."""
    servers = settings.kafka_bootstrap_servers
    problem = settings.source.check()
    if problem is not None:
        raise Failure(ExitCode.INPUT, problem)
    try:
        absent = settings.source.absent_topics(KAFKA_CHECK_SECONDS)
    except ConnectionError as err:
        raise Failure(ExitCode.INPUT, f"{err}; check --kafka-bootstrap-servers (and the "
                                      "security settings of --kafka-option)") from None
    if not absent:
        return None
    names = ", ".join(absent)
    if waits:
        return f"Kafka topic(s) {names} do not exist yet at {servers}: the job waits for them"
    raise Failure(ExitCode.INPUT, f"Kafka topic(s) {names} do not exist at {servers}; create "
                                  "them, fix --kafka-topics, or give a processing-time "
                                  "--trigger (e.g. '10 seconds') to wait for them")


KAFKA_CHECK_SECONDS = 10.0  # how long the check before Spark waits for the cluster to answer
# The kind of input (``jobs.settings.INPUTS``) -> its checks before Spark starts.
INPUT_CHECKS = {"files": _check_files, "kafka": _check_kafka}


def _holds_a_file(directory: str, extensions: tuple) -> bool:
    """True when ``directory`` (or a directory below it) holds a file ending in one of
    ``extensions``; names starting with ``_`` or ``.`` are skipped, as Spark skips them."""
    for _, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        if any(name.endswith(extensions) and not name.startswith(("_", "."))
               for name in files):
            return True
    return False


def check_sink_directory(path: str, option: str, checkpoint: str) -> None:
    """Refuse ``path`` as a streaming file sink's directory unless it can be written, and unless
    the query writing it with ``checkpoint`` is the one that wrote what is already there.

    Spark's file sink skips every batch whose id its ``_spark_metadata`` log already holds: a new
    checkpoint writing into another query's output would lose its first batches without a word.
    A Delta table's commits are idempotent per query id, which a new checkpoint changes: it would
    append every row again, so a new checkpoint is refused on an existing table too.

    :param path: the sink's directory (``--output``, ``--dead-letter``).
    :param option: the option that named it, quoted in the message.
    :param checkpoint: the checkpoint of the query that writes it.
    :raises Failure: ``ExitCode.OUTPUT``.

    Before Spark starts, a URI cannot be listed (``storage.available``): the check is then
    made again once the session runs.
    """
    check_writable_dir(path, option, ExitCode.OUTPUT)
    if not (available(path) and available(checkpoint)):
        return  # a URI before Spark starts: the job checks again once it runs
    from attribution.spark.output import is_delta_table

    if checkpoint_started(checkpoint):
        return
    metadata = location(path) / "_spark_metadata"
    if metadata.iterdir():
        raise Failure(ExitCode.OUTPUT,
                      f"{option} {path} holds the output of another streaming query ({metadata}) "
                      f"and checkpoint {checkpoint} is new: Spark's file sink would skip this "
                      f"run's first micro-batches as already written. Give a new {option}, or "
                      "the --checkpoint that wrote it.")
    if is_delta_table(path):
        raise Failure(ExitCode.OUTPUT,
                      f"{option} {path} is a Delta table another run wrote and checkpoint "
                      f"{checkpoint} is new: this run would append every row a second time. Give "
                      f"a new {option}, or the --checkpoint that wrote it.")


def check_dead_letter_directory(settings) -> None:
    """Refuse ``--dead-letter`` unless it can be written, and unless what it holds was written
    for this run's checkpoint: by the dead-letter query under ``<checkpoint>/dead-letter``
    (``check_sink_directory``), or from the micro-batches of ``--checkpoint`` (its markers name
    micro-batches by id: a new checkpoint's would be taken for done).

    :param settings: the job's ``JobSettings``.
    :raises Failure: ``ExitCode.OUTPUT``.
    """
    from attribution.spark.dead_letter import DEAD_LETTERED_DIR

    check_sink_directory(settings.dead_letter, "--dead-letter", settings.dead_letter_checkpoint)
    if not (available(settings.dead_letter) and available(settings.checkpoint)):
        return  # a URI before Spark starts: the job checks again once it runs
    markers = location(settings.dead_letter) / DEAD_LETTERED_DIR
    if (markers.is_dir() and markers.iterdir()
            and not checkpoint_started(settings.checkpoint)):
        raise Failure(ExitCode.OUTPUT,
                      f"--dead-letter {settings.dead_letter} holds the dead letters of another "
                      f"run ({markers}) and checkpoint {settings.checkpoint} is new: this run's "
                      "micro-batches would be taken for that run's. Give a new --dead-letter, or "
                      "the --checkpoint that wrote it.")


def checkpoint_started(checkpoint: str) -> bool:
    """True when a query has started a micro-batch under ``checkpoint`` (its offset log has an
    entry).

    :param checkpoint: the query's checkpoint location (a path, or a URI once Spark runs:
        ``attribution.spark.storage``).
    """
    return any(not p.name.startswith(".") for p in (location(checkpoint) / "offsets").iterdir())


def classified_stream(spark, settings, limited: bool = True):
    """The input as a stream of records classified valid or invalid (``validation.classify``).

    Validation splits the input before any ``withWatermark``: invalid rows never move event
    time. A job's query reads it with the per-trigger limit (``--max-files-per-trigger``,
    ``--max-offsets-per-trigger``); a dead-letter query kept for an earlier version's dead
    letter (``DeadLetterOutput``) without (it has no watermark to step, so it takes everything
    new in one micro-batch).

    :param spark: the session.
    :param settings: the job's ``JobSettings`` (its ``source`` and ``--max-future-skew``).
    :param limited: apply the per-trigger limit.
    """
    from attribution.spark.validation import classify

    raw = settings.source.read_stream(spark, limited)
    return classify(raw, settings.source, settings.max_future_skew_ms, settings.max_future_skew)


def dead_letter_query_kept(settings) -> bool:
    """True when a streaming job's dead letter is written by a streaming query of its own, which
    reads the input a second time: the way earlier versions of the jobs wrote it. That is kept
    for a dead letter such a query wrote (its checkpoint, ``<checkpoint>/dead-letter``, has
    started: it goes on where it stopped, exactly once). Otherwise the dead letters come from the
    main query's committed micro-batches (``attribution.spark.dead_letter``), and the input is
    read once.

    :param settings: the job's ``JobSettings``.
    """
    return checkpoint_started(settings.dead_letter_checkpoint)


class ProgressSeen:
    """Which committed micro-batches of a job's main query may be read again without waiting
    for their progress update (the counts that can spare the re-read: invalid records, rows
    dropped as late): those an earlier run committed (this run never sees their update), those
    before a micro-batch whose update has come (theirs came first, or was missed), and all once
    the query has ended.

    Build it before the main query starts.

    :param checkpoint: the main query's checkpoint.
    """

    def __init__(self, checkpoint: str):
        from attribution.spark.sources.offset_log import committed_batches

        self.earlier = set(committed_batches(location(checkpoint)))
        self.latest = -1
        self.ended = False

    def see(self, progress, ended: bool = False) -> None:
        """Take the query's recent progress updates.

        :param progress: ``query.recentProgress``.
        :param ended: the query has ended.
        """
        self.latest = max([self.latest, *(p.batchId for p in progress)])
        self.ended = self.ended or ended

    def decided(self, batch_id: int) -> bool:
        """True when ``batch_id``'s progress update, if it has not come, will not come.

        :param batch_id: a committed micro-batch.
        """
        return self.ended or batch_id in self.earlier or batch_id < self.latest


class DeadLetterOutput:
    """A streaming job's dead letter (``--dead-letter``): written from the main query's committed
    micro-batches, re-reading one only when the query counted invalid records in it
    (``attribution.spark.dead_letter``), or, where ``dead_letter_query_kept``, by a second
    streaming query (``query``, else ``None``).

    Build it before the main query starts (``seen``: the query's ``ProgressSeen``).

    :param spark: the session.
    :param settings: the job's ``JobSettings``.
    :param query_name: the name of a kept dead-letter query.
    :param by_detected_date: a kept query lays its files out under ``detected_date=`` (false
        for a dead letter an earlier version wrote flat, ``layout.is_flat``).
    """

    def __init__(self, spark, settings, query_name: str = "dead_letter",
                 by_detected_date: bool = True):
        from attribution.spark.validation import start_dead_letter_stream

        self.spark, self.settings = spark, settings
        self.query = None
        self.written = 0
        self.invalid: dict[int, int] = {}
        self.seen = ProgressSeen(settings.checkpoint)
        if dead_letter_query_kept(settings):
            self.query = start_dead_letter_stream(
                classified_stream(spark, settings, limited=False), settings.dead_letter,
                settings.dead_letter_checkpoint, settings.trigger, query_name=query_name,
                by_detected_date=by_detected_date)

    def follow(self, progress, final: bool = False) -> None:
        """Write the dead letters of the micro-batches committed since the last call; one whose
        count has not come yet waits for it, unless ``seen`` says it will not come.

        :param progress: the main query's recent progress updates.
        :param final: the main query has ended.
        """
        self.seen.see(progress, final)
        if self.query is not None:
            return
        from attribution.spark.dead_letter import invalid_by_batch, write_dead_letters

        settings = self.settings
        self.invalid.update(invalid_by_batch(progress))
        self.written += write_dead_letters(
            self.spark, settings.checkpoint, settings.dead_letter, settings.source,
            settings.max_future_skew_ms, settings.max_future_skew, self.invalid,
            self.seen.decided, settings.source.unreadable_dead_letters)


def stop_after_current_batch(query, poll_seconds: float = 0.2) -> None:
    """Stop ``query`` once the micro-batch in flight (if any) has committed.

    ``query.stop()`` cancels a micro-batch in flight: its jobs are cancelled, nothing of it is
    committed, and a restart on the same checkpoint runs it again. Waiting for it first keeps
    its work. With a processing-time trigger the query then idles until its next trigger and
    stops there; under ``available-now`` the next micro-batch starts at once and is the one
    cancelled, to be redone on restart.

    :param query: the ``StreamingQuery`` to stop.
    :param poll_seconds: how often to look whether the micro-batch in flight has committed.
    """
    def last_batch():
        progress = query.lastProgress
        return None if progress is None else progress["batchId"]

    in_flight = last_batch()
    while (query.isActive and query.status["isTriggerActive"]
           and last_batch() == in_flight):
        time.sleep(poll_seconds)
    query.stop()


def follow_queries(query, dead_letters: DeadLetterOutput, stop: Optional[StopRequests],
                   progress, also: Optional[Callable[[list], None]] = None) -> None:
    """The progress loop of a job: follow its main query (and a kept dead-letter query) until
    the main one ends (``run_with_dead_letter``), feeding every poll's recent progress updates
    (``query.recentProgress``, each update converted once: ``RecentProgress``) to ``progress``
    (a ``jobs.progress.MicroBatchProgress``), ``also`` and the dead letter, and once more at the
    end for what the last micro-batch committed.

    :param query: the main ``StreamingQuery``.
    :param dead_letters: the job's dead letter (``DeadLetterOutput``).
    :param stop: the command's stop requests, or ``None``.
    :param progress: takes the progress updates (``consume``).
    :param also: called with the same updates after ``progress`` (e.g. an audit).
    """
    recent = RecentProgress(query)

    def poll(final: bool = False) -> None:
        updates = recent.updates()
        progress.consume(updates)
        dead_letters.follow(updates, final)  # first: it updates ``dead_letters.seen``
        if also is not None:
            also(updates)

    run_with_dead_letter(query, dead_letters.query, stop, poll)
    poll(final=True)


def run_with_dead_letter(query, dead_letter_query, stop, on_poll: Callable[[], None]) -> None:
    """Follow a job's main query and its dead-letter query, if it has one, until the main one
    ends.

    Every second ``on_poll`` runs (progress, audits, the dead letter). A stop request
    (``stop.requested``: SIGINT or SIGTERM) stops the queries after their micro-batch in
    flight. A failed dead-letter query stops the main one and its exception is raised, rather
    than running on without it. Whatever happens, no query is left running.

    :param query: the main ``StreamingQuery``.
    :param dead_letter_query: the ``StreamingQuery`` writing the dead letter, or ``None``.
    :param stop: a ``commandline.signals.StopRequests`` or ``None`` (no signal handling).
    :param on_poll: called once per second while the main query runs.
    """
    queries = [q for q in (query, dead_letter_query) if q is not None]
    try:
        while not query.awaitTermination(1):
            on_poll()
            if stop is not None and stop.requested:
                for running in queries:
                    stop_after_current_batch(running)
                break
            if (dead_letter_query is not None and not dead_letter_query.isActive
                    and dead_letter_query.exception() is not None):
                query.stop()
                raise dead_letter_query.exception()
        if dead_letter_query is not None:
            dead_letter_query.awaitTermination()
    finally:
        for running in queries:
            if running.isActive:
                running.stop()
