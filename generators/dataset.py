"""The library API: ``build(params)`` makes a dataset in memory, ``generate(params, out)``
writes it.

``generate`` writes, under ``out``:

* ``events/part-00000.<ext>`` ...: the records in arrival order, split into ``params.files``
  files (and, with ``params.heartbeat``, one more file holding a single heartbeat);
* ``truth/attributions.parquet``: the batch oracle over the events *read back from those
  files*, under every attribution model, so the truth is exactly what a reader of the files
  should get (``generators.truth``);
* ``manifest.json``: seed, parameters, counts, event-time range, disorder statistics, late
  records, and a summary in human units;
* ``skew.png`` and ``delays.png``: event time against arrival order, whole and zoomed, and the
  arrival-delay distribution per source (when matplotlib is installed; ``generators.skew``).

A large run uses two processes (``generators.workers``): a spawned helper draws the pictures
while this process writes the files, then each takes a share of the users for the truth.

Tests, the benchmark and the jobs' examples all call this module rather than the CLI.
"""
from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import networkx as nx
import numpy as np
import pyarrow as pa
from tqdm import tqdm

from . import manifest as manifest_mod
from .behaviour import IMPRESSION, EventColumns, Sessions, batch_sessions, sessions_to_events
from .disorder import (
    SPARK_WATERMARK_LAG,
    Arrival,
    arrange,
    arrival_lag,
    delay_bound_ms,
    file_watermarks,
    late_mask,
)
from .layout import EVENTS_DIR, MANIFEST_FILE, TRUTH_FILE  # noqa: F401 (re-exported)
from .params import GeneratorParams
from .site import SiteArrays, build_site, to_arrays, user_ids
from .skew import DELAYS_FILE, SKEW_FILE, DisorderPicture, draw_pictures
from .truth import compute_truth, write_truth
from .workers import processes_for, start_helpers
from .writers import Vocabulary, heartbeat_record, id_array, part_name, write_events_file

# The zoomed skew panel spans this many times the larger of the disorder bound and the
# watermark delay: wide enough to show the bound, narrow enough that it is not a line.
ZOOM_FACTOR = 4
# Independent random streams, so that e.g. a disorder knob never changes the events themselves.
_BEHAVIOUR_STREAM, _DISORDER_STREAM = 1, 2


class OutputExists(Exception):
    """The output directory already holds generated data (and overwrite was not asked for)."""


@dataclass
class Dataset:
    """A generated dataset in memory: the site, the events and their arrival."""

    params: GeneratorParams
    graph: nx.DiGraph
    site: SiteArrays
    vocab: Vocabulary
    sessions: Sessions
    events: EventColumns
    arrival: Arrival
    _arrival_ts: Optional[np.ndarray] = field(default=None, init=False, repr=False)

    def file_events(self, k: int) -> EventColumns:
        """The records of file ``k`` in their written order.

        :param k: the file's index (0 for ``part-00000``).
        """
        return self.events.take(self.arrival.rows[self.arrival.file_slices()[k]])

    def arrival_ts(self) -> np.ndarray:
        """Event time of every record, in arrival order (heartbeat excluded). Computed once
        (the files, watermarks, late masks, manifest and pictures all need it); read-only."""
        if self._arrival_ts is None:
            self._arrival_ts = self.events.ts[self.arrival.rows]
            self._arrival_ts.flags.writeable = False
        return self._arrival_ts

    def arrival_lag(self) -> np.ndarray:
        """Each record's arrival delay, in arrival order (``disorder.arrival_lag``)."""
        return arrival_lag(self.arrival_ts())

    def file_ts(self) -> list[np.ndarray]:
        """Each file's event times, in written order."""
        ts = self.arrival_ts()
        return [ts[s] for s in self.arrival.file_slices()]

    def late_masks(self, lag_batches: int = SPARK_WATERMARK_LAG) -> list[np.ndarray]:
        """Per file, the records late for ``params.watermark_delay`` (``disorder.late_mask``).

        :param lag_batches: 1 for Spark's rule, 0 for the stricter current-watermark reading.
        """
        return late_mask(self.file_ts(), self.params.watermark_delay_ms, lag_batches)

    def late_event_ids(self, lag_batches: int = SPARK_WATERMARK_LAG) -> list[str]:
        """The late records' event ids, in arrival order.

        :param lag_batches: 1 for Spark's rule, 0 for the stricter current-watermark reading.
        """
        late = np.concatenate(self.late_masks(lag_batches))
        return id_array(self.events.seq[self.arrival.rows[late]]).to_pylist()

    def picture(self, late: np.ndarray, watermarks: np.ndarray) -> DisorderPicture:
        """What ``skew.png`` and ``delays.png`` show.

        :param late: which records are late, in arrival order (all files concatenated).
        :param watermarks: the watermark each file is judged by (``disorder.file_watermarks``).
        """
        p = self.params
        bound = delay_bound_ms(p)
        late_total = int(late.sum())
        title = (f"{p.disorder} disorder, seed {p.seed}: {len(late):,} records, "
                 f"{late_total:,} late for a {p.watermark_delay} watermark delay")
        return DisorderPicture(
            arrival_ts=self.arrival_ts(), late=late,
            is_impression=self.events.kind[self.arrival.rows] == IMPRESSION,
            file_edges=self.arrival.file_edges, watermarks=watermarks,
            watermark_delay_ms=p.watermark_delay_ms, bound_ms=bound,
            zoom_ms=ZOOM_FACTOR * max(bound or 0, p.watermark_delay_ms, 1), title=title)

    @property
    def heartbeat_ts(self) -> Optional[int]:
        """Last event time + watermark delay + 1 ms: enough for the watermark to pass every
        goal (``None`` without a heartbeat or without events)."""
        if not self.params.heartbeat or not len(self.events):
            return None
        return int(self.events.ts.max()) + self.params.watermark_delay_ms + 1


