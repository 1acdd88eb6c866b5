"""Load mode: keep writing new event files into a dataset's ``events/`` at a target rate.

The output directory is laid out as ``generate`` lays out a dataset (``generators.layout``): the
event files in ``OUT/events``, which a running streaming job reads as a file stream
(``--events OUT/events``), and the stream's own state beside it. Each file holds the next
``rate * file_interval`` records of ``generators.stream`` (so the content is reproducible; only
the timing is wall-clock), is written under a hidden temporary name and renamed into place, so
the job never sees a partial file. The position reached is saved in
``OUT/_streamgen_state.json``, which ``resume`` continues from.

Heartbeats, each a file of one ``heartbeat`` record, move a consumer's watermark when events do
not. ``final_heartbeat`` closes the run with one at the largest event time written + the
watermark delay + 1 ms: the watermark then passes every goal written, so the consumer emits them
all (and the stream cannot be resumed: its next records would be late). ``idle_heartbeat_s``
writes one whenever no file has been written for that long; its time is the stream's clock
(``EventStream.arrival_time``, the arrival time of the next record), so it never takes the
watermark past a record still to come by more than that record's own delay. That clock is only
as far as the data has got: idle heartbeats keep a consumer's micro-batches and watermark moving
through a quiet stretch, but only the final heartbeat flushes the last watermark delay's goals.

With a ``topic`` (``generators.topic``) the same batches and heartbeats are produced to Kafka
instead of written as files, each delivered before the state is saved; the directory then holds
only the state, so a resumed run repeats at most the batch a kill interrupted.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from .layout import EVENTS_DIR
from .params import GeneratorParams
from .stream import Position, stream_for
from .writers import (
    EXTENSIONS,
    atomic_write,
    heartbeat_record,
    part_name,
    record_values,
    write_events_file,
)

if TYPE_CHECKING:
    from .topic import TopicWriter

STATE_FILE = "_streamgen_state.json"


class StreamDirError(Exception):
    """The output directory cannot be used as asked (e.g. it already has files, no resume)."""


@dataclass
class LoadReport:
    """What a load run wrote: event files, events, heartbeat files, over how long."""

    files: int
    records: int
    seconds: float
    target_rate: float
    heartbeats: int = 0
    topic: Optional[str] = None  # produced to this Kafka topic instead of written as files

    @property
    def achieved_rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        beats = (f" (+{self.heartbeats:,} heartbeat file{'s' if self.heartbeats > 1 else ''})"
                 if self.heartbeats else "")
        if self.topic is not None:
            beats = beats.replace(" file", " record")
            written = f"produced {self.records:,} events in {self.files:,} batches to topic " \
                      f"{self.topic}{beats}"
        else:
            written = f"wrote {self.records:,} events in {self.files:,} files{beats}"
        return (f"{written} over {self.seconds:.2f} s: achieved {self.achieved_rate:,.0f} "
                f"events/s (target {self.target_rate:,.0f})")


def _existing_parts(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("part-*") if p.suffix in EXTENSIONS.values())


@dataclass
class _State:
    """Where a stream directory stands: the next position and file number, the largest event
    time written, and the final heartbeat's time once the stream is closed."""

    position: Position
    next_file: int
    max_ts_ms: Optional[int] = None
    closed_at_ms: Optional[int] = None


def _load_state(out: Path, params: GeneratorParams) -> _State:
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
    if state.get("final_heartbeat_ts_ms") is not None:
        raise StreamDirError(f"cannot resume: {out} was closed by a final heartbeat, which made "
                             "every later record late; use a new directory")
    return _State(Position.from_offset(state["position"]), int(state["next_file"]),
                  state.get("max_ts_ms"))


