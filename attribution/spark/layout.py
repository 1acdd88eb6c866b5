"""How the job's Parquet outputs are laid out in directories: by a UTC date of their rows.

* attribution output: one directory per goal date, ``goal_date=YYYY-MM-DD``, the UTC date of
  ``goal_ts`` (``attribution.schema.PARTITION_FIELD``);
* the dead letter: one directory per detection date, ``detected_date=YYYY-MM-DD``, the UTC date
  of ``detected_at`` (the late-record output, ``late_records``, uses the same level).

A date column is computed from its source column and handed to the writer's ``partitionBy``,
which makes it a directory level instead of a column of the part files. Spark's readers turn
the directory level back into a column.

Output written before this layout (a *flat* output: its part files at the top level) keeps its
layout when a streaming query resumes on it (``is_flat``): Spark cannot read a directory that
mixes both, so partitioning a query that has already written flat files would break its output.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..config import MS_PER_DAY
from ..schema import PARTITION_COLUMN, PARTITION_SOURCE
from .storage import location

GOAL_DATE = (PARTITION_COLUMN, PARTITION_SOURCE)  # (partition column, the time it is the date of)
DETECTED_DATE = ("detected_date", "detected_at")


def utc_date(ts: Column) -> Column:
    """The UTC date of a timestamp column, whatever the session's time zone
    (``spark.sql.session.timeZone`` moves ``to_date``). Integer arithmetic on epoch
    milliseconds, floor division included, so times before 1970 get their own date too.

    :param ts: a timestamp column.
    :returns: a date column.
    """
    ms = F.unix_millis(ts)
    day = F.lit(MS_PER_DAY)
    return F.date_from_unix_date(((ms - F.pmod(ms, day)) / day).cast("int"))


def by_date(frame: DataFrame, partition: tuple[str, str],
            partitioned: bool = True) -> tuple[DataFrame, list[str]]:
    """A frame ready for a date-partitioned write.

    :param frame: the rows to write.
    :param partition: ``GOAL_DATE`` or ``DETECTED_DATE``: the date column and its source.
    :param partitioned: false for a flat output (see ``is_flat``).
    :returns: ``frame`` with the date column added, and the columns to hand to the writer's
        ``partitionBy``; for a flat output, ``frame`` as it is and no columns.
    """
    if not partitioned:
        return frame, []
    column, source = partition
    return frame.withColumn(column, utc_date(F.col(source))), [column]


def is_flat(path: str) -> bool:
    """True when an output directory holds Parquet part files at its top level: it was written
    without partitions, by a version of the job before them. A new or empty directory is not
    flat.

    :param path: the output directory, a path or any Hadoop URI (``storage``; a URI once Spark
        runs).
    """
    return any(p.suffix == ".parquet" and not p.name.startswith((".", "_")) and p.is_file()
               for p in location(path).iterdir())
