"""The disorder models: in what order, and in which file, generated events arrive.

Every record gets an arrival time ``ts + delay``; records arrive in arrival-time order. Because
a record's arrival time is at least its own event time, every record that arrived before it has
an event time at most its arrival time, so a record arrives at most ``delay`` behind the
maximum event time seen. The models differ in the delay:

* ``bounded``: uniform in ``[0, B]``, so no record arrives more than ``B`` behind;
* ``per-source``: impressions and visits come from two collection systems, each with its own
  base lag plus jitter (impressions typically arrive after the visits they caused);
* ``heavy-tail``: Pareto delays, where a few records are very late.

On top of that, ``redelivery_rate`` delivers some events twice (same ``event_id``, each copy
with its own delay), and ``late_fraction`` makes records late *on purpose* for a watermark
delay ``D``: each is moved into a file whose watermark has already passed its event time.

Lateness follows what Spark 4.x does with a file stream read one file per micro-batch
(``late_mask``). Batch ``j``'s watermark is ``W_j = max(0, max(ts in files < j) - D)``
(``W_0 = 0``). A stateful operator drops an input row as late iff ``ts <= watermark``, but the
watermark it uses for late rows is the *previous* batch's (``PropagateWatermarkSimulator.
getInputWatermarkForLateEvents(batchId - 1)``, the default since multiple stateful operators
are allowed), so the rows of file ``k`` are judged against ``W_{k-1}``. ``lag_batches=0`` gives
the stricter reading that judges file ``k`` against ``W_k``; its late set contains Spark's.
Whole files are judged at once, so file boundaries matter.

Records made late on purpose are placed so that they are late under both readings, and bounded
disorder with ``B < D`` has no late record under either: every record then arrives less than
``D`` behind every event time seen before it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from attribution.events import Event, ts_to_ms

from .behaviour import IMPRESSION
from .params import GeneratorParams

# Late records land between the first file whose watermark passed them and this many after.
_LATE_SPREAD_FILES = 3
# Spark judges a micro-batch's late rows by the watermark of the batch before it.
SPARK_WATERMARK_LAG = 1


@dataclass
class Arrival:
    """Arrival order of one dataset: ``rows[i]`` is the event row of the i-th record to arrive
    (a redelivered event appears twice); ``file_edges`` cut ``rows`` into files;
    ``forced_late`` marks records made late on purpose."""

    rows: np.ndarray
    file_edges: np.ndarray
    forced_late: np.ndarray
    requested_late: int

    def file_slices(self) -> list[slice]:
        """One slice of ``rows`` per file, in file order."""
        return [slice(int(a), int(b)) for a, b in zip(self.file_edges[:-1], self.file_edges[1:])]


def delays(params: GeneratorParams, kind: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Transport delay (ms) of each record under the chosen model.

    :param params: the generator's settings.
    :param kind: each record's event kind (``VISIT`` or ``IMPRESSION``).
    :param rng: the random source.
    :raises ValueError: ``params.disorder`` names no model.
    """
    n = len(kind)
    if params.disorder == "bounded":
        return rng.integers(0, params.ms("max_delay") + 1, n)
    if params.disorder == "per-source":
        base = np.where(kind == IMPRESSION, params.ms("impression_lag"), params.ms("visit_lag"))
        return base + rng.integers(0, params.ms("lag_jitter") + 1, n)
    if params.disorder == "heavy-tail":
        # numpy's pareto is the Lomax form (>= 0): scale * Lomax has a power-law tail.
        scale = params.ms("tail_scale")
        tail = np.round(scale * rng.pareto(params.tail_alpha, n))
        return np.minimum(tail, 2 ** 50).astype(np.int64)
    raise ValueError(f"unknown disorder model {params.disorder!r}")


def delay_bound_ms(params: GeneratorParams) -> Optional[int]:
    """The most a record's transport delay can be under the chosen model (``None`` for the
    heavy tail, which has no bound). Records made late on purpose are outside it.

    :param params: the generator's settings.
    """
    if params.disorder == "bounded":
        return params.ms("max_delay")
    if params.disorder == "per-source":
        return max(params.ms("impression_lag"), params.ms("visit_lag")) + params.ms("lag_jitter")
    return None


