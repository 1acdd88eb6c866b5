"""Exactly-once across crashes: the job is SIGKILLed mid-batch, between batches and right after a
state commit, restarted on the same checkpoint each time, and its output still equals the batch
oracle row for row, with no row missing and none twice. Both backends.

The job runs as a separate process (its own JVM) in its own process group, and a kill takes the
whole group (Python driver, JVM, Python workers) with SIGKILL, so nothing gets to shut down
cleanly. Input files are trickled in one at a time (written under a hidden name, then renamed,
so Spark never lists a half-written file) with ``--trigger '1 second' --max-files-per-trigger 1``.

Each kill point is found from the checkpoint itself, not from timing:

* mid-batch: ``offsets/N`` (the batch's plan) exists and ``commits/N`` does not yet;
* between batches: ``commits/N`` exists and no ``offsets/N+1`` yet (the next file is not given);
* right after a state commit: a partition's state version ``N+1`` (``state/0/<p>/N+1.zip``) is
  written and ``commits/N`` is not.

After each kill the checkpoint is checked again (the process is dead, so it is frozen) to prove
the kill really happened at that point; a kill that came too late for a window is retried on the
next file. The output is read through Spark (``spark.read.parquet``), which honours the file
sink's ``_spark_metadata`` log: part files of a killed, uncommitted batch do not count.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from attribution.oracle import sort_key
from attribution.spark.output import read_attribution_rows
from support import FILE_TIME, ROOT, committed_attributions

JOB = ROOT / "jobs" / "attribution_job.py"
POLL_SECONDS = 0.005
# Generous: on a loaded 2-core machine a JVM start plus a first micro-batch can take a minute.
WAIT_SECONDS = 300
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


def files_in_batch(checkpoint: Path, batch: int) -> int:
    """How many input files batches 0..``batch`` have taken: the file source's log offset + 1
    (one file per batch with maxFilesPerTrigger=1; a no-data batch repeats the offset)."""
    last_line = (checkpoint / "offsets" / str(batch)).read_text().strip().splitlines()[-1]
    return json.loads(last_line)["logOffset"] + 1


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

    def __init__(self, log: Path, args: list[str]):
        self.log_path = log
        self.log = open(log, "w")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
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


def wait_until(condition: Callable[[], bool], job: JobProcess, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if not job.alive():
            raise AssertionError(f"job exited while waiting for {what}:\n{job.output()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{job.output()[-4000:]}")
        time.sleep(POLL_SECONDS)


# -- the test -------------------------------------------------------------------------------

class Trickle:
    """Hands the dataset's files to the job's input directory one at a time, atomically."""

    def __init__(self, files: list[Path], events_dir: Path):
        self.files, self.events_dir, self.given = files, events_dir, 0
        events_dir.mkdir(parents=True)

    @property
    def remaining(self) -> int:
        return len(self.files) - self.given

    def give_next(self) -> int:
        if not self.remaining:
            raise AssertionError("the dataset ran out of files before every kill point was hit")
        source = self.files[self.given]
        hidden = self.events_dir / f".{source.name}.tmp"  # Spark skips dot-files
        shutil.copy(source, hidden)
        mtime = FILE_TIME + self.given
        os.utime(hidden, (mtime, mtime))
        hidden.rename(self.events_dir / source.name)
        self.given += 1
        return self.given


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
    truth = sorted(read_attribution_rows(result.truth_path), key=sort_key)
    assert len(truth) > 10 and any(r.organic for r in truth) and any(r.trail for r in truth)
    files = []
    for n, f in enumerate(result.event_files):
        target = out / "files" / f.name
        target.parent.mkdir(exist_ok=True)
        lines = f.read_text().splitlines() + BAD_LINES.get(n, [])
        target.write_text("\n".join(lines) + "\n")
        files.append(target)
    return files, truth


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["applyInPandasWithState", "transformWithState"])
def test_sigkill_at_every_kind_of_point_then_restart_gives_the_oracle_exactly(
        spark, tmp_path, dataset, backend):
    files, truth = dataset
    trickle = Trickle(files, tmp_path / "events")
    checkpoint, output, dead = tmp_path / "checkpoint", tmp_path / "out", tmp_path / "dead"
    runs = 0

    def start(trigger: str = "1 second") -> JobProcess:
        nonlocal runs
        runs += 1
        return JobProcess(tmp_path / f"run-{runs}.log", [
            "--events", str(trickle.events_dir), "--output", str(output),
            "--checkpoint", str(checkpoint), "--dead-letter", str(dead), "--backend", backend,
            "--trigger", trigger, "--max-files-per-trigger", "1", "--master", "local[2]",
            "--shuffle-partitions", "2", "--watermark-delay", "10 minutes"])

    def planned(n: int) -> Optional[int]:
        return batch_taking_file(checkpoint, n)

    def done(n: int) -> bool:
        return (b := planned(n)) is not None and committed(checkpoint, b)

    kills: list[str] = []
    job = start()

    def kill_at(kind: str, ready: Callable[[int], bool], verify: Callable[[int], bool]) -> None:
        """Give the next file, SIGKILL the job once ``ready``, then check from the frozen
        checkpoint that the kill landed where it should; retry on the next file if it did not."""
        nonlocal job
        for attempt in range(MAX_ATTEMPTS):
            n = trickle.give_next()
            wait_until(lambda: ready(n), job, f"{kind} point of file {n}")
            job.kill()
            if verify(n):
                kills.append(kind)
                return
            job = start()  # missed the window: restart on the same checkpoint and try again
        raise AssertionError(f"no kill landed {kind} in {MAX_ATTEMPTS} tries")

    try:
        n = trickle.give_next()
        wait_until(lambda: done(n), job, f"file {n} committed")
        kill_at("mid-batch",
                ready=lambda n: planned(n) is not None,
                verify=lambda n: not committed(checkpoint, planned(n)))
        job = start()  # every restart uses the same checkpoint
        kill_at("between batches",
                ready=done,
                verify=lambda n: done(n) and latest_offset(checkpoint) == planned(n))
        job = start()
        kill_at("after state commit",
                ready=lambda n: (b := planned(n)) is not None
                and bool(state_versions_written(checkpoint, b) or committed(checkpoint, b)),
                verify=lambda n: bool(state_versions_written(checkpoint, planned(n)))
                and not committed(checkpoint, planned(n)))

        # The rest of the files, then a run that processes everything still pending and stops.
        while trickle.remaining:
            trickle.give_next()
        job = start(trigger="available-now")
        code = job.wait(timeout=WAIT_SECONDS)
        assert code == 0, job.output()[-4000:]
    finally:
        job.kill()

    assert kills == ["mid-batch", "between batches", "after state commit"]
    final = job.output()
    assert "attribution stream run" in final and "invalid" in final

    rows = committed_attributions(spark, output)
    assert len({r.goal_event_id for r in rows}) == len(rows), "a goal was written twice"
    assert rows == truth

    dead_rows = spark.read.parquet(str(dead)).collect()
    expected_dead = sorted(line for lines in BAD_LINES.values() for line in lines)
    assert sorted(r.raw_record for r in dead_rows) == expected_dead
