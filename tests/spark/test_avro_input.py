"""Avro input: the job reads the generator's Avro files through the project's Python source, with
the same rows as its Parquet files of the same seed, and corrupt files or blocks dead-lettered."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from attribution.oracle import sort_key
from attribution.spark.avro_source import list_files, read_file
from attribution.spark.output import read_attribution_rows
from generators.truth import read_truth
from jobs.attribution_job import parse_args, run
from support.datasets import FILE_TIME, stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT

MODES = {"applyInPandasWithState": ["--backend", "applyInPandasWithState"],
         "transformWithState": ["--backend", "transformWithState"],
         "batch": ["--mode", "batch"]}


@pytest.fixture(scope="module")
def same_seed(tmp_path_factory):
    """One seed generated as Avro and as Parquet, with its truth."""
    from generators.dataset import generate
    from generators.params import GeneratorParams

    root = tmp_path_factory.mktemp("avro-vs-parquet")
    out = {}
    for fmt in ("avro", "parquet"):
        params = GeneratorParams(users=40, seed=11, files=4, heartbeat=True, format=fmt,
                                 disorder="bounded", max_delay="2 minutes",
                                 redelivery_rate=0.03, watermark_delay="10 minutes")
        out[fmt] = generate(params, root / fmt, plot=False)
    return out


def _run(spark, tmp_path: Path, events: Path, fmt: str, *options: str):
    args = parse_args(["--events", str(events), "--format", fmt,
                       "--output", str(tmp_path / f"out-{fmt}"),
                       "--dead-letter", str(tmp_path / f"dead-{fmt}"),
                       "--checkpoint", str(tmp_path / f"cp-{fmt}"), "--quiet", *PARQUET_OUTPUT,
                       *options])
    report = run(spark, args)
    return report, sorted(read_attribution_rows(tmp_path / f"out-{fmt}"), key=sort_key)


@pytest.mark.parametrize("mode", list(MODES))
def test_avro_input_gives_the_rows_of_parquet_input_of_the_same_seed(spark, tmp_path, same_seed,
                                                                      mode):
    rows = {}
    for fmt, result in same_seed.items():
        staged = stage_in_arrival_order(result.event_files, tmp_path / f"in-{fmt}")
        report, rows[fmt] = _run(spark, tmp_path, staged, fmt, "--max-files-per-trigger", "1",
                                 *MODES[mode])
        assert report.goals == len(rows[fmt]) > 0
    truth = sorted(read_truth(same_seed["parquet"].truth_path), key=sort_key)
    assert rows["avro"] == rows["parquet"] == truth


def _corrupt_block_copy(source: str, target: Path) -> None:
    """A copy of an Avro file with bytes in its middle block overwritten."""
    data = Path(source).read_bytes()
    mid = len(data) // 2
    target.write_bytes(data[:mid] + b"\xff" * 40 + data[mid + 40:])


def test_a_corrupt_block_loses_its_own_records_only(tmp_path, same_seed):
    source = same_seed["avro"].event_files[0]
    whole = [r for r, _ in read_file(str(source))]
    damaged = tmp_path / "damaged.avro"
    _corrupt_block_copy(str(source), damaged)
    parts = list(read_file(str(damaged)))
    errors = [e for r, e in parts if e is not None]
    kept = [r for r, e in parts if e is None]
    assert len(errors) == 1 and errors[0].startswith("corrupt Avro block at byte ")
    assert 0 < len(kept) < len(whole)
    # Every record kept is a record of the file, whole and in order.
    ids = [r["event_id"] for r in whole]
    kept_ids = [r["event_id"] for r in kept]
    assert kept_ids == [i for i in ids if i in set(kept_ids)]


@pytest.mark.parametrize("mode", ["stream", "batch"])
def test_corrupt_avro_files_and_blocks_are_dead_lettered_and_the_rest_goes_on(spark, tmp_path,
                                                                               same_seed, mode):
    files = [Path(p) for _, p in list_files(str(same_seed["avro"].event_files[0].parent))]
    staged = stage_in_arrival_order(files, tmp_path / "in")
    _corrupt_block_copy(str(files[0]), staged / "part-90000.avro")
    (staged / "part-90001.avro").write_bytes(b"not an avro file")
    os.utime(staged / "part-90000.avro", (FILE_TIME + 100, FILE_TIME + 100))
    os.utime(staged / "part-90001.avro", (FILE_TIME + 101, FILE_TIME + 101))
    options = ["--mode", "batch"] if mode == "batch" else []
    report, rows = _run(spark, tmp_path, staged, "avro", *options)
    dead = [r.asDict() for r in spark.read.parquet(str(tmp_path / "dead-avro")).collect()]
    reasons = sorted(d["reason"] for d in dead)
    assert len(reasons) == 2
    assert reasons[0].startswith("corrupt Avro block at byte ") and "part-90000.avro" in reasons[0]
    assert reasons[1].startswith("corrupt Avro file ") and "part-90001.avro" in reasons[1]
    assert all(d["source_file"].endswith((".avro")) for d in dead)
    # The damaged copy only repeats event ids of the first file (redeliveries), so the output is
    # the truth of the intact files.
    truth = sorted(read_truth(same_seed["avro"].truth_path), key=sort_key)
    assert rows == truth
