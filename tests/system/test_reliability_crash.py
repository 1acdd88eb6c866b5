"""Exactly-once across crashes: the job is SIGKILLed mid-batch, between batches and right after a
state commit, restarted on the same checkpoint each time, and its output still equals what an
uninterrupted run, or the batch oracle, gives: no row missing and none twice.

The crash matrix of ``make test`` kills every source, sink and backend at all three points, in
three runs (all name the job's checkpoint and outputs by ``file://`` URIs):

* A: applyInPandasWithState (the default, per-bucket state) on JSON lines with invalid lines,
  into a Delta changelog and a current table, with allowed lateness and early results;
* B: transformWithState from a Kafka topic with invalid records to a Kafka topic;
* C: transformWithState on the generator's Avro files (the project's own source), into the
  Parquet file sink, with allowed lateness.

A and C (``test_with_allowed_lateness_sigkills_change_no_revision_of_the_changelog``) compare the
changelog with an uninterrupted run's row for row; B
(``test_kafka_input_sigkilled_at_every_kind_of_point_then_restarted_gives_the_oracle``) compares
the topic's distinct keys with the oracle. C also proves that killed micro-batches leave part
files that no log file of the file sink lists, that Spark and the pandas reader
``read_attributions`` both skip them, and that the Avro source's offsets make micro-batch k read
file k across the restarts. The tests marked ``slow`` (``make test-slow``) run the other
configurations: without lateness, each backend on JSON lines and the default one on Avro, into
Parquet, against the oracle; and transformWithState with lateness on JSON lines into Parquet.

The job runs as a separate process (its own JVM) in its own process group, and a kill takes the
whole group (Python driver, JVM, Python workers) with SIGKILL, so nothing gets to shut down
cleanly. Input files are trickled in one at a time (written under a hidden name, then renamed,
so Spark never lists a half-written file) with ``--trigger '1 second' --max-files-per-trigger 1``.

Each kill point is found from the checkpoint itself, not from timing:

* mid-batch: ``offsets/N`` (the batch's plan) exists and ``commits/N`` does not yet;
* between batches: ``commits/N`` exists and no ``offsets/N+1`` yet (the next file is not given);
* right after a state commit: a partition's state version ``N+1`` (``state/0/<p>/N+1.zip``) is
  written and ``commits/N`` is not;
* into Delta (run A), right after the sink's own commit: the changelog's log holds a commit of
  micro-batch ``N`` (its ``userMetadata``) and ``commits/N`` does not, so the restart writes the
  micro-batch again and the changelog must skip it (Delta's ``txnAppId``/``txnVersion``, the
  query's id and the micro-batch's, stable across restarts) while the current table takes it.

After each kill the checkpoint is checked again (the process is dead, so it is frozen) to prove
the kill really happened at that point; a kill that came too late for a window is retried on the
next file. Parquet output is read through Spark (``spark.read.parquet``), which honours the file
sink's ``_spark_metadata`` log, and through readers without Spark, which honour it too: part
files of a killed, uncommitted batch do not count.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from attribution import attribute_batch
from attribution.config import parse_duration_ms
from attribution.oracle import sort_key
from attribution.schema import OUTPUT_FIELDS
from attribution.spark.late_records import read_late_records
from attribution.spark.output import (
    NotAttributionOutput,
    committed_files,
    read_attribution_rows,
    read_attributions,
)
from generators.truth import read_truth
from jobs.attribution_job import parse_args, run
from joins.durations import ms_to_iso
from support import ROOT
from support.commands import suite_jvm_options_without_spark_settings
from support.datasets import FILE_TIME, stage_in_arrival_order
from support.outputs import committed_attributions
from support.reference import dropped_by_spark, folded_rows, revisions_by_goal

JOB = ROOT / "jobs" / "attribution_job.py"
# The checkpoint is polled every FAST_POLL_SECONDS once a kill window is near: the micro-batch
# of the file waited for is planned, so its commit, after which a micro-batch without data may
# be planned within milliseconds, or its partitions' state commits, come next. Before that
# (a JVM's start, the replay of a killed micro-batch: most of the wait) and for the mid-batch
# window (a whole micro-batch wide), every SLOW_POLL_SECONDS.
FAST_POLL_SECONDS = 0.005
SLOW_POLL_SECONDS = 0.05
# Generous: on a loaded 2-core machine a JVM start plus a first micro-batch can take a minute.
WAIT_SECONDS = 300
# The final run takes every file left: with a Delta MERGE per micro-batch, many minutes when
# loaded.
FINAL_RUN_SECONDS = 1200
MAX_ATTEMPTS = 3  # files spent trying to hit a narrow kill window before the test gives up
# Invalid lines mixed into the input: the dead letter (also a file sink) must hold each once.
BAD_LINES = {2: ["{not json", json.dumps({"event_id": "hb-future", "event_type": "heartbeat",
                                           "ts": "9999-01-01T00:00:00Z"})],
             6: [json.dumps({"event_id": "no-user", "event_type": "visit", "url": "/x",
                             "ts": "2024-01-02T00:00:00Z"})]}


# -- the checkpoint as a clock -----------------------------------------------------------------

def _batch_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def latest_offset(checkpoint: Path) -> Optional[int]:
    ids = _batch_ids(checkpoint / "offsets")
    return ids[-1] if ids else None


def committed(checkpoint: Path, batch: int) -> bool:
    return (checkpoint / "commits" / str(batch)).exists()


_source_offsets: dict[tuple, dict] = {}


def source_offset(checkpoint: Path, batch: int) -> dict:
    """The source's end offset that ``offsets/<batch>`` logs (its last line), parsed. Raises
    ``FileNotFoundError``, or ``ValueError``, ``IndexError`` while the file is being written.

    A log file does not change once written, so each is parsed once; the cache's key holds the
    file's inode, size and modification time too, so that a file seen half written, or written
    again, is parsed again."""
    path = checkpoint / "offsets" / str(batch)
    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _source_offsets:
        _source_offsets[key] = json.loads(path.read_text().strip().splitlines()[-1])
    return _source_offsets[key]


def files_in_batch(checkpoint: Path, batch: int) -> int:
    """How many input files batches 0..``batch`` have taken (one file per batch with
    maxFilesPerTrigger=1; a no-data batch repeats the offset): the file source's log offset + 1,
    or for the Avro source the number in the name of the last file read (``upto``), since the
    generator numbers its files from 0 in arrival order."""
    offset = source_offset(checkpoint, batch)
    if "logOffset" in offset:
        return offset["logOffset"] + 1
    return int(Path(offset["upto"][1]).stem.split("-")[-1]) + 1 if offset["upto"] else 0


def uncommitted_parts(output: Path) -> list[Path]:
    """The part files in ``output`` that no log file of its file sink lists."""
    try:
        committed = set(committed_files(output))
    except NotAttributionOutput:  # no log yet
        committed = set()
    return [p for p in output.rglob("part-*.parquet") if p not in committed]


def state_versions_written(checkpoint: Path, batch: int) -> list[Path]:
    """The state checkpoints of ``batch`` (version batch + 1), one per partition done so far."""
    return sorted((checkpoint / "state" / "0").glob(f"[0-9]*/{batch + 1}.zip"))


def batch_taking_file(checkpoint: Path, n_files: int) -> Optional[int]:
    """The first planned batch whose input ends with file number ``n_files`` (1-based), if any
    (a later no-data batch repeats the same source offset)."""
    for batch in _batch_ids(checkpoint / "offsets"):
        try:
            taken = files_in_batch(checkpoint, batch)
        except (ValueError, KeyError, IndexError, FileNotFoundError):
            return None  # being written right now
        if taken == n_files:
            return batch
        if taken > n_files:
            return None
    return None


# -- the job process -----------------------------------------------------------------------

class JobProcess:
    """One run of the attribution job as its own process group, with a log file."""

    def __init__(self, log: Path, args: list[str], env: Optional[dict] = None):
        self.log_path = log
        self.log = open(log, "w")
        # A crash run stands for a user's run: Spark's defaults, its code generation included,
        # not the interpreted expressions of the suite's other JVMs (their JIT tier stays: it
        # changes the cost of a start, not what runs).
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable,
               "SPARK_SUBMIT_OPTS": suite_jvm_options_without_spark_settings(), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, str(JOB), *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: driver, its JVM and the Python workers at once."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=60)
        self.log.close()

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.log.close()
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_until(condition: Callable[[], bool], job: JobProcess, what: str,
               near: Optional[Callable[[], bool]] = None) -> None:
    """Poll until ``condition``: slowly, and fast from the first poll at which ``near`` holds."""
    deadline = time.monotonic() + WAIT_SECONDS
    fast = False
    while not condition():
        if not job.alive():
            raise AssertionError(f"job exited while waiting for {what}:\n{job.output()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{job.output()[-4000:]}")
        fast = fast or (near is not None and near())
        time.sleep(FAST_POLL_SECONDS if fast else SLOW_POLL_SECONDS)


# -- the test -------------------------------------------------------------------------------

class Trickle:
    """Hands the dataset's files to the job's input directory one at a time, atomically."""

    def __init__(self, files: list[Path], events_dir: Path):
        self.files, self.events_dir, self.given = files, events_dir, 0
        events_dir.mkdir(parents=True)

    @property
    def options(self) -> list[str]:
        """The job's input options: the directory, one file per micro-batch."""
        return ["--events", str(self.events_dir), "--max-files-per-trigger", "1"]

    def batch_taking(self, checkpoint: Path, n: int) -> Optional[int]:
        """The first planned batch whose input ends with the ``n``-th file given."""
        return batch_taking_file(checkpoint, n)

    @property
    def remaining(self) -> int:
        return len(self.files) - self.given

    def give_next(self) -> int:
        """Hand the next file over; returns how many were given."""
        if not self.remaining:
            raise AssertionError("the dataset ran out of files before every kill point was hit")
        self.give(self.files[self.given])
        self.given += 1
        return self.given

    def give(self, source: Path) -> None:
        hidden = self.events_dir / f".{source.name}.tmp"  # Spark skips dot-files
        shutil.copy(source, hidden)
        mtime = FILE_TIME + self.given
        os.utime(hidden, (mtime, mtime))
        hidden.rename(self.events_dir / source.name)


