"""Tests of the generator CLI (``python -m generators``, ``streamgen``) and of load mode."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from attribution.events import ts_to_ms
from attribution.spark.files import data_files, read_event_records, read_events
from generators.cli import BATCH_ONLY, STREAM_ONLY, build_parser, main
from generators.layout import EVENTS_DIR
from generators.load import STATE_FILE, StreamDirError, run_load
from generators.params import GeneratorParams, param_fields
from generators.stream import Position, stream_for
from generators.writers import id_array
from joins.durations import format_duration_ms
from support import ROOT


def _help(command: str) -> str:
    parser = build_parser()
    return parser._subparsers._group_actions[0].choices[command].format_help()


@pytest.mark.parametrize("command,skip", [("generate", STREAM_ONLY), ("stream", BATCH_ONLY)])
def test_help_explains_every_knob_with_its_default(command, skip):
    text = _help(command)
    for f in param_fields():
        flag = "--" + f.name.replace("_", "-")
        # An option's own entry starts a line of the option list.
        entry = re.search(r"^  " + re.escape(flag) + r"[ ,\n]", text, re.MULTILINE)
        if f.name in skip:
            assert entry is None
            continue
        assert entry is not None, flag
        after = " ".join(text[entry.start():].split())  # undo line wrapping
        assert after[after.index("(default:"):].startswith(f"(default: {f.default})"), flag
    for option in (["--out", "--overwrite", "--truth", "--plot", "--quiet"] if command == "generate"
                   else ["--rate", "--duration", "--file-interval", "--resume"]):
        assert option in text


def test_console_script_is_declared_and_runs():
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert scripts.get("streamgen") == "generators.cli:main"
    script = Path(sys.executable).parent / "streamgen"
    result = subprocess.run([str(script), "generate", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "--late-fraction" in result.stdout


def test_generate_through_the_cli(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["generate", "--out", str(out), "--users", "60", "--files", "4", "--format",
                 "parquet", "--disorder", "bounded", "--max-delay", "30s", "--heartbeat",
                 "--redelivery-rate", "0.1", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    assert "no late events for a 10 minutes watermark delay" in printed
    # Durations for people are in human units, not raw milliseconds.
    manifest = json.loads((out / "manifest.json").read_text())
    d = manifest["disorder"]
    assert f"max arrival delay {format_duration_ms(d['max_arrival_delay_ms'])}," in printed
    assert f"({format_duration_ms(manifest['event_time']['span_ms'])})" in printed
    assert not re.search(r"\d,\d{3} ms\b", printed)  # e.g. "119,044 ms"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["max_delay"] == "30s" and manifest["params"]["users"] == 60
    assert [p.name for p in data_files(out / "events")] == [f"part-{i:05d}.parquet"
                                                            for i in range(5)]
    assert (out / "truth" / "attributions.parquet").exists() and not (out / "skew.png").exists()
    # The truth's models and the goals with several candidates, per model, as in the manifest.
    truth = manifest["truth"]
    assert f"goals under 5 models (half-life {truth['half_life']})" in printed
    multi = ", ".join(f"{n:,} {m}" for m, n in truth["multi_candidate_goals"].items())
    assert f"goals with 2 or more candidate impressions: {multi}\n" in printed


@pytest.mark.parametrize("argv,message", [
    (["generate", "--out", "X", "--users", "ten"], "argument --users: invalid int value"),
    (["generate", "--out", "X", "--max-delay", "a while"], "--max-delay: not a duration"),
    (["generate", "--out", "X", "--disorder", "random"], "invalid choice: 'random'"),
    (["generate", "--out", "X", "--redelivery-rate", "-0.1"], "must be a probability"),
    (["generate"], "the following arguments are required: --out"),
    (["stream", "--out", "X", "--rate", "0"], "--rate must be positive"),
    (["stream", "--out", "X", "--duration", "forever"], "--duration: not a duration"),
    (["generate", "--out", "X", "--total-span", "7 days"],
     "--total-span (7 days) must be longer than --span (60 days)"),
    (["generate", "--out", "X", "--processes", "0"], "--processes must be at least 1"),
    (["stream", "--out", "X", "--idle-heartbeat", "0"], "--idle-heartbeat must be positive"),
    (["stream", "--out", "X", "--idle-heartbeat", "often"], "--idle-heartbeat: not a duration"),
])
def test_bad_input_is_a_one_line_error(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "--help" in err
    assert len(err.strip().splitlines()) == 2  # the error, then the pointer to --help


def test_help_says_what_span_bounds_and_offers_total_span():
    raw = _help("generate")
    entry = {flag: re.search(rf"^  {flag} DURATION", raw, re.MULTILINE).start()
             for flag in ("--span", "--total-span")}
    span = " ".join(raw[entry["--span"]:entry["--total-span"]].split())
    assert "first session starts" in span and "does not bound the events" in span
    total = " ".join(raw[entry["--total-span"]:].split())
    text = " ".join(raw.split())
    assert "no event at or after --start + this" in total and "(default: unlimited)" in total
    assert "a bare number is milliseconds" not in text  # the duration parser refuses those


def test_generate_refuses_to_mix_datasets(tmp_path, capsys):
    args = ["generate", "--out", str(tmp_path), "--users", "20", "--files", "2", "--no-plot",
            "--no-truth", "--quiet"]
    assert main(args) == 0
    with pytest.raises(SystemExit):
        main(args)
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0


# -- load mode -------------------------------------------------------------------------------

def test_load_mode_writes_the_stream_in_complete_files(tmp_path):
    """Without the clock: a fake sleep checks the directory between files."""
    params = GeneratorParams(users=300, sessions_per_block=80)
    seen = []

    def check_dir(seconds: float) -> None:
        names = sorted(p.name for p in (tmp_path / EVENTS_DIR).iterdir())
        assert not [n for n in names if n.endswith(".tmp")]  # no temporary file left behind
        for f in data_files(tmp_path / EVENTS_DIR):
            assert len(list(read_event_records(f))) == 250  # every visible file is complete
        seen.append(len(data_files(tmp_path / EVENTS_DIR)))

    report = run_load(params, tmp_path, rate=1000, duration_s=1.0, file_interval_s=0.25,
                      sleep=check_dir)
    assert report.files == 4 and report.records == 1000
    assert seen[-1] == 4 and seen == sorted(seen)
    written = read_events(tmp_path / EVENTS_DIR)
    expected, end = stream_for(params).read(Position(), 1000)
    assert [e.event_id for e in written] == id_array(expected.seq).to_pylist()
    assert end.events == 1000
    # Resume continues the same stream; without --resume the directory is refused.
    with pytest.raises(StreamDirError, match="--resume"):
        run_load(params, tmp_path, rate=1000, duration_s=0.5, file_interval_s=0.25,
                 sleep=lambda s: None)
    run_load(params, tmp_path, rate=1000, duration_s=0.5, file_interval_s=0.25, resume=True,
             sleep=lambda s: None)
    resumed = [e.event_id for e in read_events(tmp_path / EVENTS_DIR)]
    everything, _ = stream_for(params).read(Position(), 1500)
    assert resumed == id_array(everything.seq).to_pylist()
    assert json.loads((tmp_path / STATE_FILE).read_text())["position"]["events"] == 1500
    with pytest.raises(StreamDirError, match="different parameters"):
        run_load(params.replace(seed=9), tmp_path, rate=1000, duration_s=0.5, resume=True,
                 sleep=lambda s: None)


def test_stream_command_prints_the_achieved_rate(tmp_path):
    out = tmp_path / "incoming"
    result = subprocess.run(
        [sys.executable, "-m", "generators", "stream", "--rate", "2000", "--duration", "1s",
         "--file-interval", "0.5s", "--format", "json", "--out", str(out), "--quiet"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote 2,000 events in 2 files" in result.stdout and "achieved" in result.stdout
    assert "events/s (target 2,000)" in result.stdout
    assert [p.name for p in data_files(out / EVENTS_DIR)] == ["part-00000.json", "part-00001.json"]
    assert not [p for p in (out / EVENTS_DIR).iterdir() if p.name.startswith(".")]


def _heartbeats(directory: Path) -> list[tuple[int, dict]]:
    """(file number, record) of every heartbeat file, in name order."""
    out = []
    for n, f in enumerate(data_files(directory)):
        records = list(read_event_records(f))
        if records[0]["event_type"] == "heartbeat":
            assert len(records) == 1
            out.append((n, records[0]))
    return out


def test_final_heartbeat_lets_a_consumer_flush_every_goal(tmp_path):
    params = GeneratorParams(users=300, sessions_per_block=80, max_delay="90 seconds")
    report = run_load(params, tmp_path, rate=1000, duration_s=1.0, file_interval_s=0.25,
                      sleep=lambda s: None, final_heartbeat=True)
    assert report.files == 4 and report.heartbeats == 1
    assert "(+1 heartbeat file)" in report.summary()
    events = read_events(tmp_path / EVENTS_DIR)
    (n, beat), = _heartbeats(tmp_path / EVENTS_DIR)
    assert n == 4 and events[-1].event_type == "heartbeat"
    goals = [e.ts for e in events if e.event_type == "visit" and e.is_goal]
    top = max(e.ts for e in events if e.event_type != "heartbeat")
    delay = params.watermark_delay_ms
    # Without the heartbeat a consumer's watermark (max ts - D) leaves the last goals pending;
    # with it, the watermark passes every goal.
    assert sum(g > top - delay for g in goals) > 0
    assert ts_to_ms(beat["ts"]) == top + delay + 1 and all(g < ts_to_ms(beat["ts"]) - delay
                                                           for g in goals)
    with pytest.raises(StreamDirError, match="closed by a final heartbeat"):
        run_load(params, tmp_path, rate=1000, duration_s=0.5, resume=True, sleep=lambda s: None)


def test_idle_heartbeats_fill_long_gaps_without_making_records_late(tmp_path):
    """A fake clock: files every 2 s, a heartbeat after 0.5 s without a file."""
    from generators.disorder import late_event_ids_in_dir

    now = [0.0]

    def sleep(seconds: float) -> None:
        assert seconds > 0
        now[0] += seconds

    params = GeneratorParams(users=300, sessions_per_block=80, max_delay="90 seconds")
    report = run_load(params, tmp_path, rate=100, duration_s=6.0, file_interval_s=2.0,
                      sleep=sleep, clock=lambda: now[0], idle_heartbeat_s=0.5)
    # Three event files (at 0, 2 and 4 s), three idle heartbeats after each (0.5, 1, 1.5 s in).
    assert report.files == 3 and report.heartbeats == 9 and now[0] == 6.0
    files = [list(read_event_records(f)) for f in data_files(tmp_path / EVENTS_DIR)]
    kinds = ["heartbeat" if f[0]["event_type"] == "heartbeat" else "events" for f in files]
    assert kinds == (["events"] + ["heartbeat"] * 3) * 3
    stream = stream_for(params)
    seen = None
    for f in files:
        stamps = [ts_to_ms(r["ts"]) for r in f]
        if f[0]["event_type"] == "heartbeat":
            # The stream's clock: at least every event time before it, at most the next
            # record's arrival time.
            assert stamps[0] >= seen
        seen = max(stamps) if seen is None else max(seen, max(stamps))
    position = stream.advance(Position(), 200)
    assert ts_to_ms(files[3][0]["ts"]) == stream.arrival_time(position)
    # A bounded stream (90 s < the 10 minutes watermark delay) stays free of late records,
    # heartbeats included, read one file per micro-batch.
    assert late_event_ids_in_dir(tmp_path / EVENTS_DIR, params.watermark_delay_ms) == []


def test_generator_benchmark_prints_both_rates(capsys):
    from benchmarks.generator import main as benchmark

    assert benchmark(["--events", "3000", "--files", "3", "--repeat", "1", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    for kind in ("with truth", "without truth"):
        match = re.search(rf"^{kind}: median ([\d,]+) events/s end to end", printed, re.MULTILINE)
        assert match and int(match.group(1).replace(",", "")) > 0, printed
        assert re.search(rf"run 1 {kind} *: [\d,]+ records in [\d.]+ s wall", printed)
