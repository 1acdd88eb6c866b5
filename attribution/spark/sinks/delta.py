"""A Delta Lake table as a ``Sink``: the attribution changelog with its completeness frontier,
and beside it, optionally, the current table the changelog folds to.

**Why ``foreachBatch`` rather than Delta's streaming sink.** Each commit carries the frontier of
its micro-batch (``attribution.finality``) in its ``userMetadata``, so a reader of one table
version gets the rows and the frontier they belong to. The frontier depends on the watermark the
micro-batch ran with, which Delta's streaming sink does not know and cannot put in its commit.
``foreachBatch`` writes each micro-batch as one ordinary append, with Delta's idempotent writes:
the options ``txnAppId`` (the streaming query's id, from its checkpoint: stable across restarts,
new for a new checkpoint) and ``txnVersion`` (the micro-batch id). A micro-batch run again after
a crash between Delta's commit and Spark's commit log finds its version committed and writes
nothing: exactly once, as with Delta's own sink.

**The watermark of a micro-batch** is the one Spark wrote in the checkpoint's ``offsets/<k>``
before running it (``batchWatermarkMs``): the watermark the stateful operator fires and
evicts by in micro-batch ``k``. Spark's watermark trails the on-time one by the allowed
lateness ``L``, and micro-batch ``k + 1`` drops every record at or below it (Spark judges late
input by the previous micro-batch's watermark). So after micro-batch ``k`` every record still
accepted is later than ``S[k] = W[k] - L``, and a goal at or before it can no longer change
(``docs/semantics.md``, section 8): ``final_through = W[k] - L``.

**The current table** (``current``): one row per goal, model and credited impression, as of its
latest revision, retracted rows gone (``changelog.fold_changelog``'s rule, on its ``ROW_KEY``).
Each micro-batch is one MERGE: per key the batch's row of the highest revision (its retraction
rather than the row when both are there) deletes the key (a retraction) or upserts it (a row),
but only over a row of a lower revision (a higher one was merged already), so a micro-batch
merged twice changes nothing. Delta's transaction identifiers for SQL commands (the session
settings ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``) skip it altogether, so the
table's history shows each micro-batch's MERGE once.
"""
from __future__ import annotations

import json
from typing import Optional

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ...finality import frontier_metadata
from .. import output
from ..changelog import ROW_KEY
from ..layout import by_date
from ..pipeline import apply_trigger
from ..sources.offset_log import batch_offsets
from ..storage import location
from .base import REPLACE_ALL, REPLACE_DATES, Sink
from .interruption import stop_safe

# The session settings Delta reads for a SQL command's (MERGE's) idempotency and commit message.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def is_delta_table(path: str) -> bool:
    """True when ``path`` holds a Delta table (``output.is_delta_table``, through ``storage``:
    local or on any Hadoop file system once Spark runs).

    :param path: the table's directory.
    """
    return output.is_delta_table(path)


def query_id(checkpoint: str) -> str:
    """The id of the streaming query under ``checkpoint`` (its ``metadata`` file, written when
    the query first starts): the same on every restart, another for a new checkpoint.

    :param checkpoint: the query's checkpoint location.
    """
    metadata = location(checkpoint) / "metadata"
    if not metadata.is_file():
        raise ValueError(f"{checkpoint} has no metadata file: the query has not started")
    return json.loads(metadata.read_text())["id"]


def batch_watermark_ms(checkpoint: str, batch_id: int) -> Optional[int]:
    """Spark's watermark of micro-batch ``batch_id``, from the checkpoint's ``offsets/<k>``
    (written before the micro-batch runs); ``None`` before the first watermark.

    :param checkpoint: the query's checkpoint location.
    :param batch_id: the micro-batch.
    """
    metadata, _ = batch_offsets(location(checkpoint), batch_id)
    return metadata.get("batchWatermarkMs") or None