class CrashedRun:
    """The job run on trickled files with a SIGKILL at each kind of point and a restart on the
    same checkpoint after each; the final run processes every file left and stops."""

    def __init__(self, tmp_path: Path, files: list[Path], options: list[str],
                 env: Optional[dict] = None, trickle=None,
                 output_format: Optional[str] = "parquet",
                 after_kill: Optional[Callable[[], None]] = None,
                 sink_committed: Optional[Callable[[int], bool]] = None):
        """The job is given its checkpoint and outputs as ``file://`` URIs, which it reads and
        writes through Hadoop's file system (the code path of ``hdfs://``); the test reads them
        as the local directories they are.

        :param output_format: ``--output-format`` (``None``: none, as with ``--output-topic``).
        :param after_kill: called after each kill that landed, before the restart (a look at
            what readers see in a killed job's output).
        :param sink_committed: whether the sink committed a micro-batch of its own (its id ->
            bool), for a sink whose commit is not Spark's (Delta): given, one more kill lands
            after that commit and before Spark's."""
        self.after_kill, self.sink_committed = after_kill, sink_committed
        self.trickle = trickle or Trickle(files, tmp_path / "events")
        self.output_format = output_format
        # Parquet part files that no log lists prove a kill after the rows were written; a
        # topic, and a Delta table, whose commit is Delta's, are checked by the state alone.
        self.file_output = "--output-topic" not in options and output_format == "parquet"
        self.checkpoint, self.output = tmp_path / "checkpoint", tmp_path / "out"
        self.dead, self.late = tmp_path / "dead", tmp_path / "late"
        self.tmp_path, self.options, self.env = tmp_path, options, env
        self.runs = 0
        self.kills: list[str] = []
        self.job = self.start()

    def start(self, trigger: str = "1 second") -> JobProcess:
        self.runs += 1
        return JobProcess(self.tmp_path / f"run-{self.runs}.log", [
            *self.trickle.options, "--output", self.given(self.output),
            *(["--output-format", self.output_format] if self.output_format else []),
            "--checkpoint", self.given(self.checkpoint), "--dead-letter", self.given(self.dead),
            "--late-records", self.given(self.late), "--trigger", trigger,
            "--master", "local[2]", "--shuffle-partitions", "2", *self.options], self.env)

    @staticmethod
    def given(path: Path) -> str:
        """``path`` as the job is given it: a ``file://`` URI."""
        return path.as_uri()

    def planned(self, n: int) -> Optional[int]:
        return self.trickle.batch_taking(self.checkpoint, n)

    def done(self, n: int) -> bool:
        return (b := self.planned(n)) is not None and committed(self.checkpoint, b)

    def kill_at(self, kind: str, ready: Callable[[int], bool],
                verify: Callable[[int], bool], near: Optional[Callable[[int], bool]] = None
                ) -> None:
        """Give the next file, SIGKILL the job once ``ready``, then check from the frozen
        checkpoint that the kill landed where it should; retry on the next file if it did not.
        The checkpoint is polled fast once ``near`` holds (always slowly without it)."""
        for attempt in range(MAX_ATTEMPTS):
            n = self.trickle.give_next()
            wait_until(lambda: ready(n), self.job, f"{kind} point of file {n}",
                       near=(lambda: near(n)) if near is not None else None)
            self.job.kill()
            if verify(n):
                self.kills.append(kind)
                if self.after_kill is not None:
                    self.after_kill()
                return
            self.job = self.start()  # missed the window: restart on the same checkpoint, retry
        raise AssertionError(f"no kill landed {kind} in {MAX_ATTEMPTS} tries")

    def kill_after_batch_step(self, kind: str, step_done: Callable[[int], bool]) -> None:
        """``kill_at`` once a step of the micro-batch taking the next file is done (``step_done``
        of its id: a state commit, the sink's own commit) and Spark's commit is not written yet.
        """
        checkpoint, planned = self.checkpoint, self.planned
        self.kill_at(kind,
                     ready=lambda n: (b := planned(n)) is not None
                     and (step_done(b) or committed(checkpoint, b)),
                     verify=lambda n: step_done(planned(n))
                     and not committed(checkpoint, planned(n)),
                     near=lambda n: planned(n) is not None)

    def run(self) -> str:
        """Every kind of kill, then the rest of the files; returns the final run's output."""
        checkpoint, planned, done = self.checkpoint, self.planned, self.done
        try:
            n = self.trickle.give_next()
            wait_until(lambda: done(n), self.job, f"file {n} committed")
            self.kill_at("mid-batch",
                         ready=lambda n: planned(n) is not None,
                         verify=lambda n: not committed(checkpoint, planned(n)))
            self.job = self.start()  # every restart uses the same checkpoint
            self.kill_at("between batches",
                         ready=done,
                         verify=lambda n: done(n) and latest_offset(checkpoint) == planned(n),
                         near=lambda n: planned(n) is not None)
            self.job = self.start()
            # A task commits its partition's state after writing its rows, whose part file no
            # log file lists until the whole batch commits. This kill, or an earlier one, must
            # leave such a file behind, for the readers to prove they skip it.
            # (Output to a topic has no part files: there the state version alone.)
            def written(b: int) -> bool:
                return bool(state_versions_written(checkpoint, b)) and (
                    not self.file_output or bool(uncommitted_parts(self.output)))

            self.kill_after_batch_step("after state commit", written)

            if self.sink_committed is not None:
                self.job = self.start()
                self.kill_after_batch_step("after the sink's commit", self.sink_committed)

            # The rest of the files, then a run that processes everything pending and stops.
            while self.trickle.remaining:
                self.trickle.give_next()
            self.job = self.start(trigger="available-now")
            code = self.job.wait(timeout=FINAL_RUN_SECONDS)
            assert code == 0, self.job.output()[-4000:]
        finally:
            self.job.kill()
        assert self.kills == ["mid-batch", "between batches", "after state commit",
                              *(["after the sink's commit"] if self.sink_committed else [])]
        return self.job.output()


