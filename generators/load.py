"""Load mode: keep writing new event files into a directory at a target rate.

A running streaming job reads the directory as a file stream. Each file holds the next
``rate * file_interval`` records of ``generators.stream`` (so the content is reproducible; only
the timing is wall-clock), is written under a hidden temporary name and renamed into place, so
the job never sees a partial file. The position reached is saved in ``_streamgen_state.json``
(underscore-prefixed: Spark and ``attribution.spark.files`` skip it), which ``resume`` continues from.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .params import GeneratorParams
from .stream import Position, stream_for
from .writers import EXTENSIONS, atomic_write, part_name, write_events_file

STATE_FILE = "_streamgen_state.json"


class StreamDirError(Exception):
    """The output directory cannot be used as asked (e.g. it already has files, no resume)."""


@dataclass
class LoadReport:
    files: int
    records: int
    seconds: float
    target_rate: float

    @property
    def achieved_rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (f"wrote {self.records:,} events in {self.files:,} files over {self.seconds:.2f} s: "
                f"achieved {self.achieved_rate:,.0f} events/s (target {self.target_rate:,.0f})")


def _existing_parts(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("part-*") if p.suffix in EXTENSIONS.values())


def _load_state(out: Path, params: GeneratorParams) -> tuple[Position, int]:
    path = out / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StreamDirError(f"cannot resume: {path} is missing") from None
    except json.JSONDecodeError as err:
        raise StreamDirError(f"cannot resume: {path} is not valid JSON ({err})") from None
    if state.get("params") != params.to_dict():
        raise StreamDirError(f"cannot resume: {out} was written with different parameters; "
                             "use the same options as the first run, or a new directory")
    return Position.from_offset(state["position"]), int(state["next_file"])


def run_load(params: GeneratorParams, out, rate: float, duration_s: float,
             file_interval_s: float = 1.0, resume: bool = False,
             log: Optional[Callable[[str], None]] = None,
             sleep: Callable[[float], None] = time.sleep) -> LoadReport:
    """Write ``rate`` events per second into ``out`` for ``duration_s`` seconds.

    One file every ``file_interval_s``; the run lasts at least ``duration_s`` so the achieved
    rate is comparable with the target. Raises ``StreamDirError`` when ``out`` already holds
    part files and ``resume`` is false.
    """
    if rate <= 0:
        raise ValueError(f"--rate must be positive, got {rate}")
    if duration_s <= 0:
        raise ValueError(f"--duration must be positive, got {duration_s}")
    if file_interval_s <= 0:
        raise ValueError(f"--file-interval must be positive, got {file_interval_s}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        position, next_file = _load_state(out, params)
    else:
        if _existing_parts(out):
            raise StreamDirError(f"{out} already holds event files; pass --resume to continue "
                                 "that stream, or choose an empty directory")
        position, next_file = Position(), 0
    per_file = max(1, round(rate * file_interval_s))
    stream = stream_for(params)
    started = time.monotonic()
    written_files = written_records = 0
    while True:
        due = started + written_files * file_interval_s
        # Stop at the end of the duration even when writing cannot keep up with the rate.
        if due - started >= duration_s or time.monotonic() - started >= duration_s:
            break
        wait = due - time.monotonic()
        if wait > 0:
            sleep(wait)
        events, position = stream.read(position, per_file)
        path = out / part_name(next_file, params.format)
        write_events_file(path, params.format, events, stream.vocab, params.seed)
        next_file += 1
        written_files += 1
        written_records += len(events)
        state = {"params": params.to_dict(), "position": position.to_offset(),
                 "next_file": next_file}
        atomic_write(out / STATE_FILE,
                     lambda p: p.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8"))
        if log:
            log(f"{path.name}: {len(events):,} events ({written_records:,} in total)")
    # Stay until the end of the last interval, so the rate reflects the whole duration.
    remaining = started + duration_s - time.monotonic()
    if remaining > 0:
        sleep(remaining)
    return LoadReport(written_files, written_records, time.monotonic() - started, rate)


def print_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
