"""Drive stream-stream joins step by step from files, deterministically (for tests and demos).

Both sides of a join come from ONE file source: every row has a ``side`` column (``L``/``R``) and
``split`` filters the stream into the two inputs. A step is one JSON-lines file, written under a
hidden name and renamed into place, so Spark sees all of a step's rows at once; then
``processAllAvailable()`` runs the step's micro-batch and the no-data batch that applies the
watermark it raised. Outputs are collected per step through ``foreachBatch``, so a test can say
exactly which rows were emitted by which step. No sleeps, no wall-clock time.
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional

from .durations import ms_to_iso

STEP_SCHEMA = "side STRING, id STRING, ts TIMESTAMP"

# Small-state settings for tests: one shuffle partition (each join keeps 4 state stores per
# partition) and RocksDB changelog checkpointing (commits write a changelog instead of uploading
# a snapshot). Together they make a micro-batch about 2-3x cheaper; join semantics are unchanged.
FAST_STATE_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


@contextmanager
def session_conf(spark, conf: Mapping[str, str]) -> Iterator[None]:
    """Set runtime SQL confs for the duration of a block, then restore the previous values.

    Streaming queries read these when they start; queries started inside the block keep them.

    :param spark: the ``SparkSession`` whose runtime conf to change.
    :param conf: SQL conf keys and the values to hold inside the block.
    """
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def row(side: str, row_id: str, seconds: float) -> dict:
    """One input row for ``StepDriver.write``.

    :param side: ``L`` or ``R``, the join side the row feeds.
    :param row_id: the row's ``id`` (the join key in the default schema).
    :param seconds: its event time, in seconds after the epoch.
    """
    return {"side": side, "id": row_id, "ts": ms_to_iso(int(round(seconds * 1000)))}


class StepDriver:
    """Feeds one streaming query one file per step and records what each step emitted.

    Creating it prepares the input directory; nothing runs until ``start``.

    :param spark: the ``SparkSession`` to read and run with.
    :param root: the directory for the step files and the checkpoint (a new temporary
        directory by default).
    :param schema: the DDL schema of the step files.
    :param max_files_per_trigger: the file source's ``maxFilesPerTrigger`` (unset by
        default: a step's file is read in one micro-batch).
    """

    def __init__(self, spark, root: Optional[Path] = None, schema: str = STEP_SCHEMA,
                 max_files_per_trigger: Optional[int] = None):
        self.spark = spark
        self.root = Path(root or tempfile.mkdtemp(prefix="joinsteps-"))
        self.input_dir = self.root / "input"
        self.input_dir.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.max_files_per_trigger = max_files_per_trigger
        self._counter = itertools.count()
        self.query = None
        self._batches: list[tuple[int, list]] = []
        self._seen = 0

    def source(self):
        """The input directory as a stream (read once; call ``split`` for the two sides)."""
        reader = self.spark.readStream.schema(self.schema).option("timestampFormat",
                                                                  "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX")
        if self.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", self.max_files_per_trigger)
        return reader.json(str(self.input_dir))

    @staticmethod
    def split(stream):
        """The ``L`` and ``R`` rows of the stream, without the ``side`` column.

        :param stream: the stream ``source`` returned (possibly watermarked).
        :returns: the left and the right input, in that order.
        """
        from pyspark.sql import functions as F

        return (stream.filter(F.col("side") == "L").drop("side"),
                stream.filter(F.col("side") == "R").drop("side"))

    def write(self, rows: Iterable[dict]) -> Path:
        """Write one step file atomically (Spark ignores hidden files until the rename).

        :param rows: the step's rows as dicts (``row`` builds them).
        :returns: the path of the file written.
        """
        n = next(self._counter)
        final = self.input_dir / f"step-{n:05d}.json"
        hidden = self.input_dir / f".step-{n:05d}.json.tmp"
        with open(hidden, "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
        os.rename(hidden, final)
        return final

    def start(self, df, to_tuple: Optional[Callable] = None):
        """Start ``df`` with a collecting ``foreachBatch`` sink and its own checkpoint.

        :param df: the streaming DataFrame to run (the join built from ``split``'s sides).
        :param to_tuple: turns each output ``Row`` into the value recorded (``tuple`` by
            default).
        :returns: the started ``StreamingQuery``.
        """
        convert = to_tuple or tuple

        def collect(batch_df, batch_id):
            self._batches.append((batch_id, [convert(r) for r in batch_df.collect()]))

        self.query = (df.writeStream.foreachBatch(collect)
                      .option("checkpointLocation", str(self.root / "checkpoint")).start())
        return self.query

    def step(self, rows: Iterable[dict]) -> list:
        """Write one step, process it fully, and return the rows it emitted.

        :param rows: the step's rows as dicts (``row`` builds them).
        """
        self.write(rows)
        self.query.processAllAvailable()
        return self.drain()

    def drain(self) -> list:
        """Rows emitted since the last call."""
        out = [r for _, rows in self._batches[self._seen:] for r in rows]
        self._seen = len(self._batches)
        return out

    def stop(self) -> None:
        """Stop the query, if one was started."""
        if self.query is not None:
            self.query.stop()