def with_bad_lines(files: list[Path], dest: Path) -> list[Path]:
    """Copies of the JSON-lines ``files`` under ``dest`` with ``BAD_LINES`` appended."""
    dest.mkdir(parents=True)
    out = []
    for n, f in enumerate(files):
        lines = f.read_text().splitlines() + BAD_LINES.get(n, [])
        (dest / f.name).write_text("\n".join(lines) + "\n")
        out.append(dest / f.name)
    return out


def assert_dead_letter_exactly_once(spark, dead: Path) -> None:
    dead_rows = spark.read.parquet(str(dead)).collect()
    expected_dead = sorted(line for lines in BAD_LINES.values() for line in lines)
    assert sorted(r.raw_record for r in dead_rows) == expected_dead


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from generators.dataset import generate
    from generators.params import GeneratorParams

    out = tmp_path_factory.mktemp("crash-data")
    params = GeneratorParams(users=15, seed=23, files=6, heartbeat=True, disorder="bounded",
                             max_delay="2 minutes", redelivery_rate=0.05,
                             watermark_delay="10 minutes")
    result = generate(params, out / "data", plot=False)
    assert result.manifest["disorder"]["no_late_events"] is True
    truth = sorted(read_truth(result.truth_path), key=sort_key)
    assert len(truth) > 10 and any(r.organic for r in truth) and any(r.trail for r in truth)
    return with_bad_lines(result.event_files, out / "files"), truth


