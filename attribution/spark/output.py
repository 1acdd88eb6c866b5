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
* a single Parquet file (a generator's truth file): that file;
* a Delta table (``_delta_log/`` present: the job's Delta changelog, or its current table): the
  rows of one committed table version, read with the ``deltalake`` package (no Spark), which
  reads only the files that version's log lists. With them comes the completeness frontier
  the job published in that version's commit (``attribution.finality``):
  ``read_committed_output`` returns both, of the same version.

Anything else is refused with ``NotAttributionOutput``. Output written before spec sections 7
and 8 lacks their columns; the readers add them with the values a run without those features
writes (``ABSENT_COLUMN_DEFAULTS``), so callers see one shape. That shape ends with the partition
column ``goal_date`` (``attribution.schema.PARTITION_FIELD``), the UTC date of ``goal_ts``,
whatever the layout the rows were read from.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from ..core import Attribution
from ..events import ts_to_ms
from ..finality import (
    ALLOWED_LATENESS_KEY,
    BATCH_ID_KEY,
    FINAL_THROUGH_KEY,
    WATERMARK_KEY,
    parse_frontier,
)
from ..schema import (
    OUTPUT_FIELDS,
    OUTPUT_SCHEMA,
    PARTITION_COLUMN,
    PARTITION_FIELD,
    PARTITION_SOURCE,
)
from .storage import Location, is_uri, location
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


def committed_files(path: PathLike) -> list:
    """The Parquet files of a job's output directory that the job committed, in commit order.

    ``path`` is a streaming output (its ``_spark_metadata`` log decides, as for Spark) or a batch
    output (its part files, in path order, once ``_SUCCESS`` exists; see the module docstring).
    A local path's files are ``Path`` objects; a URI's (any Hadoop file system, read through
    ``storage`` once Spark runs) are ``storage.Location`` objects. Raises
    ``NotAttributionOutput`` for a missing path or a directory with neither, naming an
    unfinished backfill when there is one.
    """
    root = location(path)
    if not root.exists():
        raise NotAttributionOutput(f"{path} does not exist")
    if not root.is_dir():
        raise NotAttributionOutput(f"{path} is not a directory")
    if is_delta_table(path):
        raise NotAttributionOutput(f"{path} is a Delta table: its committed files are those of "
                                   "a table version; read it with read_attributions")
    if (root / SINK_LOG_DIR).is_dir():
        files = sink_log_files(root / SINK_LOG_DIR)
    elif (root / SUCCESS_MARKER).is_file():
        files = sorted(_part_files(root))
    else:
        marker = root / BACKFILL_MARKER
        if marker.is_file():
            raise NotAttributionOutput(
                f"{path} is being backfilled, or a backfill of it stopped before it finished "
                f"({BACKFILL_MARKER}: {marker.read_text().strip()}); its goal dates are being "
                f"replaced and {SUCCESS_MARKER} is written again once they are")
        raise NotAttributionOutput(
            f"{path} holds no committed Spark output: neither a streaming file sink's "
            f"{SINK_LOG_DIR}/ log nor a batch write's {SUCCESS_MARKER} marker")
    return files if is_uri(str(path)) else [Path(str(f)) for f in files]


def _part_files(directory: Location) -> list[Location]:
    """A batch output's Parquet files, in its visible directories (hidden ones, ``_temporary``
    and ``.spark-staging-*``, hold a write in progress)."""
    found = []
    for entry in directory.iterdir():
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir():
            found.extend(_part_files(entry))
        elif entry.suffix == ".parquet":
            found.append(entry)
    return found


def sink_log_files(log_dir: PathLike) -> list[Location]:
    """The files a file sink's ``_spark_metadata`` log lists as committed and not deleted.

    The log has one file per micro-batch, named by batch id; every few batches (Spark's
    ``spark.sql.streaming.fileSink.log.compactInterval``) the batch file is ``<id>.compact`` and
    repeats every entry before it, after which Spark may delete the older files. Each file is a
    ``v1`` line followed by one JSON object per line, ``{"path": <URI>, ..., "action": "add"}``
    (``"delete"`` in logs of older Spark versions removes an earlier entry). The files read are
    the latest compact file at or below the latest batch, then every batch file after it.

    :param log_dir: the log directory, a path or any Hadoop URI (``storage``).
    """
    log_dir = location(log_dir)
    batches: dict[int, Location] = {}
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
    listed: dict[Location, None] = {}  # insertion-ordered set
    for batch in range(start, latest + 1):
        for entry in _read_log_file(batches[batch]):
            file = _listed_file(entry["path"], log_dir)
            if entry.get("action", "add") == "delete":
                listed.pop(file, None)
            else:
                listed[file] = None
    return list(listed)


def _read_log_file(log_file: Location) -> list[dict]:
    lines = log_file.read_text().split("\n")
    if lines[0] != SINK_LOG_VERSION:
        raise NotAttributionOutput(f"{log_file}: unsupported file sink log version {lines[0]!r}; "
                                   f"expected {SINK_LOG_VERSION!r}")
    return [json.loads(line) for line in lines[1:] if line.strip()]


def _listed_file(uri: str, log_dir: Location) -> Location:
    """A file the log lists (a URI) on the log's own file system: a local log's ``file:`` URIs
    are local paths; a URI log's entries are read as the URIs they are."""
    if is_uri(str(log_dir)):
        return location(uri)
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise NotAttributionOutput(f"{log_dir} lists {uri}: a local output's log names a file "
                                   "of another file system")
    return location(unquote(parsed.path))


def is_delta_table(path: PathLike) -> bool:
    """Whether ``path`` is a Delta table: a directory holding a ``_delta_log/`` transaction log.

    :param path: a local path or a URI of any Hadoop file system.
    """
    return (location(path) / DELTA_LOG_DIR).is_dir()


@dataclass(frozen=True)
class Frontier:
    """The completeness frontier a commit of a Delta output published
    (``attribution.finality``): goals at or before ``final_through_ms`` can no longer change.

    :param version: the table version whose commit carries it.
    :param batch_id: the micro-batch that committed it.
    :param watermark_ms: the on-time watermark that micro-batch ran with (None: none yet).
    :param allowed_lateness_ms: the job's allowed lateness.
    :param final_through_ms: the frontier (None: nothing final yet).
    """

    version: int
    batch_id: Optional[int]
    watermark_ms: Optional[int]
    allowed_lateness_ms: Optional[int]
    final_through_ms: Optional[int]


@dataclass(frozen=True)
class CommittedOutput:
    """One consistent read of an attribution output: its rows and what they cover.

    :param rows: the committed rows, as ``read_attributions`` returns them.
    :param format: ``"delta"`` or ``"parquet"`` (a Spark file sink's or batch write's output,
        or one Parquet file).
    :param version: the Delta table version read; None for Parquet output.
    :param frontier: the frontier in force at that version: that of the latest commit at or
        before it that published one; None for Parquet output (which publishes none) or a
        Delta table none of whose commits did.
    """

    rows: "pd.DataFrame"
    format: str
    version: Optional[int]
    frontier: Optional[Frontier]

    @property
    def final_through_ms(self) -> Optional[int]:
        """Goals at or before this time (epoch ms) are final; None: none known to be."""
        return self.frontier.final_through_ms if self.frontier else None

    @property
    def watermark_ms(self) -> Optional[int]:
        """The on-time watermark of the commit that published the frontier, if any."""
        return self.frontier.watermark_ms if self.frontier else None


def _open_delta(path: PathLike, version: Optional[int] = None):
    """The ``deltalake.DeltaTable`` of ``path`` at ``version`` (None: the latest), or
    ``NotAttributionOutput`` naming why it cannot be opened."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        return DeltaTable(str(path), version=version)
    except DeltaError as err:
        at = "" if version is None else f" at version {version}"
        raise NotAttributionOutput(
            f"{path} is not a readable Delta table{at} ({' '.join(str(err).split())})") from None


def _commit_user_metadata(log_dir: Location, version: int) -> tuple[bool, Optional[str]]:
    """Whether the commit file of ``version`` is still in the log, and its commit information's
    ``userMetadata``. A commit file holds one JSON action per line; its ``commitInfo`` action
    says who wrote the commit and with what metadata."""
    commit = log_dir / f"{version:020d}.json"
    if not commit.is_file():
        return False, None
    for line in commit.read_text(encoding="utf-8").splitlines():
        if line.strip():
            action = json.loads(line)
            if "commitInfo" in action:
                return True, action["commitInfo"].get("userMetadata")
    return True, None


def _delta_frontier(path: PathLike, version: int) -> Optional[Frontier]:
    """The frontier in force at ``version`` of the Delta table at ``path``: that of the newest
    commit up to ``version`` whose ``userMetadata`` carries one.

    A commit without one (the table's creation, a maintenance operation, another writer) does
    not move the frontier, so the walk goes back past it, as far as the log still holds commit
    files (a log cleanup removes old ones). The commit files are read directly because
    ``deltalake``'s history of a table loaded at an older version lists the newest commits.
    """
    for candidate in range(version, -1, -1):
        present, metadata = _commit_user_metadata(location(path) / DELTA_LOG_DIR, candidate)
        if not present:
            return None
        parsed = parse_frontier(metadata)
        if parsed is not None:
            return Frontier(version=candidate, batch_id=parsed.get(BATCH_ID_KEY),
                            watermark_ms=parsed.get(WATERMARK_KEY),
                            allowed_lateness_ms=parsed.get(ALLOWED_LATENESS_KEY),
                            final_through_ms=parsed.get(FINAL_THROUGH_KEY))
    return None


def read_frontier(path: PathLike, version: Optional[int] = None) -> Optional[Frontier]:
    """The completeness frontier in force at ``version`` of the Delta output at ``path``.

    :param path: a Delta changelog or current table.
    :param version: the table version (None: the latest).
    :returns: the frontier of the newest commit at or before ``version`` that published one,
        or None when none did.
    :raises NotAttributionOutput: ``path`` is no Delta table, or has no such version.
    """
    if not is_delta_table(path):
        raise NotAttributionOutput(f"{path} is not a Delta table (no {DELTA_LOG_DIR}/): only "
                                   "Delta output publishes a completeness frontier")
    return _delta_frontier(path, _open_delta(path, version).version())


def _output_arrow(path: PathLike, version: Optional[int] = None) -> tuple[pa.Table, Optional[int],
                                                                       Optional[Frontier]]:
    """The committed rows under ``path`` as Arrow, as the files hold them, with the Delta table
    version and frontier they belong to (None, None for Parquet output)."""
    if is_delta_table(path):
        table = _open_delta(path, version)
        # The frontier of the snapshot whose rows are read, not of the table's latest version.
        read = table.version()
        return table.to_pyarrow_table(), read, _delta_frontier(path, read)
    if version is not None:
        raise NotAttributionOutput(f"{path} is not a Delta table: it has no versions to choose "
                                   "from")
    files = [path] if location(path).is_file() else committed_files(path)
    missing = [f for f in files if not location(f).is_file()]
    if missing:
        raise NotAttributionOutput(f"{path}: committed file {missing[0]} is missing")
    tables = [_read_parquet(f) for f in files]
    if not tables:
        empty = arrow_schema({"fields": [f for f in OUTPUT_SCHEMA["fields"]
                                         if f["name"] in REQUIRED_COLUMNS]})
        tables = [empty.empty_table()]
    # Files written before and after a column was added can share one directory.
    return pa.concat_tables(tables, promote_options="default"), None, None


def read_output_table(path: PathLike, version: Optional[int] = None) -> pa.Table:
    """The committed rows under ``path`` (see ``committed_files``, one Parquet file, or a Delta
    table's version) as Arrow.

    Columns are those of the output, plus ``ABSENT_COLUMN_DEFAULTS`` for output written without
    them, then ``goal_date``, the UTC date of ``goal_ts`` (derived: Parquet part files do not
    hold it). Raises ``NotAttributionOutput`` when ``path`` is not attribution output.

    :param path: an output directory, a Delta table or a Parquet file.
    :param version: for a Delta table, the version to read (None: the latest).
    """
    return _conform(path, _output_arrow(path, version)[0])


def _conform(path: PathLike, table: pa.Table) -> pa.Table:
    """``table`` in the readers' one shape: the output's columns with ``ABSENT_COLUMN_DEFAULTS``
    for those it lacks, and ``goal_date`` last."""
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


def _read_parquet(file: PathLike) -> pa.Table:
    # One thread: a file is one part of the output, and Arrow's thread pool, once started, can
    # abort the interpreter's exit when a command ends right after the read (apache/arrow#34314).
    try:
        with location(file).open() as stream:
            return pq.read_table(stream, use_threads=False)
    except (pa.ArrowInvalid, OSError) as err:
        raise NotAttributionOutput(f"{file} is not a readable Parquet file ({err})") from None


def _to_pandas(table: pa.Table) -> "pd.DataFrame":
    import pandas as pd

    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def read_attributions(path: PathLike, version: Optional[int] = None) -> "pd.DataFrame":
    """The committed rows of a job's output (or of one Parquet file) as a pandas DataFrame.

    Reads no uncommitted file and needs no Spark: a Parquet output through its commit record,
    a Delta table (changelog or current table) at one committed version through ``deltalake``.
    Timestamps are UTC, 64-bit integer columns nullable ``Int64`` (``impression_id`` is null
    on organic rows), ``goal_date`` (last) holds ``datetime.date`` values; rows are as
    written (a changelog: ``fold_changelog`` nets it). Raises ``NotAttributionOutput``.

    :param path: an output directory, a Delta table or a Parquet file.
    :param version: for a Delta table, the version to read (None: the latest).
    """
    return _to_pandas(read_output_table(path, version))


def read_committed_output(path: PathLike, version: Optional[int] = None) -> CommittedOutput:
    """The committed rows of a job's output together with the table version and completeness
    frontier they belong to, read in one snapshot (no Spark).

    For a Delta output the rows are those of ``version`` (None: the latest) and the frontier the
    one in force at that version, so a reader never pairs rows with the frontier of another
    version. A Parquet output publishes no frontier: ``version`` and ``frontier`` are None.

    :param path: an output directory, a Delta table or a Parquet file.
    :param version: for a Delta table, the version to read (None: the latest).
    :raises NotAttributionOutput: ``path`` holds no committed attribution output.
    """
    table, read_version, frontier = _output_arrow(path, version)
    return CommittedOutput(rows=_to_pandas(_conform(path, table)),
                           format="parquet" if read_version is None else "delta",
                           version=read_version, frontier=frontier)


def read_attributions_spark(spark, path: PathLike):
    """The committed rows of a job's output as a Spark DataFrame: a Delta table's latest
    version (``spark.read.format("delta")``), or Parquet output through ``spark.read.parquet``,
    which honours the file sink's log; with ``ABSENT_COLUMN_DEFAULTS`` for columns it lacks, and
    ``goal_date`` (a date) last: Spark's partition column of partitioned output, so that a filter
    on it reads only the dates asked for; derived from ``goal_ts`` for output written flat.

    ``spark``: the session; ``path``: the output directory (any Hadoop file system). It is
    checked first (``committed_files``), so that a missing or foreign directory raises
    ``NotAttributionOutput`` rather than a Spark analysis error.
    """
    from pyspark.sql import functions as F

    from .layout import utc_date

    if is_delta_table(path):
        frame = spark.read.format("delta").load(str(path))
    else:
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
