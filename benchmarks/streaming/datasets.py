"""The benchmark's inputs: the standard datasets (``PROFILES``), generating a dataset with the
project's generator, and the facts about it that runs are checked against (the native count's
closed windows, the core's state) or that the tables print (its event time per micro-batch)."""
from __future__ import annotations

import io
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from attribution.config import (
    DEFAULT_MODELS,
    DEFAULT_WATERMARK_DELAY,
    AttributionConfig,
    parse_duration_ms,
)

from .console import log
from .kinds import NATIVE_WINDOW


@dataclass(frozen=True)
class Profile:
    """A standard dataset of the main table: how the generator makes it.

    :param description: what its micro-batches hold, as the table's title says it.
    :param files: its event files (one micro-batch each with ``--max-files-per-trigger 1``),
        unless ``--files`` says otherwise.
    :param generator: its generator parameters (``GeneratorParams`` fields) beyond the
        benchmark's own (seed, Parquet, files, heartbeat, watermark delay, users).
    """

    description: str
    files: int
    generator: dict = field(default_factory=dict)


# The main table's datasets, one entry per profile (``--profile``).
PROFILES = {
    # The generator's defaults: users starting over 60 days and returning for months, so each
    # of the 20 micro-batches spans weeks of event time and writes into dozens of goal dates.
    "standard": Profile("the generator's defaults: weeks of event time per micro-batch", 20),
    # One day of a live stream: every event within 24 h (users starting over the first 20 h,
    # returning about every 2 h), in 288 arrival-ordered files, so each micro-batch spans
    # minutes of event time (at 1,000,000 events: 3 to 16, 6 at the median; longer in the first
    # hours, which fewer users share; the arrival disorder of --max-delay included).
    "realistic": Profile("one day of events, minutes of event time per micro-batch", 288,
                         {"span": "20 hours", "total_span": "1 day", "session_gap": "2 hours"}),
}
DEFAULT_PROFILE = "standard"


@dataclass
class Dataset:
    """A generated input and the facts every run is checked against."""

    label: str
    root: Path
    events_dir: Path
    records: int                  # input records, heartbeat included
    files: int                    # event files, heartbeat file included
    final_watermark_ms: int       # the watermark once the heartbeat has been read
    watermark_delay: str
    config: AttributionConfig
    goals: int = 0
    attributed: int = 0
    # The event time of each event file, heartbeat aside: (first, last) ms, in arrival order.
    file_event_times: list = field(default_factory=list)

    def batch_event_times_s(self, files_per_batch: int) -> list[float]:
        """The event time each micro-batch spans, seconds from its earliest event to its latest,
        when the file source reads ``files_per_batch`` files per micro-batch (the heartbeat's
        aside).

        :param files_per_batch: the file source's files per micro-batch.
        """
        spans = []
        for k in range(0, len(self.file_event_times), files_per_batch):
            chunk = self.file_event_times[k:k + files_per_batch]
            spans.append((max(last for _, last in chunk) - min(first for first, _ in chunk))
                         / 1000)
        return spans

    @property
    def event_time_s(self) -> float:
        """Seconds from the earliest event to the latest, heartbeat aside."""
        if not self.file_event_times:
            return 0.0
        return (max(last for _, last in self.file_event_times)
                - min(first for first, _ in self.file_event_times)) / 1000


def _events_per_user(base: dict) -> float:
    """Mean records per user for these generator settings, from a small in-memory probe."""
    from generators.dataset import build
    from generators.params import GeneratorParams

    probe = build(GeneratorParams(**{**base, "users": 2_000}))
    return len(probe.events) / 2_000


def make_dataset(root: Path, events: int, files: int, seed: int, label: str,
                 models: tuple = DEFAULT_MODELS, **overrides) -> Dataset:
    """Generate about ``events`` records (Parquet, ``files`` files and a heartbeat) under
    ``root``; its runs attribute with ``models``.

    :param root: the directory the dataset is written under.
    :param events: about how many records to generate.
    :param files: how many data files.
    :param seed: the generator's seed.
    :param label: the dataset's name in the tables.
    :param models: the attribution models its runs use.
    :param overrides: further generator parameters (``GeneratorParams`` fields).
    """
    from generators.dataset import generate
    from generators.params import GeneratorParams

    base = {"seed": seed, "format": "parquet", "files": files, "heartbeat": True,
            "watermark_delay": DEFAULT_WATERMARK_DELAY, **overrides}
    users = max(2, round(events / _events_per_user(base)))
    params = GeneratorParams(**{**base, "users": users})
    started = time.perf_counter()
    result = generate(params, root, truth=False, plot=False, overwrite=True)
    log(f"generated {label}: {result.records:,} records for {users:,} users in "
        f"{len(result.event_files)} files ({time.perf_counter() - started:.1f}s) under {root}")
    heartbeat = result.manifest["heartbeat"]["ts_ms"]
    event_files = result.manifest["files"][:len(result.event_files) - 1]  # heartbeat's is last
    return Dataset(label=label, root=root, events_dir=result.events_dir, records=result.records,
                   files=len(result.event_files),
                   final_watermark_ms=heartbeat - params.watermark_delay_ms,
                   watermark_delay=params.watermark_delay,
                   config=replace(params.attribution_config(), models=models),
                   file_event_times=[(f["min_ts_ms"], f["max_ts_ms"]) for f in event_files
                                     if f["records"]])


