"""The paths of the command skeleton (``jobs.command``) that need Spark: a file Spark cannot
decode ends a join run with one explaining line and exit code 3 (nothing of its micro-batch
committed, so a rerun after replacing it resumes there; the attribution job dead-letters such a
file instead: ``test_dead_letter``), and ``--progress-json`` writes one JSON line per
micro-batch as the run goes (the join job's here; the attribution job's on the chapter 7 stream
of ``test_delta_output``).
"""
from __future__ import annotations

import json
import os

import pytest

from attribution.spark.dead_letter import most_frequent_reasons
from attribution.spark.files import read_events, write_events
from commandline.exits import ExitCode
from jobs import attribution_job, join_job
from support.commands import error_line
from support.datasets import stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT


def test_a_file_spark_cannot_decode_is_explained_and_a_rerun_resumes(spark, tmp_path, ch7_dir,
                                                                     capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    job = join_job
    src = tmp_path / "src"
    src.mkdir()
    for part in sorted(ch7_dir.glob("part-*.json")):
        write_events(read_events(part), src / part.name.replace(".json", ".parquet"), "parquet")
    events = stage_in_arrival_order(sorted(src.glob("*.parquet")), tmp_path / "events")
    broken = events / "part-00001.parquet"  # impression 123, with a string impression_id
    good = pq.read_table(broken)
    mtime = broken.stat().st_mtime
    pq.write_table(good.set_column(good.schema.get_field_index("impression_id"),
                                   "impression_id", pa.array(["one-two-three"])), broken)
    os.utime(broken, (mtime, mtime))

    argv = ["--events", str(events), "--format", "parquet", "--output", str(tmp_path / "out"),
            *PARQUET_OUTPUT,
            "--checkpoint", str(tmp_path / "cp"), "--max-files-per-trigger", "1", "--quiet",
            "--watermark-delay", "3 minutes", "--log-file", str(tmp_path / "spark.log")]
    assert job.main(argv) == 3
    line = error_line(capsys.readouterr().err)
    assert "part-00001.parquet cannot be read as events" in line
    assert "impression_id" in line and "same --checkpoint" in line

    pq.write_table(good, broken)  # the operator's fix: same name, corrected content
    os.utime(broken, (mtime, mtime))
    assert job.main(argv) == 0
    assert spark.read.parquet(str(tmp_path / "out")).count() > 0


def test_the_join_jobs_progress_json_has_one_line_per_micro_batch(spark, tmp_path, ch7_stream_dir):
    job = join_job
    progress = tmp_path / "progress.jsonl"
    settings = job.parse_args(["--events", str(ch7_stream_dir), "--output", str(tmp_path / "o"),
                               "--checkpoint", str(tmp_path / "cp"), "--quiet",
                               "--max-files-per-trigger", "2", "--watermark-delay", "3 minutes",
                               "--progress-json", str(progress)])
    result = job.run(spark, settings)
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert len(lines) == len(result.batches) >= 4  # 7 files, two per micro-batch
    assert lines == json.loads(json.dumps(result.batches, default=str))
    read = sum(line["records_read"] for line in lines)
    assert read == len(read_events(ch7_stream_dir))  # every record, in one line or another


@pytest.mark.parametrize("job", [attribution_job, join_job], ids=["attribution", "join"])
def test_a_run_without_one_valid_record_ends_with_exit_code_6_and_its_reasons(spark, tmp_path,
                                                                             job, capsys):
    """A directory of other files read as events is not a success that wrote nothing: the
    run ends with its own code and the most frequent reasons, the dead letter still written."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "part-00000.json").write_text("not json\n" * 3 + '{"event_type": "visit"}\n')
    dead = tmp_path / "dead"
    argv = ["--events", str(events), "--output", str(tmp_path / "out"), *PARQUET_OUTPUT,
            "--dead-letter", str(dead), "--checkpoint", str(tmp_path / "cp"), "--quiet",
            "--log-file", str(tmp_path / "spark.log")]
    assert job.main(argv) == ExitCode.NO_VALID_INPUT
    line = error_line(capsys.readouterr().err)
    assert "not one of the 4 records read was valid; the most frequent reasons: " in line, line
    assert f"every record is in the dead letter {dead}" in line
    assert sum(n for _, n in most_frequent_reasons(str(dead))) == 4
    assert line.index("(3)") < line.index("(1)")  # most frequent first
