"""Reading attribution output: only the rows a job committed, as pandas, Spark or core rows.

A Spark file sink writes a micro-batch's part files first and commits them afterwards by listing
them in the batch's file of the ``_spark_metadata`` log. A job killed in between leaves part files
that no batch committed (complete copies of rows a restart writes again, or 0-byte files), so a
plain listing of the directory, as ``pyarrow.parquet.read_table(dir)`` or ``pandas.read_parquet``
do, returns duplicated rows or fails. The readers here trust the commit record instead:

* a streaming output (``_spark_metadata/`` present): exactly the files its log lists, as Spark's
  own ``spark.read.parquet(dir)`` does;
* a batch output (``df.write.parquet``): its part files (under ``goal_date=...`` directories, or
  at the top level in output written before partitions), only while the ``_SUCCESS`` marker
  says the last write finished; files under hidden directories (``_temporary``,
  ``.spark-staging-*``) are a write in progress, never output;
* a single Parquet file (a generator's truth file): that file.

Anything else is refused with ``NotAttributionOutput``. Output written before spec sections 7
and 8 lacks their columns; the readers add them with the values a run without those features
writes (``ABSENT_COLUMN_DEFAULTS``), so callers see one shape. That shape ends with the partition
column ``goal_date`` (``attribution.schema.PARTITION_FIELD``), the UTC date of ``goal_ts``,
whatever the layout the rows were read from.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Union
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from ..core import Attribution
from ..events import ts_to_ms
from ..schema import (
    OUTPUT_FIELDS,
    OUTPUT_SCHEMA,
    PARTITION_COLUMN,
    PARTITION_FIELD,
    PARTITION_SOURCE,
)
from .types import arrow_schema, spark_struct

if TYPE_CHECKING:
    import pandas as pd

PathLike = Union[str, Path]
SINK_LOG_DIR = "_spark_metadata"
DELTA_LOG_DIR = "_delta_log"  # a Delta table's transaction log: its presence makes a path Delta
SUCCESS_MARKER = "_SUCCESS"
# A backfill's record of the goal dates it is replacing, from its start until it has finished;
# the job removes SUCCESS_MARKER meanwhile (``attribution.spark.backfill``).
BACKFILL_MARKER = "_BACKFILL"
SINK_LOG_VERSION = "v1"  # FileStreamSinkLog.VERSION; a log of another version is refused
_LOG_BATCH_FILE = re.compile(r"^(\d+)(\.compact)?$")  # "7", "9.compact"; not ".7.crc" or temps

# The columns spec sections 7 and 8 add: Avro type, and the value when the feature is off,
# which is also what the column means in output written before it existed.
_ADDED_COLUMNS = {
    "impression_campaign": (["null", "string"], None),
    "goal_value": (["null", "double"], None),
    "credited_value": (["null", "double"], None),
    "sign": ("int", 1),
    "revision": ("int", 0),
    "emit_timing": ("string", "ON_TIME"),
}
ABSENT_COLUMN_DEFAULTS = {name: default for name, (_, default) in _ADDED_COLUMNS.items()}
REQUIRED_COLUMNS = tuple(f for f in OUTPUT_FIELDS if f not in ABSENT_COLUMN_DEFAULTS)


class NotAttributionOutput(ValueError):
    """The path holds no committed attribution output; the message says what was found."""


def _absent_columns_schema() -> dict:
    """The added columns as an Avro record, typed as ``OUTPUT_SCHEMA`` types those it has."""
    declared = {f["name"]: f for f in OUTPUT_SCHEMA["fields"]}
    return {"type": "record", "name": "AddedColumns",
            "fields": [declared.get(name, {"name": name, "type": avro_type})
                       for name, (avro_type, _) in _ADDED_COLUMNS.items()]}


def committed_files(path: PathLike) -> list[Path]:
    """The Parquet files of a job's output directory that the job committed, in commit order.

    ``path`` is a streaming output (its ``_spark_metadata`` log decides, as for Spark) or a batch
    output (its part files, in path order, once ``_SUCCESS`` exists; see the module docstring).
    Raises ``NotAttributionOutput`` for a missing path or a directory with neither, naming an
    unfinished backfill when there is one.
    """
    path = Path(path)
    if not path.exists():
        raise NotAttributionOutput(f"{path} does not exist")
    if not path.is_dir():
        raise NotAttributionOutput(f"{path} is not a directory")
    if (path / SINK_LOG_DIR).is_dir():
        return sink_log_files(path / SINK_LOG_DIR)
    if (path / SUCCESS_MARKER).is_file():
        return sorted(p for p in path.rglob("*.parquet") if p.is_file() and not any(
            part.startswith((".", "_")) for part in p.relative_to(path).parts))
    if (path / BACKFILL_MARKER).is_file():
        raise NotAttributionOutput(
            f"{path} is being backfilled, or a backfill of it stopped before it finished "
            f"({BACKFILL_MARKER}: {(path / BACKFILL_MARKER).read_text().strip()}); its goal dates "
            f"are being replaced and {SUCCESS_MARKER} is written again once they are")
    raise NotAttributionOutput(
        f"{path} holds no committed Spark output: neither a streaming file sink's "
        f"{SINK_LOG_DIR}/ log nor a batch write's {SUCCESS_MARKER} marker")


def sink_log_files(log_dir: PathLike) -> list[Path]:
    """The files a file sink's ``_spark_metadata`` log lists as committed and not deleted.

    The log has one file per micro-batch, named by batch id; every few batches (Spark's
    ``spark.sql.streaming.fileSink.log.compactInterval``) the batch file is ``<id>.compact`` and
    repeats every entry before it, after which Spark may delete the older files. Each file is a
    ``v1`` line followed by one JSON object per line, ``{"path": <URI>, ..., "action": "add"}``
    (``"delete"`` in logs of older Spark versions removes an earlier entry). The files read are
    the latest compact file at or below the latest batch, then every batch file after it.
    """
    log_dir = Path(log_dir)
    batches: dict[int, Path] = {}
    for entry in log_dir.iterdir():
        match = _LOG_BATCH_FILE.match(entry.name)
        if match and entry.is_file():
            batches[int(match[1])] = entry
    if not batches:
        return []
    latest = max(batches)
    start = max((b for b, f in batches.items() if f.suffix == ".compact"), default=0)
    missing = [b for b in range(start, latest + 1) if b not in batches]
    if missing:
        raise NotAttributionOutput(f"{log_dir} is incomplete: no log file for batch {missing[0]} "
                                   f"(latest batch {latest})")
    listed: dict[Path, None] = {}  # insertion-ordered set
    for batch in range(start, latest + 1):
        for entry in _read_log_file(batches[batch]):
            file = _local_path(entry["path"], batches[batch])
            if entry.get("action", "add") == "delete":
                listed.pop(file, None)
            else:
                listed[file] = None
    return list(listed)


def _read_log_file(log_file: Path) -> list[dict]:
    lines = log_file.read_text(encoding="utf-8").split("\n")
    if lines[0] != SINK_LOG_VERSION:
        raise NotAttributionOutput(f"{log_file}: unsupported file sink log version {lines[0]!r}; "
                                   f"expected {SINK_LOG_VERSION!r}")
    return [json.loads(line) for line in lines[1:] if line.strip()]


def _local_path(uri: str, log_file: Path) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise NotAttributionOutput(f"{log_file} lists {uri}: only local (file:) output is read "
                                   "without Spark; use read_attributions_spark for other file "
                                   "systems")
    return Path(unquote(parsed.path))


def read_output_table(path: PathLike) -> pa.Table:
    """The committed rows under ``path`` (see ``committed_files``, or one Parquet file) as Arrow.

    Columns are those of the files, plus ``ABSENT_COLUMN_DEFAULTS`` for output written without
    them, then ``goal_date``, derived from ``goal_ts`` (the part files do not hold it). Raises
    ``NotAttributionOutput`` when ``path`` is not attribution output.
    """
    path = Path(path)
    files = [path] if path.is_file() else committed_files(path)
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise NotAttributionOutput(f"{path}: committed file {missing[0]} is missing")
    tables = [_read_parquet(f) for f in files]
    if not tables:
        empty = arrow_schema({"fields": [f for f in OUTPUT_SCHEMA["fields"]
                                         if f["name"] in REQUIRED_COLUMNS]})
        tables = [empty.empty_table()]
    # Files written before and after a column was added can share one directory.
    table = pa.concat_tables(tables, promote_options="default")
    absent = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if absent:
        raise NotAttributionOutput(
            f"{path} is not attribution output: it lacks the columns {', '.join(absent)} "
            f"(found: {', '.join(table.column_names)})")
    for field in arrow_schema(_absent_columns_schema()):
        default = ABSENT_COLUMN_DEFAULTS[field.name]
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
        if default is not None:
            index = table.column_names.index(field.name)
            table = table.set_column(index, field, table[field.name].cast(field.type)
                                     .fill_null(default))
    return _with_partition_column(table)


def _with_partition_column(table: pa.Table) -> pa.Table:
    """``table`` with ``goal_date`` last: the UTC date of ``goal_ts``. Arrow casts a timestamp to
    the date of its own time zone, so the column is made UTC first."""
    if PARTITION_COLUMN in table.column_names:
        table = table.drop_columns([PARTITION_COLUMN])
    (field,) = arrow_schema({"fields": [PARTITION_FIELD]})
    utc = table[PARTITION_SOURCE].cast(pa.timestamp("us", tz="UTC"))
    return table.append_column(field, utc.cast(field.type))


def _read_parquet(file: Path) -> pa.Table:
    try:
        return pq.read_table(file)
    except (pa.ArrowInvalid, OSError) as err:
        raise NotAttributionOutput(f"{file} is not a readable Parquet file ({err})") from None


def read_attributions(path: PathLike) -> "pd.DataFrame":
    """The committed rows of a job's output (or of one Parquet file) as a pandas DataFrame.

    Reads no uncommitted file and needs no Spark. Timestamps are UTC, 64-bit integer columns
    nullable ``Int64`` (``impression_id`` is null on organic rows), ``goal_date`` (last) holds
    ``datetime.date`` values; rows are the changelog as written (``fold_changelog`` nets it).
    ``path``: an output directory or a Parquet file. Raises ``NotAttributionOutput``.
    """
    import pandas as pd

    return read_output_table(path).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def _remote_delta(spark, path: str) -> bool:
    jvm = spark._jvm
    log = jvm.org.apache.hadoop.fs.Path(path.rstrip("/") + "/" + DELTA_LOG_DIR)
    return log.getFileSystem(spark._jsc.hadoopConfiguration()).exists(log)


def read_attributions_spark(spark, path: PathLike):
    """The committed rows of a job's output as a Spark DataFrame: a Delta table's latest
    version (``spark.read.format("delta")``), or Parquet output through ``spark.read.parquet``,
    which honours the file sink's log; with ``ABSENT_COLUMN_DEFAULTS`` for columns it lacks, and
    ``goal_date`` (a date) last: Spark's partition column of partitioned output, so that a filter
    on it reads only the dates asked for; derived from ``goal_ts`` for output written flat.

    ``spark``: the session; ``path``: the output directory (any Hadoop file system). A local
    path is checked first, so that a missing or foreign directory raises
    ``NotAttributionOutput`` rather than a Spark analysis error.
    """
    from pyspark.sql import functions as F

    from .layout import utc_date

    if (Path(str(path)) / DELTA_LOG_DIR).is_dir() or (
            "://" in str(path) and _remote_delta(spark, str(path))):
        frame = spark.read.format("delta").load(str(path))  # its latest committed version
    else:
        if "://" not in str(path):
            committed_files(path)
        frame = spark.read.parquet(str(path))
    absent = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if absent:
        raise NotAttributionOutput(f"{path} is not attribution output: it lacks the columns "
                                   f"{', '.join(absent)}")
    for field in spark_struct(_absent_columns_schema()).fields:
        default = ABSENT_COLUMN_DEFAULTS[field.name]
        column = F.col(field.name) if field.name in frame.columns else F.lit(None)
        if default is not None:
            column = F.coalesce(column, F.lit(default))
        frame = frame.withColumn(field.name, column.cast(field.dataType))
    (field,) = spark_struct({"fields": [PARTITION_FIELD]}).fields
    # Read from the directories, with the type Spark infers; derived for output written flat.
    goal_date = (F.col(PARTITION_COLUMN).cast(field.dataType) if PARTITION_COLUMN in frame.columns
                 else utc_date(F.col(PARTITION_SOURCE)))
    return frame.select(*(c for c in frame.columns if c != PARTITION_COLUMN),
                        goal_date.alias(PARTITION_COLUMN))


def read_attribution_rows(path: PathLike) -> list[Attribution]:
    """The committed rows under ``path`` (output directory or Parquet file) as core rows."""
    rows = []
    for record in read_output_table(path).select(list(OUTPUT_FIELDS)).to_pylist():
        record["goal_ts"] = ts_to_ms(record["goal_ts"])
        if record["impression_ts"] is not None:
            record["impression_ts"] = ts_to_ms(record["impression_ts"])
        record["trail"] = tuple(record["trail"] or ())
        rows.append(Attribution(**record))
    return rows
