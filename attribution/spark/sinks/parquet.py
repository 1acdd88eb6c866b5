"""Parquet files in a directory as a ``Sink``, laid out by a UTC date of the rows (``layout``).

Streaming queries write with Spark's file sink, which commits each micro-batch's files in the
directory's ``_spark_metadata`` log: readers that follow the log (``output``) see every row
once. Batch writes replace the directory (or only the dates they hold) and mark the end with
``_SUCCESS``. Driver-side records are one file per micro-batch, ``batch-<id>.parquet`` under the
date's directory, written under a temporary name and renamed into place: a repeated write
replaces the file whole.
"""
from __future__ import annotations

import datetime as dt
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from ..layout import by_date
from ..pipeline import apply_trigger
from ..storage import Location, location
from .base import REPLACE_ALL, REPLACE_DATES, Sink

_OVERWRITE_MODES = {REPLACE_ALL: "static", REPLACE_DATES: "dynamic"}


def micro_batch_name(batch_id: int) -> str:
    """The name of micro-batch ``batch_id``'s file of driver-side records (``micro_batch_file``).

    :param batch_id: the micro-batch.
    """
    return f"batch-{batch_id:08d}.parquet"


def micro_batch_file(root: Location, partition: tuple[str, str], batch_id: int,
                     detected: dt.datetime) -> Location:
    """Where ``ParquetSink.write_micro_batch`` puts micro-batch ``batch_id``'s records.

    :param root: the sink's directory (``storage.location``).
    :param partition: the date level, e.g. ``layout.DETECTED_DATE``.
    :param batch_id: the micro-batch.
    :param detected: when it ran (its date names the directory).
    """
    return root / f"{partition[0]}={detected.date().isoformat()}" / micro_batch_name(batch_id)


class ParquetSink(Sink):
    """Parquet files under ``path``.

    :param path: the output directory (a path or any Hadoop URI; ``write_micro_batch`` writes
        through ``storage``).
    :param partition: the date level of the layout, ``layout.GOAL_DATE`` or
        ``layout.DETECTED_DATE``; ``None`` writes flat (output an earlier version wrote flat
        keeps that layout, ``layout.is_flat``).
    :param one_file_per_date: in batch mode, gather each date's rows in one task, so each
        date gets one file instead of one per task (opening and closing a file costs
        milliseconds, and a dataset's goals span hundreds of dates).
    """

    def __init__(self, path: str, partition: Optional[tuple[str, str]] = None,
                 one_file_per_date: bool = False):
        self.path = path
        self.partition = partition
        self.one_file_per_date = one_file_per_date

    def _laid_out(self, rows):
        if self.partition is None:
            return rows, []
        return by_date(rows, self.partition)

    def start_stream(self, rows, checkpoint: str, trigger: str, query_name: str):
        """Start the streaming query writing ``rows`` under ``path``.

        :param rows: a streaming DataFrame.
        :param checkpoint: the query's checkpoint location.
        :param trigger: ``available-now`` or a processing-time interval.
        :param query_name: the query's name in Spark's progress and UI.
        """
        rows, columns = self._laid_out(rows)
        writer = (rows.writeStream.format("parquet").outputMode("append").partitionBy(*columns)
                  .option("path", self.path).option("checkpointLocation", checkpoint)
                  .queryName(query_name))
        return apply_trigger(writer, trigger).start()

    def write_batch(self, rows, replace: str = REPLACE_ALL) -> None:
        """Write ``rows`` under ``path``, replacing what ``replace`` says.

        :param rows: a batch DataFrame.
        :param replace: ``REPLACE_ALL``: everything; ``REPLACE_DATES``: only the dates the rows
            hold.
        """
        if replace not in _OVERWRITE_MODES:
            raise ValueError(f"replace must be one of {', '.join(_OVERWRITE_MODES)}, "
                             f"got {replace!r}")
        rows, columns = self._laid_out(rows)
        if columns and self.one_file_per_date:
            rows = rows.repartition(*columns)
        (rows.write.mode("overwrite").option("partitionOverwriteMode", _OVERWRITE_MODES[replace])
         .partitionBy(*columns).parquet(self.path))

    def write_micro_batch(self, batch_id: int, table: pa.Table, detected: dt.datetime) -> None:
        """Write one micro-batch's driver-side records as one file, atomically.

        :param batch_id: the micro-batch the records belong to.
        :param table: the records.
        :param detected: when the micro-batch ran (its date names the directory).
        """
        if self.partition is None:
            raise ValueError("driver-side records are written by date: give the sink a partition")
        target = micro_batch_file(location(self.path), self.partition, batch_id, detected)
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        target.write_bytes(buffer.getvalue().to_pybytes())  # a temporary file renamed over it
