"""Running one kind: the native count, the attribution job on each backend or in batch mode, on
the dataset's files or its Kafka topic, into Parquet files or a Delta table, the bare
attribution query (a row of the main table, and the levers) and the pure-Python core, each
timed with its memory, CPU and micro-batch progress recorded and its answer checked."""
from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from attribution.config import parse_duration_ms, spark_interval

from .datasets import Dataset, closed_window_events, read_events_arrow
from .kinds import (
    BARE,
    BARE_BACKEND,
    CORE,
    FILES,
    JOB_RUNS,
    KAFKA_TOPIC,
    NATIVE,
    NATIVE_WINDOW,
)
from .listeners import (
    ProgressRecorder,
    StateStats,
    batches_with_data,
    micro_batch_figures,
    state_stats,
)
from .sampling import MemoryPeaks, MemorySampler
from .topics import KAFKA_FORMAT, KafkaInput, offsets_per_trigger

JOB_QUERY = "attribution"  # the attribution job's main query (jobs/attribution_job.py)


@dataclass
class RunResult:
    """One timed run: what ran over which dataset, how long, with what memory, state and
    answer (``check``: "ok", "n/a" or what failed)."""

    kind: str
    dataset: str
    repeat: int
    records: int
    seconds: float
    memory: MemoryPeaks
    state: StateStats = field(default_factory=StateStats)
    batches: int = 0
    goals: Optional[int] = None
    attributed: Optional[int] = None
    check: str = "n/a"
    micro_batches: list = field(default_factory=list)  # listeners.micro_batch_figures
    allowed_lateness_ms: int = 0   # the job's --allowed-lateness (streaming runs only)

    @property
    def events_per_s(self) -> float:
        """Input records per second of the run's wall time (NaN without time)."""
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        """Every field but the CPU samples, and the rate, for the JSON report."""
        out = {**asdict(self), "events_per_s": self.events_per_s}
        del out["memory"]["cpu_timeline"]
        return out


def native_counts(events, watermark_delay: str):
    """Spark's own stateful aggregation over the streaming DataFrame ``events``: a count per user
    per ``NATIVE_WINDOW`` of event time, with a watermark ``watermark_delay`` behind, heartbeats
    dropped after it saw them.

    :param events: the streaming DataFrame of events.
    :param watermark_delay: how far the watermark trails, e.g. ``"10 minutes"``.
    """
    from pyspark.sql import functions as F

    from attribution.spark.pipeline import drop_heartbeats

    watermarked = events.withWatermark("ts", spark_interval(parse_duration_ms(watermark_delay)))
    return drop_heartbeats(watermarked).groupBy("user_id", F.window("ts", NATIVE_WINDOW)).count()