@pytest.fixture(scope="module")
def avro_dataset(tmp_path_factory):
    """The generator's Avro files (no invalid records: Avro cannot hold a malformed line) and
    their truth."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    out = tmp_path_factory.mktemp("crash-avro")
    params = GeneratorParams(users=15, seed=23, files=6, heartbeat=True, disorder="bounded",
                             max_delay="2 minutes", redelivery_rate=0.05,
                             watermark_delay="10 minutes", format="avro")
    result = generate(params, out / "data", plot=False)
    assert result.manifest["disorder"]["no_late_events"] is True
    assert [f.suffix for f in result.event_files] == [".avro"] * len(result.event_files)
    return list(result.event_files), sorted(read_truth(result.truth_path), key=sort_key)


def frame_rows(frame) -> list:
    """The rows of a ``read_attributions`` frame as core rows: epoch-ms times, None for nulls."""
    import pandas as pd

    from attribution.core import Attribution

    def value(v):
        if isinstance(v, pd.Timestamp):
            return v.value // 1_000_000
        if hasattr(v, "__len__") and not isinstance(v, str):  # the trail
            return tuple(v)
        return None if pd.isna(v) else v

    return sorted((Attribution(*map(value, record))
                   for record in frame[list(OUTPUT_FIELDS)].itertuples(index=False)),
                  key=sort_key)


# The second tier (make test-slow): both backends on JSON lines; Avro input (the project's own
# source, the same for both backends) on the default one. The matrix of make test kills the same
# sources and sinks with lateness on. Every crash test names the job's checkpoint and outputs by
# file:// URIs: the job's own reads and writes beside Spark's (layout pinning, late-record audit,
# users at restart, the Delta sink) then take Hadoop's file system, as on hdfs://.
@pytest.mark.slow
@pytest.mark.parametrize("backend,fmt", [("applyInPandasWithState", "json"),
                                         ("transformWithState", "json"),
                                         ("applyInPandasWithState", "avro")])
def test_sigkill_at_every_kind_of_point_then_restart_gives_the_oracle_exactly(
        spark, tmp_path, request, backend, fmt):
    files, truth = request.getfixturevalue("avro_dataset" if fmt == "avro" else "dataset")
    crashed = CrashedRun(tmp_path, files, ["--backend", backend, "--format", fmt,
                                           "--watermark-delay", "10 minutes"])
    final = crashed.run()
    assert "attribution stream run" in final and "invalid" in final
    # The late-record audit ran on every committed micro-batch, wherever the checkpoint is.
    assert f" in {crashed.given(crashed.late)}" in final
    audited = {int(p.name) for p in (crashed.late / "_audited").iterdir() if p.name.isdigit()}
    assert audited == set(_batch_ids(crashed.checkpoint / "commits")), audited

    rows = committed_attributions(spark, crashed.output)
    assert len({r.goal_event_id for r in rows}) == len(rows), "a goal was written twice"
    assert rows == truth
    # Killed micro-batches left part files in the directory; the pandas reader skips them.
    assert uncommitted_parts(crashed.output)
    assert frame_rows(read_attributions(crashed.output)) == truth

    if fmt == "avro":  # the Avro files hold no invalid record
        assert committed_files(crashed.dead) == []
        return
    assert_dead_letter_exactly_once(spark, crashed.dead)


# -- Kafka input, and the changelog out to a topic ---------------------------------------------

class TopicTrickle(Trickle):
    """Produces the dataset to a topic of 3 partitions one file's records at a time (each
    line one record, keyed by its user, an invalid line by ``invalid``); without a per-trigger
    limit a micro-batch takes what was produced when it was planned, so a file given after the
    previous one was committed is one micro-batch, as with files."""

    def __init__(self, files: list[Path], bootstrap: str, topic: str):
        from generators.params import KafkaTarget
        from generators.topic import TopicWriter

        self.files, self.bootstrap, self.topic, self.given = files, bootstrap, topic, 0
        self.writer = TopicWriter(KafkaTarget(bootstrap, topic, kafka_partitions=3), "json")
        self.produced = [0]  # records produced once 0, 1, ... files were given

    @property
    def options(self) -> list[str]:
        return ["--kafka-bootstrap-servers", self.bootstrap, "--kafka-topics", self.topic]

    def give(self, source: Path) -> None:
        records = []
        for line in source.read_text().splitlines():
            try:
                key = json.loads(line).get("user_id") or "heartbeat"
            except (ValueError, AttributeError):
                key = "invalid"
            records.append((key, line.encode()))
        self.writer.send(records)
        self.writer.flush()
        self.produced.append(self.produced[-1] + len(records))

    def batch_taking(self, checkpoint: Path, n: int) -> Optional[int]:
        """The first planned batch whose end offsets add up to the records of ``n`` files."""
        for batch in _batch_ids(checkpoint / "offsets"):
            try:
                taken = sum(source_offset(checkpoint, batch)[self.topic].values())
            except (ValueError, KeyError, IndexError, FileNotFoundError):
                return None  # being written right now
            if taken == self.produced[n]:
                return batch
            if taken > self.produced[n]:
                return None
        return None

    def close(self) -> None:
        self.writer.close()


def test_kafka_input_sigkilled_at_every_kind_of_point_then_restarted_gives_the_oracle(
        spark, tmp_path, dataset, kafka_bootstrap):
    """Kafka in and out: the input offsets live in the checkpoint, so the topic's records are
    each used once; the output topic (at least once) may repeat records, and its distinct keys
    are exactly the oracle's rows, read by the consumer's rule."""
    from attribution.spark.kafka_output import changelog_rows, read_changelog, read_topic
    from generators.params import KafkaTarget
    from generators.topic import ensure_topic

    files, truth = dataset
    suffix = uuid.uuid4().hex[:8]
    out_topic = f"crash-out-{suffix}"
    ensure_topic(KafkaTarget(kafka_bootstrap, out_topic, kafka_partitions=3))
    trickle = TopicTrickle(files, kafka_bootstrap, f"crash-in-{suffix}")
    crashed = CrashedRun(tmp_path, files, ["--watermark-delay", "10 minutes", "--output-topic",
                                           out_topic, "--backend", "transformWithState"],
                         trickle=trickle, output_format=None)
    try:
        final = crashed.run()
    finally:
        trickle.close()
    assert "attribution stream run" in final
    assert_dead_letter_exactly_once(spark, crashed.dead)
    rows = sorted(changelog_rows(read_changelog(kafka_bootstrap, out_topic)), key=sort_key)
    assert rows == truth
    keys = [r.key for r in read_topic(kafka_bootstrap, out_topic)]
    assert len(set(keys)) == len(truth) <= len(keys)


# -- with allowed lateness: the changelog of revisions across crashes -----------------------------

LATENESS = "8 hours"
# Without micro-batches that carry no data, micro-batch k reads file k whatever the timing of
# trickling, kills and restarts, so which records are late, and which rows each micro-batch
# revises, are the same in every run: the changelogs can be compared row for row. A trailing
# heartbeat file then lets one more micro-batch fire what the generator's heartbeat made due.
ONE_FILE_PER_BATCH = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}


def generate_late_dataset(out: Path, fmt: str) -> tuple[list[Path], list[list]]:
    """Impressions that arrive hours after the visits they led to, so that some goals are first
    written without them and revised when they come, and some arrive too late even for the
    allowed lateness, in files of ``fmt`` (``json``, with ``BAD_LINES`` added, or ``avro``)
    under ``out``, the trailing heartbeat file included; the files, and the records of each."""
    from attribution.spark.files import read_events
    from generators.dataset import generate
    from generators.params import GeneratorParams
    from generators.writers import heartbeat_record, part_name, write_events_file

    params = GeneratorParams(users=20, seed=61, files=8, heartbeat=True, span="2 days",
                             total_span="3 days", goal_fraction=0.4, paid_session_prob=0.9,
                             disorder="per-source", impression_lag="10 hours",
                             visit_lag="0 seconds", lag_jitter="10 hours", late_fraction=0.06,
                             redelivery_rate=0.05, watermark_delay="10 minutes", format=fmt)
    result = generate(params, out / "data", truth=False, plot=False)
    assert [f.suffix for f in result.event_files] == [f".{fmt}"] * len(result.event_files)
    heartbeat = result.manifest["heartbeat"]
    last = result.events_dir / part_name(len(result.event_files), fmt)
    if fmt == "json":
        last.write_text(json.dumps({"event_id": "hb-flush", "event_type": "heartbeat",
                                    "ts": ms_to_iso(heartbeat["ts_ms"] + 1)}) + "\n")
        files = with_bad_lines([*result.event_files, last], out / "files")
    else:
        # The generator's own heartbeat file, as Avro (a heartbeat file needs no vocabulary).
        flush = {**heartbeat_record(heartbeat["ts_ms"] + 1, 0), "event_id": "hb-flush"}
        write_events_file(last, fmt, None, None, params.seed, heartbeat=flush)
        files = [*result.event_files, last]  # Avro cannot hold a malformed line
    return files, [read_events(f) for f in [*result.event_files, last]]


@pytest.fixture(scope="module")
def late_dataset(tmp_path_factory):
    """The late dataset (``generate_late_dataset``) in JSON lines, with invalid lines."""
    return generate_late_dataset(tmp_path_factory.mktemp("crash-late-data"), "json")


@pytest.fixture(scope="module")
def late_avro_dataset(tmp_path_factory):
    """The late dataset (``generate_late_dataset``) in the generator's Avro files."""
    return generate_late_dataset(tmp_path_factory.mktemp("crash-late-avro"), "avro")


