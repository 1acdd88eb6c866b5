"""The command skeleton both jobs share (``jobs.command``): every path that ends a command
before or around Spark behaves alike for the attribution job and the join job.

No Spark here: each failure is found before Spark starts, and where a test needs Spark to
start or to fail, ``start_spark`` or ``run`` is replaced by a stand-in that does what Spark
would (a signal during the start, a file Spark cannot decode).
"""
from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from commandline.exits import ExitCode
from jobs import attribution_job, command, join_job
from support.commands import error_line

JOBS = {"attribution": attribution_job, "join": join_job}


@pytest.fixture(params=list(JOBS))
def job(request):
    """Each shared path is run for both jobs."""
    return JOBS[request.param]


def events_dir(tmp_path, name: str = "part-00000.json"):
    events = tmp_path / "events"
    events.mkdir()
    if name:
        (events / name).write_text("{}\n")
    return events


def outputs(tmp_path) -> list[str]:
    return ["--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"),
            "--log-file", str(tmp_path / "spark.log")]


def test_a_bad_option_is_one_line_naming_it_with_exit_code_2(job, capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main(["--events", ".", "--max-files-per-trigger", "many"])
    assert exit_.value.code == ExitCode.USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "error: argument --max-files-per-trigger: invalid int value: " \
                              "'many'" in lines[0], lines


def test_without_events_one_line_says_it_is_required_with_the_input_exit_code(job, capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main([])
    assert exit_.value.code == ExitCode.INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # no usage block
    assert "error: --events DIR or --kafka-topics T1[,T2,...] is required" in lines[0]


KAFKA = ["--kafka-bootstrap-servers", "127.0.0.1:9", "--kafka-topics", "events"]
# Input options that cannot go together -> words of the one error line (exit 2).
BAD_INPUT_OPTIONS = {
    "two inputs": (["--events", "."] + KAFKA, "give one input, not --events and --kafka-topics"),
    "topics without servers": (["--kafka-topics", "events"],
                               "--kafka-topics needs --kafka-bootstrap-servers"),
    "a file limit on topics": (KAFKA + ["--max-files-per-trigger", "2"],
                               "--max-files-per-trigger applies to --events input only"),
    "an offset limit on files": (["--events", ".", "--max-offsets-per-trigger", "2"],
                                 "--max-offsets-per-trigger applies to --kafka-topics input only"),
    "a Kafka option without servers": (["--events", ".", "--kafka-option", "kafka.x=y"],
                                       "--kafka-option needs --kafka-bootstrap-servers"),
    "Parquet values": (KAFKA + ["--format", "parquet"],
                       "--format parquet is a file format; Kafka values are one of json, avro"),
    "no offset limit": (KAFKA + ["--max-offsets-per-trigger", "0"],
                        "--max-offsets-per-trigger must be >= 1"),
    "not KEY=VALUE": (KAFKA + ["--kafka-option", "novalue"], "'novalue' is not KEY=VALUE"),
    "unknown start": (KAFKA + ["--kafka-starting-offsets", "middle"],
                      "invalid choice: 'middle' (choose from 'earliest', 'latest')"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT_OPTIONS))
def test_input_options_that_do_not_go_together_are_one_line_with_exit_code_2(job, case, capsys):
    argv, words = BAD_INPUT_OPTIONS[case]
    with pytest.raises(SystemExit) as exit_:
        job.main(argv)
    assert exit_.value.code == ExitCode.USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_kafka_cluster_that_does_not_answer_is_one_line_with_exit_code_3(job, tmp_path, capsys,
                                                                           monkeypatch):
    from jobs import runtime

    monkeypatch.setattr(runtime, "KAFKA_CHECK_SECONDS", 1.0)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    argv = ["--kafka-bootstrap-servers", f"127.0.0.1:{port}", "--kafka-topics", "events"]
    assert job.main([*argv, *outputs(tmp_path)]) == ExitCode.INPUT
    line = error_line(capsys.readouterr().err)
    assert f"no Kafka broker answered at 127.0.0.1:{port} within 1 s" in line
    assert "check --kafka-bootstrap-servers" in line
    assert not (tmp_path / "out").exists()  # refused before Spark


def test_a_missing_events_directory_is_one_line_with_exit_code_3(job, tmp_path, capsys):
    assert job.main(["--events", str(tmp_path / "missing"), *outputs(tmp_path)]) == 3
    assert "--events " + str(tmp_path / "missing") + " is not a directory" in error_line(
        capsys.readouterr().err)


def test_input_of_another_format_is_refused_with_exit_code_3(job, tmp_path, capsys):
    events = events_dir(tmp_path)
    code = job.main(["--events", str(events), "--format", "parquet", *outputs(tmp_path)])
    assert code == ExitCode.INPUT
    assert "use --format json" in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("content", [None, "README.txt", "_SUCCESS"])
def test_an_empty_events_directory_is_refused_unless_the_run_waits(job, tmp_path, capsys,
                                                                   content):
    events = events_dir(tmp_path, content)
    assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.INPUT
    line = error_line(capsys.readouterr().err)
    assert f"--events {events} holds no .json/.jsonl file to read" in line
    assert "processing-time --trigger" in line
    # A stream that polls for files waits for them, and says so.
    settings = job.parse_args(["--events", str(events), "--trigger", "10 seconds",
                               *outputs(tmp_path)])
    assert job.JOB.preflight(settings) is not None
    assert capsys.readouterr().err.strip() == (
        f"--events {events} holds no .json/.jsonl file yet: the job waits for them (new files "
        "are read at each trigger)")


def test_an_output_of_another_query_is_refused_with_exit_code_4(job, tmp_path, capsys):
    events = events_dir(tmp_path)
    for option, directory in (("--output", "out"), ("--dead-letter", "out-dead-letter")):
        metadata = tmp_path / directory / "_spark_metadata"
        metadata.mkdir(parents=True)
        (metadata / "0").write_text("v1\n")
        assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.OUTPUT
        assert (f"{option} {tmp_path / directory} holds the output of another streaming query"
                in error_line(capsys.readouterr().err))
        (metadata / "0").unlink()


def test_a_checkpoint_that_is_a_file_is_refused_with_exit_code_5(job, tmp_path, capsys):
    events = events_dir(tmp_path)
    (tmp_path / "cp").write_text("")
    assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.CHECKPOINT
    assert "--checkpoint" in error_line(capsys.readouterr().err)


def test_a_progress_file_that_cannot_be_written_is_refused_with_exit_code_4(job, tmp_path,
                                                                           capsys):
    events = events_dir(tmp_path)
    (tmp_path / "file").write_text("")
    code = job.main(["--events", str(events), "--progress-json", str(tmp_path / "file" / "p"),
                     *outputs(tmp_path)])
    assert code == ExitCode.OUTPUT
    assert "--progress-json's directory" in error_line(capsys.readouterr().err)


def test_a_signal_while_spark_starts_ends_the_command_before_anything_is_written(
        job, tmp_path, capsys, monkeypatch):
    events = events_dir(tmp_path)

    def spark_starting(settings, stop):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the JVM starts
        return object(), settings.log_file, lambda: None

    def must_not_run(*_):
        raise AssertionError("the job ran after a stop request")

    monkeypatch.setattr(command, "start_spark", spark_starting)
    monkeypatch.setattr(command, "ship_project", must_not_run)
    monkeypatch.setattr(type(job.JOB), "run", must_not_run)
    assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.TERMINATED
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("stopped by SIGTERM before the first micro-batch; "
                                            "nothing was written")
    assert "error:" not in err


UNDECODABLE = ("[FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH] Encountered error while "
               "reading file file:///data/events/part-00001.parquet. Data type mismatches when "
               "reading Parquet column .impression_id. Expected Spark type bigint, actual "
               "Parquet type BINARY. SQLSTATE: KD001")


def test_a_file_spark_cannot_decode_is_explained_with_exit_code_3(job, tmp_path, capsys,
                                                                 monkeypatch):
    """The real failure, through Spark, is in tests/spark/test_job_commands_spark.py; this one
    checks the mapping of Spark's error for both jobs without a JVM."""
    events = events_dir(tmp_path)

    def spark_started(settings, stop):
        return object(), settings.log_file, lambda: None

    def run_failing(self, spark, settings, stop=None):
        raise RuntimeError(UNDECODABLE)

    monkeypatch.setattr(command, "start_spark", spark_started)
    monkeypatch.setattr(command, "ship_project", lambda spark: None)
    monkeypatch.setattr(type(job.JOB), "run", run_failing)
    assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.INPUT
    line = error_line(capsys.readouterr().err)
    assert "input file file:///data/events/part-00001.parquet cannot be read as events" in line
    assert "same --checkpoint" in line and str(tmp_path / "spark.log") in line


def test_an_unforeseen_failure_is_one_line_naming_the_log_with_exit_code_1(
        job, tmp_path, capsys, monkeypatch):
    events = events_dir(tmp_path)

    def run_failing(self, spark, settings, stop=None):
        raise RuntimeError("something nobody foresaw\nwith a second line")

    monkeypatch.setattr(command, "start_spark",
                        lambda settings, stop: (object(), settings.log_file, lambda: None))
    monkeypatch.setattr(command, "ship_project", lambda spark: None)
    monkeypatch.setattr(type(job.JOB), "run", run_failing)
    assert job.main(["--events", str(events), *outputs(tmp_path)]) == ExitCode.FAILED
    line = error_line(capsys.readouterr().err)
    assert line == (f"error: the job failed: something nobody foresaw; the full error is in "
                    f"{tmp_path / 'spark.log'}")
    assert "Traceback" in (tmp_path / "spark.log").read_text()


def test_settings_are_frozen_and_derived_once(job, tmp_path):
    settings = job.parse_args(["--events", str(tmp_path), "--output", "o/x/",
                               "--conf", "spark.ui.enabled=true", "--conf", "a.b=1"])
    assert settings.dead_letter == "o/x-dead-letter"
    assert settings.dead_letter_checkpoint == settings.checkpoint + "/dead-letter"
    assert settings.spark_conf == {"spark.ui.enabled": "true", "a.b": "1"}
    assert settings.max_future_skew_ms == 86_400_000
    with pytest.raises(AttributeError):
        settings.output = "elsewhere"
    assert settings.replace(output="p").dead_letter == "o/x-dead-letter"  # given, so kept
    assert json.dumps(settings.spark_conf)


def test_a_conf_that_is_not_key_value_is_one_line(job, capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main(["--events", ".", "--conf", "spark.ui.enabled"])
    assert exit_.value.code == ExitCode.USAGE
    assert "is not KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["--events", ".", "--output-topic", "rows"],
     "--output-topic needs --kafka-bootstrap-servers"),
    (["--events", ".", "--mode", "batch", "--kafka-bootstrap-servers", "127.0.0.1:9",
      "--output-topic", "rows"], "--output-topic takes a stream's changelog; --mode batch"),
    (["--events", ".", "--kafka-bootstrap-servers", "127.0.0.1:9", "--output-topic", "rows",
      "--output-format", "delta"], "--output-format delta names the format of --output's"),
])
def test_output_topic_needs_servers_and_a_stream(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        attribution_job.main(argv)
    assert exit_.value.code == ExitCode.USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


@pytest.mark.parametrize("trigger,words", [
    ("every 5s", "--trigger: not a duration: 'every 5s'"),
    ("5 parsecs", "--trigger: unknown unit 'parsecs'"),
    ("once", "--trigger 'once' is not supported: use 'available-now'"),
])
def test_a_bad_trigger_is_one_line_before_spark(job, tmp_path, trigger, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main(["--events", str(events_dir(tmp_path)), "--trigger", trigger,
                  *outputs(tmp_path)])
    assert exit_.value.code == ExitCode.USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "cp").exists()  # refused before Spark


def test_a_generated_datasets_root_as_events_is_refused_naming_its_events(job, tmp_path,
                                                                          capsys):
    events_dir(tmp_path)
    (tmp_path / "manifest.json").write_text("{}\n")
    assert job.main(["--events", str(tmp_path), *outputs(tmp_path)]) == ExitCode.INPUT
    line = error_line(capsys.readouterr().err)
    assert f"--events {tmp_path} is a generated dataset" in line
    assert f"its events are in --events {tmp_path / 'events'}" in line


def test_a_new_checkpoint_on_a_delta_table_another_run_wrote_is_refused(job, tmp_path, capsys):
    """Delta's idempotent commits are keyed by the query's id, new with a new checkpoint: its
    micro-batches would append every row again."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "out"), pa.table({"goal_event_id": ["g1"]}))
    versions = sorted(p.name for p in (tmp_path / "out" / "_delta_log").iterdir())
    assert job.main(["--events", str(events_dir(tmp_path)), *outputs(tmp_path)]) == \
        ExitCode.OUTPUT
    line = error_line(capsys.readouterr().err)
    assert (f"--output {tmp_path / 'out'} is a Delta table another run wrote and checkpoint "
            f"{tmp_path / 'cp'} is new: this run would append every row a second time") in line
    assert sorted(p.name for p in (tmp_path / "out" / "_delta_log").iterdir()) == versions