@dataclass
class GenerationResult:
    """What ``generate`` wrote."""

    out: Path
    dataset: Dataset
    event_files: list[Path]
    manifest: dict
    truth: Optional[pa.Table] = None          # the truth rows as written (output schema)
    pictures: list[Path] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    @property
    def skew_png(self) -> Optional[Path]:
        """The event-time-against-arrival picture, if drawn."""
        return next((p for p in self.pictures if p.name == SKEW_FILE), None)

    @property
    def delays_png(self) -> Optional[Path]:
        """The arrival-delay distribution picture, if drawn."""
        return next((p for p in self.pictures if p.name == DELAYS_FILE), None)

    @property
    def events_dir(self) -> Path:
        """The directory of the event files."""
        return self.out / EVENTS_DIR

    @property
    def truth_path(self) -> Path:
        """The truth file (written only when the truth was asked for)."""
        return self.out / TRUTH_FILE

    @property
    def records(self) -> int:
        """How many records the event files hold, heartbeat included."""
        return sum(f["records"] for f in self.manifest["files"])


def build(params: GeneratorParams) -> Dataset:
    """Generate the site, the users' sessions and events, and their arrival order, in memory.

    :param params: the generator's parameters (the seed makes the result reproducible).
    """
    graph = build_site(params)
    site = to_arrays(graph)
    vocab = Vocabulary(site.urls, user_ids(params.seed, params.users), site.campaigns)
    behaviour_rng = np.random.Generator(np.random.PCG64([params.seed, _BEHAVIOUR_STREAM]))
    sessions = batch_sessions(params, behaviour_rng)
    events = sessions_to_events(params, site, sessions, behaviour_rng)
    if params.end_ms is not None:  # --total-span: sessions running past the end are cut there
        events = events.take(np.nonzero(events.ts < params.end_ms)[0])
    disorder_rng = np.random.Generator(np.random.PCG64([params.seed, _DISORDER_STREAM]))
    arrival = arrange(params, events.ts, events.kind, disorder_rng)
    return Dataset(params, graph, site, vocab, sessions, events, arrival)


def _prepare_out(out: Path, overwrite: bool) -> Path:
    events_dir = out / EVENTS_DIR
    existing = [p for p in (events_dir, out / TRUTH_FILE, out / MANIFEST_FILE) if p.exists()]
    if existing and not overwrite:
        raise OutputExists(f"{out} already holds generated data ({existing[0].name}); "
                           "choose another directory or pass --overwrite")
    if events_dir.exists():
        shutil.rmtree(events_dir)
    for stale in (out / TRUTH_FILE, out / MANIFEST_FILE, out / SKEW_FILE, out / DELAYS_FILE,
                  out / manifest_mod.LATE_IDS_FILE):
        if stale.exists():
            stale.unlink()
    events_dir.mkdir(parents=True)
    return events_dir


