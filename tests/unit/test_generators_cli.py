"""Tests of the generator CLI (``python -m generators``, ``streamgen``) and of load mode."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from attribution.spark.files import data_files, read_event_records, read_events
from generators.cli import BATCH_ONLY, STREAM_ONLY, build_parser, main
from generators.load import STATE_FILE, StreamDirError, run_load
from generators.params import GeneratorParams, param_fields
from generators.stream import Position, stream_for
from generators.writers import id_array
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
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["max_delay"] == "30s" and manifest["params"]["users"] == 60
    assert [p.name for p in data_files(out / "events")] == [f"part-{i:05d}.parquet" for i in range(5)]
    assert (out / "truth" / "attributions.parquet").exists() and not (out / "skew.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["generate", "--out", "X", "--users", "ten"], "argument --users: invalid int value"),
    (["generate", "--out", "X", "--max-delay", "a while"], "--max-delay: not a duration"),
    (["generate", "--out", "X", "--disorder", "random"], "invalid choice: 'random'"),
    (["generate", "--out", "X", "--redelivery-rate", "-0.1"], "must be a probability"),
    (["generate"], "the following arguments are required: --out"),
    (["stream", "--out", "X", "--rate", "0"], "--rate must be positive"),
    (["stream", "--out", "X", "--duration", "forever"], "--duration: not a duration"),
])
def test_bad_input_is_a_one_line_error(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "--help" in err


def test_generate_refuses_to_mix_datasets(tmp_path, capsys):
    args = ["generate", "--out", str(tmp_path), "--users", "20", "--files", "2", "--no-plot",
            "--no-truth", "--quiet"]
    assert main(args) == 0
    with pytest.raises(SystemExit):
        main(args)
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0


# -- load mode ---------------------------------------------------------------------------------------

def test_load_mode_writes_the_stream_in_complete_files(tmp_path):
    """Without the clock: a fake sleep checks the directory between files."""
    params = GeneratorParams(users=300, sessions_per_block=80)
    seen = []

    def check_dir(seconds: float) -> None:
        names = sorted(p.name for p in tmp_path.iterdir())
        assert not [n for n in names if n.endswith(".tmp")]  # no temporary file left behind
        for f in data_files(tmp_path):
            assert len(list(read_event_records(f))) == 250  # every visible file is complete
        seen.append(len(data_files(tmp_path)))

    report = run_load(params, tmp_path, rate=1000, duration_s=1.0, file_interval_s=0.25,
                      sleep=check_dir)
    assert report.files == 4 and report.records == 1000
    assert seen[-1] == 4 and seen == sorted(seen)
    written = read_events(tmp_path)
    expected, end = stream_for(params).read(Position(), 1000)
    assert [e.event_id for e in written] == id_array(expected.seq).to_pylist()
    assert end.events == 1000
    # Resume continues the same stream; without --resume the directory is refused.
    with pytest.raises(StreamDirError, match="--resume"):
        run_load(params, tmp_path, rate=1000, duration_s=0.5, file_interval_s=0.25,
                 sleep=lambda s: None)
    run_load(params, tmp_path, rate=1000, duration_s=0.5, file_interval_s=0.25, resume=True,
             sleep=lambda s: None)
    resumed = [e.event_id for e in read_events(tmp_path)]
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
    assert [p.name for p in data_files(out)] == ["part-00000.json", "part-00001.json"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