class DeltaTablesAtKills:
    """What a reader outside Spark (the ``deltalake`` package: committed versions only) sees of a
    crashed run's Delta changelog and current table right after each kill, and the checks of both
    tables against those of an uninterrupted run."""

    def __init__(self, changelog: Path, current: Path):
        self.paths = {"out": changelog, "current": current}
        self.seen: list[tuple[str, Optional[int], list]] = []  # (table, last micro-batch, rows)
        self._batch_of_commit: dict[str, Optional[int]] = {}  # log file -> micro-batch

    def changelog_committed(self, batch: int) -> bool:
        """Whether the changelog's log holds a commit of micro-batch ``batch`` (read from its
        commit files' ``userMetadata``; Delta publishes a commit file whole, by a rename, and never
        changes it, so each is read once)."""
        log = self.paths["out"] / "_delta_log"
        if not log.is_dir():
            return False
        for commit in log.glob("[0-9]*.json"):
            if commit.name not in self._batch_of_commit:
                self._batch_of_commit[commit.name] = next(
                    (json.loads(info["userMetadata"])["batch_id"]
                     for info in (json.loads(line).get("commitInfo")
                                  for line in commit.read_text().splitlines() if line)
                     if info and info.get("userMetadata")), None)
            if self._batch_of_commit[commit.name] == batch:
                return True
        return False

    @staticmethod
    def rows(table) -> list:
        return sorted(map(repr, table.to_pyarrow_table().to_pylist()))

    @staticmethod
    def versions_by_batch(table) -> dict[int, int]:
        return {json.loads(c["userMetadata"])["batch_id"]: c["version"]
                for c in table.history() if c.get("userMetadata")}

    def look(self) -> None:
        """Read both tables as they are now (called right after a kill)."""
        from deltalake import DeltaTable

        for name, path in self.paths.items():
            if (path / "_delta_log").is_dir():
                table = DeltaTable(str(path))
                self.seen.append((name, max(self.versions_by_batch(table), default=None),
                                  self.rows(table)))

    def assert_as_uninterrupted(self, reference: Path, batches: int, kills: int) -> None:
        """Each table equals the uninterrupted run's (the same names under ``reference``) and holds
        each of the ``batches`` micro-batches' commits once; after each of the ``kills``, each
        held whole micro-batches only: the uninterrupted run's table as of the same one."""
        from deltalake import DeltaTable

        tables = {name: reference / name for name in self.paths}
        for name, path in self.paths.items():
            crashed_log, reference_log = DeltaTable(str(path)), DeltaTable(str(tables[name]))
            assert self.rows(crashed_log) == self.rows(reference_log), name
            # Each micro-batch committed once: its commit, and only one, carries its id.
            assert sorted(self.versions_by_batch(crashed_log)) == list(range(batches))
            assert len([c for c in crashed_log.history() if c.get("userMetadata")]) == batches
        # (The current table is created, empty, when the query first starts: both are there.)
        assert [name for name, _, _ in self.seen] == ["out", "current"] * kills
        for name, last, at_kill in self.seen:
            if last is None:  # no micro-batch committed yet
                assert at_kill == [], name
                continue
            version = self.versions_by_batch(DeltaTable(str(tables[name])))[last]
            assert at_kill == self.rows(DeltaTable(str(tables[name]), version=version)), \
                (name, last)
        assert any(at_kill for _, _, at_kill in self.seen)