def closed_window_events(dataset: Dataset) -> int:
    """How many events the native count must have emitted: append mode emits a window once the
    final watermark has passed its end, so events in a still-open window are not counted yet.

    :param dataset: the generated dataset.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.spark.files import data_files

    window_ms = parse_duration_ms(NATIVE_WINDOW)
    total = 0
    for f in data_files(dataset.events_dir):
        table = pq.read_table(f, columns=["event_type", "ts"])
        ms = pc.divide(table.column("ts").cast("int64"), 1000)
        end = pc.add(pc.multiply(pc.divide(ms, window_ms), window_ms), window_ms)
        closed = pc.and_(pc.less_equal(end, dataset.final_watermark_ms),
                         pc.not_equal(table.column("event_type"), "heartbeat"))
        total += pc.sum(closed.cast("int64")).as_py() or 0
    return total


def read_events_arrow(events_dir: Path) -> list:
    """The events of a Parquet dataset as core ``Event``s, column-wise through pyarrow.

    The generator's files are valid by construction, so per-record validation (``parse_event``)
    is skipped: this measures the core, not the validator.

    :param events_dir: the dataset's directory of Parquet files.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from attribution.events import Event
    from attribution.spark.files import data_files

    out = []
    for f in data_files(events_dir):
        table = pq.read_table(f)
        ts = pc.divide(table.column("ts").cast("int64"), 1000).to_pylist()
        cols = [table.column(c).to_pylist() for c in
                ("event_id", "user_id", "event_type", "url", "referer", "is_goal",
                 "impression_id", "source_url", "target_url")]
        for eid, uid, typ, t, url, ref, goal, iid, src, tgt in zip(
                cols[0], cols[1], cols[2], ts, *cols[3:]):
            out.append(Event(eid, uid, typ, t, url, ref, goal is True, iid, src, tgt))
    return out


def measure_state_encoding(dataset: Dataset, events: list) -> dict:
    """The core's state once every event is in and every goal attributed, before any GC.

    The core's blob per user is what transformWithState (compact layout) stores, and what
    applyInPandasWithState stores inside its bucket maps (with the user id and wake-up next to
    it); both are measured per retained event, next to the same events' Avro encoding
    (``EVENT_SCHEMA``, schemaless).

    :param dataset: the generated dataset.
    :param events: its events, as ``read_events_arrow`` returns them.
    """
    import fastavro

    from attribution.core import WATERMARK_INFINITY, UserAttribution
    from attribution.schema import EVENT_SCHEMA
    from attribution.spark.apply_in_pandas import encode_bucket, state_text
    from attribution.spark.pipeline import DEFAULT_STATE_BUCKETS

    by_user = defaultdict(list)
    for e in events:
        if e.event_type != "heartbeat":
            by_user[e.user_id].append(e)
    by_id = {e.event_id: e for e in events}
    retained = blob_bytes = avro_bytes = users_with_state = 0
    bucket_entries = {}
    buf = io.BytesIO()
    # What the core costs per user, one call each (perf_counter, CPU-bound).
    cost = dict.fromkeys(("add", "fire", "to_bytes", "from_bytes"), 0.0)
    clock = time.perf_counter
    for user_id, user_events in by_user.items():
        t0 = clock()
        core = UserAttribution(user_id, dataset.config)
        core.add(user_events)
        t1 = clock()
        core.fire(WATERMARK_INFINITY)  # every goal attributed; nothing collected
        t2 = clock()
        cost["add"] += t1 - t0
        cost["fire"] += t2 - t1
        if core.is_empty:
            continue
        users_with_state += 1
        t0 = clock()
        blob = core.to_bytes()
        t1 = clock()
        UserAttribution.from_bytes(blob, dataset.config)
        cost["to_bytes"] += t1 - t0
        cost["from_bytes"] += clock() - t1
        blob_bytes += len(blob)
        bucket_entries[user_id] = (core.next_wakeup(), blob, "")
        snapshot = core.snapshot()
        for event_id in [*(v.event_id for v in snapshot.visits),
                         *(i.event_id for i in snapshot.impressions)]:
            retained += 1
            buf.seek(0)
            buf.truncate()
            fastavro.schemaless_writer(buf, EVENT_SCHEMA, by_id[event_id].to_record())
            avro_bytes += buf.tell()
    # applyInPandasWithState keeps these blobs in compressed per-bucket maps, stored as base64
    # text: the users are split into as many buckets as the job's default (by crc32 here,
    # xxhash64 in Spark: the sizes differ only by chance).
    buckets: dict = defaultdict(dict)
    for user_id, entry in bucket_entries.items():
        buckets[zlib.crc32(user_id.encode()) % DEFAULT_STATE_BUCKETS][user_id] = entry
    bucket_bytes = sum(len(state_text(encode_bucket(users))) for users in buckets.values())
    return {"users_with_state": users_with_state, "retained_events": retained,
            "blob_bytes": blob_bytes, "avro_bytes": avro_bytes, "bucket_bytes": bucket_bytes,
            "blob_bytes_per_event": blob_bytes / retained if retained else None,
            "bucket_bytes_per_event": bucket_bytes / retained if retained else None,
            "avro_bytes_per_event": avro_bytes / retained if retained else None,
            "users": len(by_user), "core_seconds": cost}