def generate(params: GeneratorParams, out, *, truth: bool = True, plot: bool = True,
             overwrite: bool = False, progress: bool = False,
             processes: Optional[int] = None) -> GenerationResult:
    """Generate a dataset and write events, truth, manifest and pictures under ``out``.

    :param params: the generator's parameters.
    :param out: the output directory.
    :param truth: compute ``truth/attributions.parquet`` (the slow part of a large run).
    :param plot: draw ``skew.png`` and ``delays.png`` (skipped when matplotlib is missing).
    :param overwrite: replace a dataset already in ``out``.
    :param progress: a progress bar and notes on stderr.
    :param processes: processes to use, this one included; ``None`` picks two for a large run
        on two or more cores (``workers.processes_for``). The output does not depend on it.
    :raises OutputExists: when ``out`` already holds a dataset and ``overwrite`` is false.
    """
    out = Path(out)
    events_dir = _prepare_out(out, overwrite)
    processes = processes_for(params.users, processes) if truth or plot else 1
    helper_modules = (("generators.skew", "matplotlib.figure") if plot else ()) + \
        (("generators.truth",) if truth else ())
    pool = start_helpers(processes, helper_modules)
    try:
        return _generate(params, out, events_dir, truth, plot, progress, processes, pool)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _generate(params: GeneratorParams, out: Path, events_dir: Path, truth: bool, plot: bool,
              progress: bool, processes: int, pool) -> GenerationResult:
    seconds = {}
    started = time.perf_counter()
    dataset = build(params)
    seconds["build"] = time.perf_counter() - started

    slices = dataset.arrival.file_slices()
    watermarks = file_watermarks(dataset.file_ts(), params.watermark_delay_ms)
    masks = dataset.late_masks()
    picture = None
    if plot:
        picture = dataset.picture(np.concatenate(masks) if masks else np.empty(0, bool),
                                  watermarks)
    # The helper draws while this process writes the files.
    pictures_future = pool.submit(draw_pictures, picture, out) if plot and pool else None

    started = time.perf_counter()
    n_files = len(slices) + (1 if params.heartbeat else 0)
    # Spark's file source orders new files by modification time (milliseconds); give each
    # file its own second, in name order, so a stream replays them in arrival order.
    first_mtime = (time.time_ns() // 1_000_000_000 - n_files) * 1_000_000_000
    files, paths = [], []
    for k in tqdm(range(len(slices)), desc="writing event files", unit="file", file=sys.stderr,
                  disable=not progress):
        path = events_dir / part_name(k, params.format)
        chunk = dataset.file_events(k)
        write_events_file(path, params.format, chunk, dataset.vocab, params.seed,
                          mtime_ns=first_mtime + k * 1_000_000_000)
        files.append(_file_entry(path, chunk.ts, watermarks[k], int(masks[k].sum())))
        paths.append(path)
    heartbeat = None
    if params.heartbeat:
        path = events_dir / part_name(len(slices), params.format)
        record = heartbeat_record(dataset.heartbeat_ts, len(dataset.events))
        write_events_file(path, params.format, None, dataset.vocab, params.seed, heartbeat=record,
                          mtime_ns=first_mtime + len(slices) * 1_000_000_000)
        heartbeat = {"file": path.name, "event_id": record["event_id"], "ts_ms": record["ts"]}
        all_ts = dataset.file_ts() + [np.array([record["ts"]])]
        files.append(_file_entry(path, all_ts[-1],
                                 file_watermarks(all_ts, params.watermark_delay_ms)[-1], 0))
        paths.append(path)
    seconds["write"] = time.perf_counter() - started

    table = None
    truth_summary = None
    if truth:
        started = time.perf_counter()
        if progress:
            print(f"computing the truth over {len(dataset.arrival.rows):,} records "
                  f"({processes} process{'es' if processes > 1 else ''}) ...", file=sys.stderr)
        config = params.attribution_config()
        computed = compute_truth(events_dir, params.format, config, pool, processes)
        table = computed.table
        write_truth(table, out / TRUTH_FILE)
        truth_summary = manifest_mod.truth_summary(table, config, computed.multi_candidate,
                                                   TRUTH_FILE.as_posix(), out / TRUTH_FILE)
        seconds["truth"] = time.perf_counter() - started

    late_ids = dataset.late_event_ids()
    strict_late = int(sum(m.sum() for m in dataset.late_masks(lag_batches=0)))
    manifest = manifest_mod.build_manifest(dataset, files, late_ids, strict_late, truth_summary,
                                           heartbeat)
    manifest_mod.write_manifest(manifest, out, late_ids)

    pictures: list[Path] = []
    if plot:
        started = time.perf_counter()
        pictures = pictures_future.result() if pictures_future else draw_pictures(picture, out)
        # When the helper drew them, this is only how long this process still had to wait.
        seconds["plot wait" if pictures_future else "plot"] = time.perf_counter() - started
    return GenerationResult(out, dataset, paths, manifest, table, pictures, seconds)


def _file_entry(path: Path, ts: np.ndarray, watermark: int, late: int) -> dict:
    return {"name": path.name, "records": int(len(ts)),
            "min_ts_ms": int(ts.min()) if len(ts) else None,
            "max_ts_ms": int(ts.max()) if len(ts) else None,
            "late_watermark_ms": int(watermark), "late_records": late,
            "sha256": manifest_mod.sha256_of(path)}