# name: (job options, input format, output format). Runs A and C of the matrix, each backend
# once: applyInPandasWithState (the default) with early results on JSON lines into a Delta
# changelog and a current table (--current-table), both of which a reader outside Spark also
# looks at after every kill; transformWithState on the generator's Avro files into Parquet files.
# The second tier adds transformWithState on JSON lines into Parquet files.
LATENESS_RUNS = {"applyInPandasWithState-delta": (["--backend", "applyInPandasWithState",
                                                   "--early-results"], "json", "delta"),
                 "transformWithState-avro": (["--backend", "transformWithState",
                                              "--format", "avro"], "avro", "parquet"),
                 "transformWithState-parquet": (["--backend", "transformWithState"], "json",
                                                "parquet")}
SLOW_LATENESS_RUNS = {"transformWithState-parquet"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in SLOW_LATENESS_RUNS else name
                                  for name in LATENESS_RUNS])
def test_with_allowed_lateness_sigkills_change_no_revision_of_the_changelog(
        spark, tmp_path, request, subtests, name):
    """SIGKILLs at every kind of point with an allowed lateness that late impressions fall
    within: the changelog, every goal's revisions and signs, equals that of an uninterrupted
    run of the same files, its net table is the oracle over the accepted records, and the
    late-record output holds the dropped records once. Into Delta, the current table equals the
    uninterrupted run's too, each table's history holds every micro-batch's commit once (also
    after a kill between the changelog's commit of a micro-batch and Spark's, whose restart writes
    that micro-batch again), and after every kill each table held whole micro-batches only. On
    Avro files into Parquet, the Avro source's offsets made micro-batch k read file k alone
    across every restart, killed micro-batches left part files that no log file lists, Spark's
    read and the pandas reader ``read_attributions`` both give the committed changelog without
    them, the late-record audit ran on every committed micro-batch, and the dead letter is
    empty."""
    job_options, input_format, output_format = LATENESS_RUNS[name]
    files, records = request.getfixturevalue(
        "late_avro_dataset" if input_format == "avro" else "late_dataset")
    options = [*job_options, "--watermark-delay", "10 minutes", "--allowed-lateness", LATENESS]
    crashed_dir, reference = tmp_path / "crashed", tmp_path / "uninterrupted"
    tables = (DeltaTablesAtKills(crashed_dir / "out", crashed_dir / "current")
              if output_format == "delta" else None)

    def current_table(location: str) -> list[str]:
        return ["--current-table", location] if tables else []

    submit = " ".join(f"--conf {k}={v}" for k, v in ONE_FILE_PER_BATCH.items())
    crashed_options = [*options, *current_table((crashed_dir / "current").as_uri())]
    crashed = CrashedRun(crashed_dir, files, crashed_options, output_format=output_format,
                         after_kill=tables.look if tables else None,
                         sink_committed=tables.changelog_committed if tables else None,
                         env={"PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"})
    final = crashed.run()
    last_batch = latest_offset(crashed.checkpoint)
    assert last_batch == len(files) - 1
    assert [files_in_batch(crashed.checkpoint, b) for b in range(last_batch + 1)] == \
        list(range(1, len(files) + 1))

    staged = stage_in_arrival_order(files, reference / "events")
    args = parse_args(["--events", str(staged), "--output", str(reference / "out"),
                       "--output-format", output_format,
                       "--checkpoint", str(reference / "checkpoint"), "--quiet",
                       "--max-files-per-trigger", "1", *options,
                       *current_table(str(reference / "current"))])
    with spark_conf(spark, ONE_FILE_PER_BATCH):
        report = run(spark, args)
    assert report.batches == len(files)

    changelog = sorted(read_attribution_rows(crashed.output), key=_changelog_order)
    expected = sorted(read_attribution_rows(reference / "out"), key=_changelog_order)
    assert changelog == expected
    revisions = revisions_by_goal(changelog)
    assert all(seen == set(range(len(seen))) for seen in revisions.values())
    assert sum(len(seen) > 1 for seen in revisions.values()) >= 3  # revisions to compare
    assert folded_rows(changelog) == folded_rows(expected)

    dropped = dropped_by_spark(records, parse_duration_ms("10 minutes")
                               + parse_duration_ms(LATENESS))
    gone = {id(e) for lost in dropped.values() for e in lost}
    accepted = [e for batch in records for e in batch
                if e.event_type != "heartbeat" and id(e) not in gone]
    assert folded_rows(changelog) == attribute_batch(accepted)

    late = _late_records(crashed.late)
    assert late == _late_records(args.late_records)
    assert sorted(event_id for event_id, *_ in late) == sorted(
        e.event_id for lost in dropped.values() for e in lost)
    assert late  # some records were too late even for the allowed lateness
    if input_format == "avro":
        assert_avro_into_parquet(spark, subtests, crashed, files, final, changelog)
    else:
        assert_dead_letter_exactly_once(spark, crashed.dead)
    if tables is not None:
        tables.assert_as_uninterrupted(reference, last_batch + 1, len(crashed.kills))