def _write_available_now(rows, scratch: Path, name: str, what: str) -> None:
    """Stream ``rows`` to Parquet under ``scratch`` with ``availableNow``; raise if it failed."""
    q = (rows.writeStream.format("parquet").outputMode("append")
         .option("path", str(scratch / "out"))
         .option("checkpointLocation", str(scratch / "checkpoint"))
         .queryName(name).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{what} failed: {q.exception()}")


class Bench:
    """Runs the benchmark's queries in one Spark session, with memory and progress recorded."""

    def __init__(self, spark, work: Path, args):
        """``work``: where datasets and runs go; ``args``: the parsed command line (file
        batching, sampling interval).

        :param spark: the ``SparkSession`` the runs use.
        :param work: where datasets and runs go.
        :param args: the parsed command line (file batching, sampling interval).
        """
        self.spark = spark
        self.work = work
        self.args = args
        self.recorder = ProgressRecorder()
        self.recorder.add_to(spark)
        self.sampler = MemorySampler(args.sample_interval)
        self.kafka = KafkaInput(work / "kafka")
        self._runs = 0

    def close(self) -> None:
        """Stop recording the session's progress, and stop the Kafka broker if one was
        started."""
        try:
            self.recorder.remove_from(self.spark)
        finally:
            self.kafka.close()

    def scratch(self, name: str) -> Path:
        """A new, empty directory for one run's output and checkpoint (``name`` tags it).

        :param name: a tag for the directory's name.
        """
        self._runs += 1
        path = self.work / "runs" / f"{self._runs:03d}-{name}"
        path.mkdir(parents=True)
        return path

    @contextmanager
    def session_conf(self, conf: dict) -> Iterator[None]:
        """Set the Spark configuration ``conf`` (key -> value) while inside, then restore it.

        :param conf: configuration key -> value.
        """
        saved = {key: self.spark.conf.get(key, None) for key in conf}
        try:
            for key, value in conf.items():
                self.spark.conf.set(key, value)
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    self.spark.conf.unset(key)
                else:
                    self.spark.conf.set(key, value)

    def timed(self, fn: Callable[[], object], query_name: Optional[str] = None) -> tuple:
        """Run ``fn`` with memory sampled and progress recorded; return (result, seconds,
        memory peaks, micro-batches of the streaming query named ``query_name``, if any).

        :param fn: the work to time.
        :param query_name: the streaming query whose micro-batches to return, or ``None``.
        """
        self.recorder.start_window()
        self.sampler.reset()
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
        memory = self.sampler.reset()
        progress = self.recorder.wait_for(query_name) if query_name else []
        return result, seconds, memory, batches_with_data(progress)

    def run(self, kind: str, dataset: Dataset, repeat: int, **job_options) -> RunResult:
        """One timed run of ``kind`` over ``dataset``; ``repeat`` tags it, ``job_options`` go to
        the attribution job (``lookback``, ``options``, ``allowed_lateness_ms``).

        :param kind: what to run, one of ``RUN_KINDS``.
        :param dataset: the input.
        :param repeat: which repeat this is.
        :param job_options: options for the attribution job.
        """
        scratch = self.scratch(kind)
        try:
            if kind in JOB_RUNS:
                return self._job(kind, dataset, repeat, scratch, **job_options)
            if kind == BARE:
                return self.run_bare(dataset, BARE_BACKEND, kind=BARE, repeat=repeat)
            if kind == NATIVE:
                return self._native(dataset, repeat, scratch)
            return self._core(dataset, repeat)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # (a)
    def _native(self, dataset: Dataset, repeat: int, scratch: Path) -> RunResult:
        from pyspark.sql import functions as F

        from attribution.spark.readers import read_event_stream

        def query():
            events = read_event_stream(self.spark, str(dataset.events_dir), "parquet",
                                       self.args.max_files_per_trigger)
            counts = native_counts(events, dataset.watermark_delay)
            _write_available_now(counts, scratch, "benchmark_native", "native aggregation")

        _, seconds, memory, batches = self.timed(query, "benchmark_native")
        counted = self.spark.read.parquet(str(scratch / "out")).agg(F.sum("count")).first()[0]
        expected = closed_window_events(dataset)
        check = "ok" if counted == expected else f"FAIL: counted {counted} of {expected} events"
        return RunResult(NATIVE, dataset.label, repeat, dataset.records, seconds, memory,
                         state_stats(batches), len(batches), check=check)

    # (b) and (c)
    def _job(self, kind: str, dataset: Dataset, repeat: int, scratch: Path,
             lookback: Optional[str] = None, options: Sequence[str] = (),
             allowed_lateness_ms: int = 0) -> RunResult:
        """The attribution job as its command line runs it, as ``JOB_RUNS[kind]`` says (backend
        or batch mode, input); ``lookback`` replaces the dataset's (its answer is then not
        checked), ``options`` are further command-line options (e.g. ``--state-buckets 0``),
        ``allowed_lateness_ms`` its ``--allowed-lateness`` (streaming only). The input is made
        ready (a topic produced) before the clock starts."""
        from jobs.attribution_job import parse_args, run

        job = JOB_RUNS[kind]
        streaming = job.backend is not None
        argv = [*INPUTS[job.source](self, dataset, streaming),
                "--output", str(scratch / "out"),
                "--checkpoint", str(scratch / "checkpoint"),
                "--watermark-delay", dataset.watermark_delay, "--quiet",
                "--lookback", lookback or f"{dataset.config.lookback_ms} ms",
                "--dedup-window", f"{dataset.config.dedup_window_ms} ms",
                "--models", ",".join(dataset.config.models), *output_options(job.sink)]
        if not streaming:
            argv += ["--mode", "batch"]
        else:
            argv += ["--backend", job.backend]
            if allowed_lateness_ms:
                argv += ["--allowed-lateness", f"{allowed_lateness_ms} ms"]
        args = parse_args([*argv, *options])
        report, seconds, memory, batches = self.timed(
            lambda: run(self.spark, args), JOB_QUERY if streaming else None)
        check = "ok"
        if lookback is None and dataset.goals and (report.goals, report.attributed) != (
                dataset.goals, dataset.attributed):
            check = (f"FAIL: {report.goals} goals / {report.attributed} attributed, core says "
                     f"{dataset.goals} / {dataset.attributed}")
        elif lookback is not None or not dataset.goals:
            check = "n/a"
        return RunResult(kind, dataset.label, repeat, dataset.records, seconds, memory,
                         state_stats(batches), report.batches, report.goals, report.attributed,
                         check, micro_batch_figures(
                             batches, memory.cpu_timeline,
                             batches_with_data(self.recorder.others(JOB_QUERY))),
                         allowed_lateness_ms=allowed_lateness_ms if streaming else 0)

    def run_bare(self, dataset: Dataset, backend: str, conf: Optional[dict] = None,
                 kind: Optional[str] = None, repeat: int = 0, **stream_options) -> RunResult:
        """The attribution query alone (file source, stateful stage, Parquet sink: no
        validation, no dead-letter query, no date partitions), for the main table's ``bare``
        row and the levers: ``stream_options`` go to ``attribution_stream``, ``conf`` is set
        for this run only. Its answer is checked once the core has given its own.

        :param dataset: the input.
        :param backend: the stateful backend.
        :param conf: Spark configuration for this run only, or ``None``.
        :param kind: the result's kind (default: ``backend``).
        :param repeat: which repeat this is.
        :param stream_options: options for ``attribution_stream``.
        """
        from pyspark.sql import functions as F

        from attribution.spark.pipeline import attribution_stream
        from attribution.spark.readers import read_event_stream

        cores = self.spark.sparkContext.defaultParallelism
        # A multiple of the cores, e.g. "2x", becomes that many.
        conf = {key: str(int(value[:-1]) * cores) if value.endswith("x") else value
                for key, value in (conf or {}).items()}
        scratch = self.scratch("bare")
        try:
            def query():
                events = read_event_stream(self.spark, str(dataset.events_dir), "parquet",
                                           self.args.max_files_per_trigger)
                rows = attribution_stream(
                    events, watermark_delay_ms=parse_duration_ms(dataset.watermark_delay),
                    config=dataset.config, backend=backend, **stream_options)
                _write_available_now(rows, scratch, "benchmark_bare", "attribution query")

            with self.session_conf(conf):
                _, seconds, memory, batches = self.timed(query, "benchmark_bare")
            first_model = F.col("model") == F.lit(dataset.config.models[0])
            counts = self.spark.read.parquet(str(scratch / "out")).filter(first_model).agg(
                F.count_distinct("user_id", "goal_event_id").alias("goals"),
                F.count_distinct(F.when(F.col("impression_id").isNotNull(), F.col("user_id")),
                                 "goal_event_id").alias("attributed")).first()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        check = "ok" if (counts.goals, counts.attributed) == (dataset.goals, dataset.attributed) \
            else f"FAIL: {counts.goals} / {counts.attributed}"
        if not dataset.goals:  # no core run to check against (e.g. the warm-up)
            check = "n/a"
        return RunResult(kind or backend, dataset.label, repeat, dataset.records, seconds,
                         memory, state_stats(batches), len(batches), counts.goals,
                         counts.attributed, check, micro_batch_figures(batches))

    # (d)
    def _core(self, dataset: Dataset, repeat: int) -> RunResult:
        from attribution.oracle import attribute_batch

        def attribute():
            return attribute_batch(read_events_arrow(dataset.events_dir), dataset.config)

        rows, seconds, memory, _ = self.timed(attribute)
        goals, attributed = goal_counts(rows, dataset.config.models[0])
        if not dataset.goals:  # the first core run is the reference for the Spark runs
            dataset.goals, dataset.attributed = goals, attributed
        check = "ok" if (goals, attributed) == (dataset.goals, dataset.attributed) else "FAIL"
        return RunResult(CORE, dataset.label, repeat, dataset.records, seconds, memory,
                         goals=goals, attributed=attributed, check=check)


def files_input(bench: Bench, dataset: Dataset, streaming: bool) -> list[str]:
    """The job's options to read ``dataset``'s Parquet files, ``--max-files-per-trigger`` of
    the benchmark's command line per micro-batch when ``streaming``.

    :param bench: the benchmark (its command line).
    :param dataset: the dataset.
    :param streaming: whether the job streams.
    """
    argv = ["--events", str(dataset.events_dir), "--format", "parquet"]
    if streaming:
        argv += ["--max-files-per-trigger", str(bench.args.max_files_per_trigger)]
    return argv


def kafka_input(bench: Bench, dataset: Dataset, streaming: bool) -> list[str]:
    """The job's options to read ``dataset``'s events from its topic on the benchmark's broker
    (produced on first use), when ``streaming`` with as many micro-batches as the file source
    makes (``topics.offsets_per_trigger``).

    :param bench: the benchmark (its broker and command line).
    :param dataset: the dataset.
    :param streaming: whether the job streams.
    """
    bootstrap, topic = bench.kafka.topic(dataset)
    argv = ["--kafka-bootstrap-servers", bootstrap, "--kafka-topics", topic,
            "--format", KAFKA_FORMAT]
    if streaming:
        argv += ["--max-offsets-per-trigger",
                 str(offsets_per_trigger(dataset, bench.args.max_files_per_trigger))]
    return argv


# A ``JobRun``'s source -> the job's input options for a dataset.
INPUTS = {FILES: files_input, KAFKA_TOPIC: kafka_input}


def output_options(sink: str) -> list[str]:
    """The job's options to write its output as ``sink`` (a ``JobRun``'s sink), named even
    when it is the job's default, so that a row measures the format it says.

    :param sink: the output format, ``parquet`` or ``delta``.
    """
    return ["--output-format", sink]


def goal_counts(rows, model: str) -> tuple[int, int]:
    """Goals, and goals ``model`` credited to an impression, among attribution rows (a model may
    give a goal several rows).

    :param rows: attribution rows.
    :param model: the model to count.
    """
    goals = {(r.user_id, r.goal_event_id) for r in rows if r.model == model}
    attributed = {(r.user_id, r.goal_event_id) for r in rows if r.model == model and not r.organic}
    return len(goals), len(attributed)
