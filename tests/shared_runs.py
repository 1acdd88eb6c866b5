"""Runs and readings that several test modules of the Spark tier share (they import these, never
each other):

* ``named``, ``ch7_made_late``, ``late_table``: the chapter 7 files made late (watermark delay 1
  minute, one file per micro-batch) through the attribution job, on local paths or ``file://``
  URIs, and what such a run leaves: its report, changelog, net table and late records;
* ``whole_locations``, ``last_execution_id``, ``files_read_since``: how many input files a
  run's SQL executions read, from Spark's own metrics;
* ``COPY_ORDERS``, ``stage_conflicting_copies_in_both_orders``, ``order_of``: the conflicting
  copies of ``support.datasets.conflicting_copies`` in both arrival orders at once, each order for
  its own users, so that one stream answers for both.
"""
from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from support.datasets import stage_in_arrival_order
from support.outputs import PARQUET_OUTPUT

# -- the chapter 7 files made late -----------------------------------------------------------------


def named(path: Path, uri: bool) -> str:
    """``path`` as the job is given it: a local path, or a ``file://`` URI (which the job reads
    and writes through Hadoop's file system, as it would ``hdfs://``)."""
    return f"file://{path}" if uri else str(path)


def ch7_made_late(spark, root: Path, ch7_dir: Path, *options: str, uri: bool = False):
    """Stage the chapter 7 files under ``root / "in"`` and run the attribution job on them with a
    watermark delay of 1 minute, one file per micro-batch, Parquet output (``root / "out"``),
    its checkpoint in ``root / "cp"`` and ``options``; with ``uri``, the checkpoint and the
    outputs are given as ``file://`` URIs.

    :returns: the run's report; its changelog as a Counter of (goal, impression id, sign,
        revision, timing); the (goal, impression id) of its net table's attributed rows; and the
        event ids of its late-record output (``root / "out-late"``), sorted.
    """
    import pandas as pd

    from attribution.spark.changelog import fold_changelog
    from attribution.spark.late_records import read_late_records
    from attribution.spark.output import read_attributions
    from jobs.attribution_job import parse_args, run

    events = stage_in_arrival_order(sorted(ch7_dir.glob("part-*.json")), root / "in")
    args = parse_args(["--events", str(events), "--output", named(root / "out", uri),
                       "--checkpoint", named(root / "cp", uri), "--quiet", *PARQUET_OUTPUT,
                       "--watermark-delay", "1 minute", "--max-files-per-trigger", "1",
                       *options])
    report = run(spark, args)
    frame = read_attributions(str(root / "out"))
    changelog = Counter(
        (r.goal_event_id, None if pd.isna(r.impression_id) else int(r.impression_id),
         int(r.sign), int(r.revision), r.emit_timing) for r in frame.itertuples())
    net = {(r.goal_event_id, int(r.impression_id)) for r in fold_changelog(frame).itertuples()
           if not pd.isna(r.impression_id)}
    late = sorted(json.loads(r["raw_record"])["event_id"]
                  for r in read_late_records(str(root / "out-late")).to_pylist())
    return report, changelog, net, late


def late_table(late_dir: Path) -> list[tuple]:
    """The late records, without what differs between two runs (the time they ran, the
    directory of their input): in order, each record with its reason, watermark and batch."""
    from attribution.spark.late_records import read_late_records

    return sorted((r["raw_record"], r["reason"], r["watermark"], r["allowed_lateness_ms"],
                   r["batch_id"], r["source_file"].rsplit("/", 1)[-1])
                  for r in read_late_records(str(late_dir)).to_pylist())


# -- the input files a run read --------------------------------------------------------------------

FILES_READ = "number of files read"  # FileSourceScanExec's metric


def _scala_items(collection) -> list:
    """A Scala collection's elements (through py4j)."""
    iterator, out = collection.iterator(), []
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def _executions(spark) -> list:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    return _scala_items(spark._jsparkSession.sharedState().statusStore().executionsList())


def last_execution_id(spark) -> int:
    """The id of the latest SQL execution Spark has recorded (-1: none)."""
    return max((e.executionId() for e in _executions(spark)), default=-1)


@contextmanager
def whole_locations(spark) -> Iterator[None]:
    """Inside, plans name their scans' locations in full (Spark cuts them at 100 characters), so
    that ``files_read_since`` can tell the input's scans by their directory."""
    key = "spark.sql.maxMetadataStringLength"
    spark.conf.set(key, "100000")
    try:
        yield
    finally:
        spark.conf.unset(key)


def files_read_since(spark, after: int, under: Path) -> int:
    """How many files under ``under`` Spark's file scans read in the SQL executions after
    ``after`` (``last_execution_id``): the sum of the "number of files read" metrics of the
    scans whose location is there (a Delta output's commits scan its own log too, which is not
    the input). The plans must have been made inside ``whole_locations``."""
    store = spark._jsparkSession.sharedState().statusStore()
    total = 0
    for execution in _executions(spark):
        if execution.executionId() <= after:
            continue
        ids = {m.accumulatorId()
               for node in _scala_items(store.planGraph(execution.executionId()).allNodes())
               if node.name().startswith("Scan") and str(under) in node.desc()
               for m in _scala_items(node.metrics()) if m.name() == FILES_READ}
        values = {kv._1(): kv._2() for kv in
                  _scala_items(store.executionMetrics(execution.executionId()))}
        total += sum(int(values[i].replace(",", "")) for i in ids if i in values)
    return total


# -- conflicting copies, both orders in one stream -------------------------------------------------

# The arrival orders of each pair of copies: the smaller copy in the first file or in the second.
COPY_ORDERS = ("smaller-first", "smaller-last")
_ORDER_MARK = "@"  # a user of order o is "<user>@<o>"


def stage_conflicting_copies_in_both_orders(dest: Path) -> Path:
    """``support.datasets.conflicting_copies`` twice over, as three JSON-lines files staged in
    arrival order under ``dest``: each user once per order of ``COPY_ORDERS`` (``<user>@<order>``),
    the records without copies and the first copy of each pair in the first file, the other copies
    in the second, then a heartbeat at minute 30. Users are independent, so each order's users
    see what ``support.datasets.stage_conflicting_copies`` gives them alone; the watermark, which
    all users share, moves as it does there (both orders have the same times). With a watermark
    delay of 10 minutes nothing is late."""
    from attribution import Event
    from attribution.spark.files import write_events
    from support.datasets import conflicting_copies

    smaller, larger, common = conflicting_copies()
    files: list[list] = [[], [], []]
    for order in COPY_ORDERS:
        first, second = (smaller, larger) if order == "smaller-first" else (larger, smaller)
        for k, events in enumerate((common + first, second)):
            files[k] += [e._replace(user_id=f"{e.user_id}{_ORDER_MARK}{order}") for e in events]
    minute_0 = min(e.ts for e in smaller + larger + common)  # the copies' first record
    files[2] = [Event("hb", None, "heartbeat", minute_0 + 30 * 60_000)]
    src = dest.parent / f"{dest.name}-src"
    src.mkdir(parents=True)
    paths = [src / f"part-{n:05d}.json" for n in range(3)]
    for path, events in zip(paths, files):
        write_events(events, path, "json")
    return stage_in_arrival_order(paths, dest)


def order_of(row) -> tuple[str, object]:
    """The order of ``COPY_ORDERS`` a row of ``stage_conflicting_copies_in_both_orders``'s users
    belongs to, and the row with its user's own name back."""
    user, _, order = row.user_id.partition(_ORDER_MARK)
    return order, row._replace(user_id=user)