def batch_frontier(checkpoint: str, batch_id: int, allowed_lateness_ms: int) -> str:
    """The ``userMetadata`` of micro-batch ``batch_id``'s commits (module docstring: Spark's
    watermark is the on-time one minus the allowed lateness).

    :param checkpoint: the query's checkpoint location.
    :param batch_id: the micro-batch.
    :param allowed_lateness_ms: the job's allowed lateness.
    """
    spark_watermark = batch_watermark_ms(checkpoint, batch_id)
    on_time = None if spark_watermark is None else spark_watermark + allowed_lateness_ms
    return frontier_metadata(batch_id, on_time, allowed_lateness_ms)


def latest_by_key(rows: DataFrame) -> DataFrame:
    """Per ``ROW_KEY``, the row of the highest revision, its retraction rather than the row
    when both are there: what the current table's MERGE applies.

    :param rows: changelog rows (``sign``, ``revision``).
    """
    order = Window.partitionBy(*ROW_KEY).orderBy(F.col("revision").desc(), F.col("sign").asc())
    return (rows.withColumn("_rank", F.row_number().over(order))
            .filter(F.col("_rank") == 1).drop("_rank"))


def merge_statement(table: str, source: str) -> str:
    """The MERGE of a micro-batch's ``latest_by_key`` rows (the view ``source``) into the
    current table at ``table``: delete on a retraction, upsert a row, both only over a lower
    revision (a retraction: at most its own).

    :param table: the current table's path.
    :param source: the name of the temporary view of the rows.
    """
    on = " AND ".join(f"t.{c} <=> s.{c}" for c in ROW_KEY)
    escaped = table.replace("`", "``")
    return (f"MERGE INTO delta.`{escaped}` t USING {source} s ON {on} "
            "WHEN MATCHED AND s.sign < 0 AND s.revision >= t.revision THEN DELETE "
            "WHEN MATCHED AND s.sign > 0 AND s.revision > t.revision THEN UPDATE SET * "
            "WHEN NOT MATCHED AND s.sign > 0 THEN INSERT *")