def assert_avro_into_parquet(spark, subtests, crashed: CrashedRun, files: list[Path], final: str,
                             changelog: list) -> None:
    """The checks of a crashed run on Avro files into Parquet, each a subtest: the ``files``
    trickled, the final run's log ``final``, and ``changelog``, the committed rows read without
    Spark (``read_attribution_rows``) in ``_changelog_order``."""
    checkpoint, output = crashed.checkpoint, crashed.output
    with subtests.test(msg="the Avro source's offsets: micro-batch k read file k alone"):
        read = [[Path(f).name for f in source_offset(checkpoint, b)["files"]]
                for b in _batch_ids(checkpoint / "offsets")]
        assert read == [[f.name] for f in files]
    with subtests.test(msg="the final run ran, and counted invalid records"):
        assert "attribution stream run" in final and "invalid" in final
    with subtests.test(msg="the late-record audit ran on every committed micro-batch"):
        assert f" in {crashed.given(crashed.late)}" in final
        audited = {int(p.name) for p in (crashed.late / "_audited").iterdir()
                   if p.name.isdigit()}
        assert audited == set(_batch_ids(checkpoint / "commits")), audited
    with subtests.test(msg="killed micro-batches left part files that no log file lists"):
        assert uncommitted_parts(output)
    with subtests.test(msg="Spark's read of the output gives the committed changelog"):
        assert sorted(committed_attributions(spark, output), key=_changelog_order) == changelog
    with subtests.test(msg="read_attributions (pandas) gives the committed changelog"):
        assert sorted(frame_rows(read_attributions(output)), key=_changelog_order) == changelog
    with subtests.test(msg="the dead letter is empty: Avro holds no malformed line"):
        assert committed_files(crashed.dead) == []


def _changelog_order(r) -> tuple:
    return (*sort_key(r), r.revision, r.sign)


def _late_records(directory) -> list[tuple]:
    """The late-record output as (event id, file name, micro-batch, watermark), sorted."""
    return sorted((json.loads(r["raw_record"])["event_id"], r["source_file"].rsplit("/", 1)[-1],
                   r["batch_id"], r["watermark"])
                  for r in read_late_records(str(directory)).to_pylist())


@contextmanager
def spark_conf(spark, conf: dict) -> Iterator[None]:
    """Set the session's ``conf`` (key -> value) while inside, then restore it."""
    saved = {key: spark.conf.get(key, None) for key in conf}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
