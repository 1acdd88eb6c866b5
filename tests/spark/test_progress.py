"""The progress line and the final report of the attribution job, for every state layout of both
backends: micro-batch duration and rates, goals split the way the report splits them, users held
in state (not Spark's state rows: buckets, or entries), state size, and the watermark or "none
yet"; across a restart, the users already held are counted from the checkpoint.
"""
from __future__ import annotations

import datetime as dt
import re

import pytest

from attribution.events import Event
from attribution.spark.files import write_events
from jobs.attribution_job import parse_args, run
from support import PARQUET_OUTPUT, stage_in_arrival_order

LAYOUTS = {"applyInPandasWithState": [],  # 64 hash buckets of users
           "applyInPandasWithState-per-user": ["--state-buckets", "0"],
           "transformWithState": ["--backend", "transformWithState"],
           "transformWithState-declared": ["--backend", "transformWithState",
                                           "--tws-state", "declared"]}
USERS = 5


def _event(event_id, user, minute, **fields) -> Event:
    ts = int(dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc).timestamp() * 1000) + minute * 60_000
    kind = "impression" if "impression_id" in fields else ("heartbeat" if user is None else "visit")
    return Event(event_id, user, kind, ts, **fields)


# File 0: five users; u0 clicks an ad and converts (attributed), u1 converts without one
# (organic). File 1: a heartbeat 30 minutes later, past every user's 10-minute lookback
# (and u0's impression's 5-minute dedup bucket).
# The job runs over file 0, then again on the same checkpoint once file 1 is there.
FILES = [
    [_event("u0-ad", "u0", 0, impression_id=7, source_url="/search", target_url="/land"),
     _event("u0-land", "u0", 1, url="/land", referer="/search"),
     _event("u0-goal", "u0", 2, url="/buy", referer="/land", is_goal=True),
     _event("u1-goal", "u1", 2, url="/buy", referer="/home", is_goal=True),
     *(_event(f"u{n}-visit", f"u{n}", n, url="/home") for n in range(2, USERS))],
    [_event("hb", None, 30)],
]


def _stage(tmp_path, files: int):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    paths = []
    for n, events in enumerate(FILES[:files]):
        paths.append(src / f"part-{n:05d}.json")
        write_events(events, paths[-1], "json")
    return stage_in_arrival_order(paths, tmp_path / "events")


def _run(spark, tmp_path, layout, capsys):
    args = parse_args(["--events", str(tmp_path / "events"), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), "--max-files-per-trigger", "1",
                       "--watermark-delay", "1 minute", "--lookback", "10 minutes",
                       "--dedup-window", "5 minutes", *PARQUET_OUTPUT, *LAYOUTS[layout]])
    report = run(spark, args)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("batch ")]
    assert len(lines) == report.batches
    return report, lines


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_progress_shows_duration_rates_users_in_state_and_the_watermark(spark, tmp_path, layout,
                                                                       capsys):
    _stage(tmp_path, 1)
    report, lines = _run(spark, tmp_path, layout, capsys)
    # Micro-batch 0: every user arrives, under no watermark yet; micro-batch 1, with no data, at
    # the watermark batch 0 set (03:00): both goals fire, one of them attributed.
    assert [b["users_in_state"] for b in report.history] == [USERS, USERS]
    first = re.fullmatch(
        r"batch 0: input 7 rows in (\d+\.\d) s \(input ([\d.,]+) rows/s, processed ([\d.,]+) "
        r"rows/s\), late dropped 0, goals 0 \(attributed 0, organic 0\), users in state 5, "
        r"state size ([\d.]+ [KM]?B), watermark none yet, invalid 0 \(dead-lettered\)", lines[0])
    assert first, lines[0]
    # Spark's own numbers, to the precision shown.
    batch = report.history[0]
    assert float(first[1]) == pytest.approx(batch["duration_ms"] / 1000, abs=0.05)
    assert float(first[2].replace(",", "")) == pytest.approx(batch["input_rate"], rel=0.01,
                                                             abs=0.01)
    assert float(first[3].replace(",", "")) == pytest.approx(batch["processed_rate"], rel=0.01)
    assert batch["processed_rate"] > 0
    assert lines[1].startswith("batch 1: input 0 rows in ")
    assert ("goals 2 (attributed 1, organic 1), users in state 5, state size " in lines[1]
            and lines[1].endswith("watermark 2024-03-01T00:03:00.000Z, invalid 0 (dead-lettered)"))
    assert report.state_bytes > 0
    rendered = report.render()
    for field in ("goals          : 2", "attributed     : 1", "organic        : 1",
                  "users in state : 5", "watermark      : 2024-03-01T00:03:00.000Z",
                  "state size     : "):
        assert field in rendered, rendered

    # A restart on the same checkpoint counts the users already held, then follows them out:
    # the heartbeat's micro-batch runs under the old watermark, the next one under its own.
    _stage(tmp_path, 2)
    report, lines = _run(spark, tmp_path, layout, capsys)
    assert [b["users_in_state"] for b in report.history] == [USERS, 0]
    assert lines[0].startswith("batch 2: input 1 rows in ") and "users in state 5," in lines[0]
    assert "users in state 0," in lines[1]
    assert "users in state : 0" in report.render()
    assert report.watermark == "2024-03-01T00:29:00.000Z"