class DeltaSink(Sink):
    """A Delta table at ``path``, partitioned by a UTC date of its rows.

    :param path: the table's directory (any Hadoop file system).
    :param partition: the date level, ``layout.GOAL_DATE`` or ``layout.DETECTED_DATE``;
        ``None``: not partitioned.
    :param allowed_lateness_ms: the job's allowed lateness (the frontier is the on-time
        watermark minus it).
    :param current: the current table's directory, updated by a MERGE per micro-batch
        (streaming only), or ``None``.
    :param frontier: write each micro-batch with its frontier (``foreachBatch``); false: rows
        that have no frontier (the join job's) go through Delta's own streaming sink, exactly
        once by the query id and batch id it records in the table.
    """

    def __init__(self, path: str, partition: Optional[tuple[str, str]] = None,
                 allowed_lateness_ms: int = 0, current: Optional[str] = None,
                 frontier: bool = True):
        if current is not None and not frontier:
            raise ValueError("a current table is merged by the frontier's foreachBatch writer")
        self.path = path
        self.partition = partition
        self.allowed_lateness_ms = allowed_lateness_ms
        self.current = current
        self.frontier = frontier

    def _laid_out(self, rows):
        if self.partition is None:
            return rows, []
        return by_date(rows, self.partition)

    def start_stream(self, rows, checkpoint: str, trigger: str, query_name: str):
        """Start the streaming query appending each micro-batch of ``rows`` to the table (and
        merging it into the current table), each commit with the micro-batch's frontier.

        :param rows: a streaming DataFrame.
        :param checkpoint: the query's checkpoint location.
        :param trigger: ``available-now`` or a processing-time interval.
        :param query_name: the query's name in Spark's progress and UI.
        """
        rows, columns = self._laid_out(rows)
        if not self.frontier:
            writer = (rows.writeStream.format("delta").outputMode("append")
                      .partitionBy(*columns).option("path", self.path)
                      .option("checkpointLocation", checkpoint).queryName(query_name))
            return apply_trigger(writer, trigger).start()
        if self.current is not None:
            self._create_current(rows.sparkSession, rows.schema, columns)
        app_ids: dict = {}

        def write(batch: DataFrame, batch_id: int) -> None:
            if "id" not in app_ids:  # read once: the checkpoint's metadata never changes
                app_ids["id"] = query_id(checkpoint)
            self.write_micro_batch_rows(batch, batch_id, app_ids["id"],
                                        batch_frontier(checkpoint, batch_id,
                                                       self.allowed_lateness_ms), columns)

        # stop_safe: a stop landing during the write is read by Spark as the stop it is.
        writer = (rows.writeStream.foreachBatch(stop_safe(write))
                  .option("checkpointLocation", checkpoint).queryName(query_name))
        return apply_trigger(writer, trigger).start()

    def _create_current(self, spark, schema, columns: list) -> None:
        """Create the current table, empty, unless it exists (a MERGE needs a target)."""
        if is_delta_table(self.current):
            return
        (spark.createDataFrame([], schema).write.format("delta").mode("append")
         .partitionBy(*columns).save(self.current))

    def write_micro_batch_rows(self, batch: DataFrame, batch_id: int, app_id: str,
                               metadata: str, columns: list) -> None:
        """Append one micro-batch to the changelog, then merge it into the current table; each
        commit idempotent under (``app_id``, ``batch_id``) and carrying ``metadata``.

        :param batch: the micro-batch's rows, with the partition column.
        :param batch_id: the micro-batch's id.
        :param app_id: the writer's stable id (the streaming query's).
        :param metadata: the commits' ``userMetadata`` (``batch_frontier``).
        :param columns: the partition columns.
        """
        if self.current is not None:
            # Read twice (append, MERGE): computed once. The stateful operator's output is the
            # expensive part, and its observed metrics must count each row once.
            batch = batch.persist()
        try:
            (batch.write.format("delta").mode("append").partitionBy(*columns)
             .option("txnAppId", app_id).option("txnVersion", str(batch_id))
             .option("userMetadata", metadata).save(self.path))
            if self.current is not None:
                self._merge(batch, batch_id, app_id, metadata)
        finally:
            if self.current is not None:
                batch.unpersist()

    def _merge(self, batch: DataFrame, batch_id: int, app_id: str, metadata: str) -> None:
        spark = batch.sparkSession
        view = f"attribution_batch_{batch_id}"
        latest_by_key(batch).createOrReplaceTempView(view)
        settings = {TXN_APP_ID: app_id, TXN_VERSION: str(batch_id), USER_METADATA: metadata}
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            spark.sql(merge_statement(self.current, view))
        finally:
            for key in settings:
                spark.conf.unset(key)
            spark.catalog.dropTempView(view)

    def write_batch(self, rows, replace: str = REPLACE_ALL,
                    dates: Optional[list] = None) -> None:
        """Write ``rows`` in one commit, replacing everything (``REPLACE_ALL``) or the goal
        dates ``dates`` (``REPLACE_DATES``: Delta's ``replaceWhere`` on the partition column;
        the dates default to those the rows hold, found by a first pass).

        :param rows: a batch DataFrame.
        :param replace: ``REPLACE_ALL`` or ``REPLACE_DATES``.
        :param dates: with ``REPLACE_DATES``, the dates replaced (those without rows are left
            empty).
        """
        if replace not in (REPLACE_ALL, REPLACE_DATES):
            raise ValueError(f"replace must be one of {REPLACE_ALL}, {REPLACE_DATES}, "
                             f"got {replace!r}")
        rows, columns = self._laid_out(rows)
        if columns:  # each date's rows in one task: a file per date, not one per task
            rows = rows.repartition(*columns)
        writer = rows.write.format("delta").mode("overwrite").partitionBy(*columns)
        if replace == REPLACE_DATES:
            if self.partition is None:
                raise ValueError("only a table partitioned by date replaces dates")
            column = self.partition[0]
            if dates is None:
                dates = [r[0] for r in rows.select(column).distinct().collect()]
            listed = ", ".join(f"DATE'{d.isoformat()}'" for d in sorted(dates))
            writer = writer.option("replaceWhere",
                                   f"{column} IN ({listed})" if listed else "false")
        else:
            writer = writer.option("overwriteSchema", "true")
        writer.save(self.path)