def _save_state(out: Path, params: GeneratorParams, state: _State) -> None:
    body = {"params": params.to_dict(), "position": state.position.to_offset(),
            "next_file": state.next_file, "max_ts_ms": state.max_ts_ms,
            "final_heartbeat_ts_ms": state.closed_at_ms}
    atomic_write(out / STATE_FILE,
                 lambda p: p.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8"))


def run_load(params: GeneratorParams, out, rate: float, duration_s: float,
             file_interval_s: float = 1.0, resume: bool = False,
             log: Optional[Callable[[str], None]] = None,
             sleep: Callable[[float], None] = time.sleep,
             final_heartbeat: bool = False, idle_heartbeat_s: Optional[float] = None,
             clock: Callable[[], float] = time.monotonic,
             topic: Optional["TopicWriter"] = None) -> LoadReport:
    """Write ``rate`` events per second into ``out/events`` for ``duration_s`` seconds.

    One file every ``file_interval_s``; the run lasts at least ``duration_s`` so the achieved
    rate is comparable with the target. Raises ``StreamDirError`` when ``out/events`` already
    holds part files and ``resume`` is false, or when resuming a stream closed by a final heartbeat.

    :param params: the stream's parameters (``generators.stream``).
    :param out: the stream's directory: its event files go to ``out/events`` (the directory a
        streaming job reads), its state beside them.
    :param rate: target events per second.
    :param duration_s: how long to keep writing, in seconds.
    :param file_interval_s: one new file per this many seconds.
    :param resume: continue the stream already in ``out``.
    :param log: called with one line per file written.
    :param sleep: how to wait (tests pass a fake).
    :param final_heartbeat: end with a heartbeat that flushes every goal written (module doc).
    :param idle_heartbeat_s: write a heartbeat whenever no file has been written for this many
        seconds (module doc); ``None``: never.
    :param clock: the monotonic clock ``sleep`` advances (tests pass a fake pair).
    :param topic: produce each batch and heartbeat to this topic instead of writing files;
        ``out`` then holds only the stream's state.
    """
    if rate <= 0:
        raise ValueError(f"--rate must be positive, got {rate}")
    if duration_s <= 0:
        raise ValueError(f"--duration must be positive, got {duration_s}")
    if file_interval_s <= 0:
        raise ValueError(f"--file-interval must be positive, got {file_interval_s}")
    if idle_heartbeat_s is not None and idle_heartbeat_s <= 0:
        raise ValueError(f"--idle-heartbeat must be positive, got {idle_heartbeat_s}")
    out = Path(out)
    events_dir = out / EVENTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        state = _load_state(out, params)
    else:
        if _existing_parts(events_dir):
            raise StreamDirError(f"{events_dir} already holds event files; pass --resume to "
                                 "continue that stream, or choose an empty directory")
        if topic is not None and (out / STATE_FILE).exists():
            raise StreamDirError(f"{out} already holds the state of a stream; pass --resume to "
                                 "continue it, or choose an empty directory")
        state = _State(Position(), 0)
    per_file = max(1, round(rate * file_interval_s))
    stream = stream_for(params)
    if state.max_ts_ms is None and state.position.events:
        # A state written before the largest event time was kept: the clock bounds it.
        state.max_ts_ms = stream.arrival_time(state.position)
    started = clock()
    written_files = written_records = heartbeats = 0
    last_write = started

    def emit(events, heartbeat: Optional[dict] = None) -> str:
        """Write one batch (or heartbeat) as the next file, or produce it; returns its name."""
        if topic is None:
            events_dir.mkdir(exist_ok=True)
            path = events_dir / part_name(state.next_file, params.format)
            write_events_file(path, params.format, events, stream.vocab, params.seed,
                              heartbeat=heartbeat)
            return path.name
        topic.send(record_values(params.format, events, stream.vocab, heartbeat))
        topic.flush()
        return f"{topic.topic} batch {state.next_file}"

    def write_heartbeat(ts_ms: int, why: str) -> None:
        nonlocal heartbeats, last_write
        name = emit(None, heartbeat=heartbeat_record(ts_ms, state.next_file))
        state.next_file += 1
        heartbeats += 1
        last_write = clock()
        _save_state(out, params, state)
        if log:
            log(f"{name}: {why} heartbeat")

    def wait_until(deadline: float) -> None:
        """Sleep until ``deadline``, with an idle heartbeat whenever one is due."""
        if idle_heartbeat_s is None:
            wait = deadline - clock()
            if wait > 0:
                sleep(wait)
            return
        while True:
            now = clock()
            if now >= deadline:
                return
            if now - last_write >= idle_heartbeat_s:
                write_heartbeat(stream.arrival_time(state.position), "idle")
                continue
            sleep(min(deadline, last_write + idle_heartbeat_s) - now)

    while True:
        due = started + written_files * file_interval_s
        # Stop at the end of the duration even when writing cannot keep up with the rate.
        if due - started >= duration_s or clock() - started >= duration_s:
            break
        wait_until(due)
        events, state.position = stream.read(state.position, per_file)
        name = emit(events)
        if len(events):
            top = int(events.ts.max())
            state.max_ts_ms = top if state.max_ts_ms is None else max(state.max_ts_ms, top)
        state.next_file += 1
        written_files += 1
        written_records += len(events)
        last_write = clock()
        _save_state(out, params, state)
        if log:
            log(f"{name}: {len(events):,} events ({written_records:,} in total)")
    # Stay until the end of the last interval, so the rate reflects the whole duration.
    wait_until(started + duration_s)
    if final_heartbeat:
        top = state.max_ts_ms if state.max_ts_ms is not None else params.start_ms
        state.closed_at_ms = top + params.watermark_delay_ms + 1
        write_heartbeat(state.closed_at_ms, "final")
    return LoadReport(written_files, written_records, clock() - started, rate, heartbeats,
                      None if topic is None else topic.topic)


def print_progress(message: str) -> None:
    """Print a progress line on stderr, at once.

    :param message: the line, without its newline.
    """
    print(message, file=sys.stderr, flush=True)