def arrival_order(params: GeneratorParams, ts: np.ndarray, kind: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records in arrival order; ties keep generation order.

    :param params: the generator's settings.
    :param ts: each event's event time (epoch ms), in generation order.
    :param kind: each event's kind, in the same order.
    :param rng: the random source.
    :returns: ``(rows, arrival_ts, is_copy)``: the event row of each record, its arrival time,
        and whether it is a redelivered copy.
    """
    n = len(ts)
    copies = int(round(params.redelivery_rate * n))
    dup = np.sort(rng.choice(n, size=copies, replace=False)) if copies else np.empty(0, np.int64)
    rows = np.concatenate([np.arange(n, dtype=np.int64), dup.astype(np.int64)])
    arrive = np.concatenate([ts + delays(params, kind, rng),
                             ts[dup] + delays(params, kind[dup], rng)])
    order = np.argsort(arrive, kind="stable")
    is_copy = np.zeros(len(rows), dtype=bool)
    is_copy[n:] = True
    return rows[order], arrive[order], is_copy[order]


def arrange(params: GeneratorParams, ts: np.ndarray, kind: np.ndarray,
            rng: np.random.Generator) -> Arrival:
    """Arrival order, files, and the records made late on purpose.

    :param params: the generator's settings.
    :param ts: each event's event time (epoch ms), in generation order.
    :param kind: each event's kind, in the same order.
    :param rng: the random source.
    """
    rows, _, is_copy = arrival_order(params, ts, kind, rng)
    files = params.files
    requested = int(round(params.late_fraction * len(ts)))
    if not requested:
        edges = np.linspace(0, len(rows), files + 1).round().astype(np.int64)
        return Arrival(rows, edges, np.zeros(len(rows), dtype=bool), 0)
    redelivered = np.zeros(len(ts), dtype=bool)
    redelivered[rows[is_copy]] = True
    # Only events delivered once are made late, so "late" means the event itself is late; and
    # only those some file's watermark will have passed (judged on a first, approximate cut).
    approximate = np.linspace(0, len(rows), files + 1).round().astype(np.int64)
    last_watermark = file_watermarks([ts[rows[a:b]] for a, b in zip(approximate[:-1],
                                                                     approximate[1:])],
                                     params.watermark_delay_ms, SPARK_WATERMARK_LAG)[-1]
    eligible = np.nonzero(~redelivered[rows] & (ts[rows] <= last_watermark))[0]
    wanted = min(requested, len(eligible))
    chosen = np.sort(rng.choice(eligible, size=wanted, replace=False)) if wanted else \
        np.empty(0, np.int64)
    on_time = np.ones(len(rows), dtype=bool)
    on_time[chosen] = False
    normal = rows[on_time]

    # Files cut the on-time records evenly; late records then join files whose watermark has
    # passed them. Adding them never raises a watermark: their ts is below one already.
    cut = np.linspace(0, len(normal), files + 1).round().astype(np.int64)
    file_of_normal = np.repeat(np.arange(files), np.diff(cut))
    slot_of_normal = np.arange(len(normal)) - np.repeat(cut[:-1], np.diff(cut))
    # Spark's (lagged) watermark is at most the strict one, so late by it means late by both.
    watermark = file_watermarks([ts[normal[a:b]] for a, b in zip(cut[:-1], cut[1:])],
                                params.watermark_delay_ms, SPARK_WATERMARK_LAG)
    late_rows = rows[chosen]
    # The first file whose watermark has passed the record (watermarks never decrease).
    first_file = np.searchsorted(watermark, ts[late_rows], side="left")
    placeable = first_file < files
    target = np.minimum(first_file + rng.integers(0, _LATE_SPREAD_FILES, len(late_rows)), files - 1)
    size = np.diff(cut)[target]
    slot = rng.random(len(late_rows)) * (size + 1) - 0.5
    # A record no watermark can pass (its ts is too close to the end) keeps its place in the
    # arrival order: just before the on-time record that followed it.
    rank = chosen - np.arange(len(chosen))
    home = np.minimum(np.searchsorted(cut, rank, side="right") - 1, files - 1)
    target = np.where(placeable, target, home)
    slot = np.where(placeable, slot, rank - cut[home] - 0.5)
    file_all = np.concatenate([file_of_normal, target])
    slot_all = np.concatenate([slot_of_normal.astype(float), slot])
    all_rows = np.concatenate([normal, late_rows])
    forced = np.concatenate([np.zeros(len(normal), dtype=bool), placeable])
    order = np.lexsort((np.arange(len(all_rows)), slot_all, file_all))
    edges = np.searchsorted(file_all[order], np.arange(files + 1), side="left")
    return Arrival(all_rows[order], edges.astype(np.int64), forced[order], requested)


def file_watermarks(file_ts: Sequence[np.ndarray], delay_ms: int,
                    lag_batches: int = SPARK_WATERMARK_LAG) -> np.ndarray:
    """The watermark each file's rows are judged against when files are read one per batch.

    Batch ``j``'s watermark is the maximum event time of the files before it minus ``delay_ms``,
    never below 0 (Spark's initial watermark); file ``k`` is judged by batch ``k - lag_batches``.

    :param file_ts: each file's event times (epoch ms), files in reading order.
    :param delay_ms: the watermark delay.
    :param lag_batches: how many batches behind the watermark a file is judged by (1 is Spark's
        rule, 0 the stricter reading).
    :returns: one watermark per file.
    """
    batch = np.zeros(len(file_ts), dtype=np.int64)
    seen = None
    for k, ts in enumerate(file_ts):
        batch[k] = 0 if seen is None else max(0, seen - delay_ms)
        if len(ts):
            top = int(np.max(ts))
            seen = top if seen is None else max(seen, top)
    judged = np.zeros(len(file_ts), dtype=np.int64)
    if lag_batches < len(file_ts):
        judged[lag_batches:] = batch[: len(file_ts) - lag_batches]
    return judged


def late_mask(file_ts: Sequence[np.ndarray], delay_ms: int,
              lag_batches: int = SPARK_WATERMARK_LAG) -> list[np.ndarray]:
    """Per file, which records a one-file-per-batch Spark stream drops as late.

    See the module docstring for the rule.

    :param file_ts: each file's event times (epoch ms), files in reading order.
    :param delay_ms: the watermark delay.
    :param lag_batches: as ``file_watermarks``.
    :returns: one boolean mask per file.
    """
    watermark = file_watermarks(file_ts, delay_ms, lag_batches)
    return [np.asarray(ts, dtype=np.int64) <= w for ts, w in zip(file_ts, watermark)]


def _ts_and_id(record: Union[Event, Mapping]) -> tuple[int, str]:
    if isinstance(record, Event):
        return record.ts, record.event_id
    return ts_to_ms(record["ts"]), record["event_id"]


def late_event_ids(files_events: Iterable[Iterable[Union[Event, Mapping]]], delay_ms: int,
                   lag_batches: int = SPARK_WATERMARK_LAG) -> list[str]:
    """The ``event_id`` of every late record, in arrival order, for files read one per
    micro-batch with watermark delay ``delay_ms`` (Spark's rule; see ``late_mask``).

    ``files_events`` lists each file's records (``Event``s or raw records with ``ts`` and
    ``event_id``), files in reading order. A redelivered event may be listed once per late copy.

    :param files_events: the files' records, as above.
    :param delay_ms: the watermark delay.
    :param lag_batches: as ``file_watermarks``.
    """
    ids: list[list[str]] = []
    stamps: list[np.ndarray] = []
    for records in files_events:
        pairs = [_ts_and_id(r) for r in records]
        stamps.append(np.array([p[0] for p in pairs], dtype=np.int64))
        ids.append([p[1] for p in pairs])
    out = []
    for file_ids, mask in zip(ids, late_mask(stamps, delay_ms, lag_batches)):
        out.extend(i for i, late in zip(file_ids, mask) if late)
    return out


def late_event_ids_in_dir(events_dir, delay_ms: int,
                          lag_batches: int = SPARK_WATERMARK_LAG) -> list[str]:
    """``late_event_ids`` for an event directory as written (files in name order).

    :param events_dir: the directory of event files (any format the generator writes).
    :param delay_ms: the watermark delay.
    :param lag_batches: as ``file_watermarks``.
    """
    from attribution.spark.files import data_files, read_event_records

    return late_event_ids((read_event_records(f) for f in data_files(events_dir)), delay_ms,
                          lag_batches)


def arrival_lag(arrival_ts: np.ndarray) -> np.ndarray:
    """How far behind the maximum event time seen so far (itself included) each record is.

    :param arrival_ts: the records' times (epoch ms) in arrival order.
    :returns: each record's lag in ms (0 for a record that raises the maximum).
    """
    if not len(arrival_ts):
        return np.empty(0, dtype=np.int64)
    return np.maximum.accumulate(arrival_ts) - arrival_ts
