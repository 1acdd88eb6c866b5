"""Reading Delta output without Spark: ``deltalake`` against Spark's own reading of the same
tables, the frontier of the version read, and files no commit lists.

The tables are written by Spark with Delta Lake as the job writes them: a changelog appended
micro-batch by micro-batch, each commit carrying its frontier in ``userMetadata``, and a current
table kept by the MERGE that docs/reading-output.md shows.
"""
from __future__ import annotations

import shutil

import pandas as pd
import pytest

from attribution.finality import frontier_metadata
from attribution.schema import OUTPUT_SCHEMA, PARTITION_COLUMN, PARTITION_SOURCE
from attribution.spark.changelog import fold_changelog
from attribution.spark.output import (
    Frontier,
    NotAttributionOutput,
    read_attributions,
    read_attributions_spark,
    read_committed_output,
    read_frontier,
)
from attribution.spark.types import spark_struct
from support.outputs import attribution_record

HOUR, DAY = 3_600_000, 86_400_000
LATENESS = 2 * HOUR
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def row(goal, ts, impression, credit=1.0, sign=1, revision=0, timing="ON_TIME"):
    return attribution_record(goal, ts, impression, model="linear", credit=credit,
                              impression_campaign=None if impression is None else "spring",
                              goal_value=4.0, credited_value=credit * 4.0, sign=sign,
                              revision=revision, emit_timing=timing)


# Two micro-batches of a changelog over two goal dates: g1 is revised by a late record in the
# second (one impression's row becomes two), g2 arrives, g3 is organic.
BATCHES = [
    [row("g1", DAY - HOUR, 1), row("g3", DAY - HOUR, None, credit=0.0)],
    [row("g1", DAY - HOUR, 1, sign=-1, timing="LATE"),
     row("g1", DAY - HOUR, 1, credit=0.5, revision=1, timing="LATE"),
     row("g1", DAY - HOUR, 2, credit=0.5, revision=1, timing="LATE"),
     row("g2", DAY + HOUR, 3)],
]
WATERMARKS = [DAY - HOUR // 2, DAY + 2 * HOUR]

MERGE = """
MERGE INTO delta.`{table}` AS t
USING (
  SELECT * EXCEPT (n) FROM (
    SELECT c.*, ROW_NUMBER() OVER (
             PARTITION BY goal_event_id, model, impression_event_id
             ORDER BY revision DESC, sign ASC) AS n
    FROM new_changes c)
  WHERE n = 1) AS c
ON t.goal_event_id = c.goal_event_id AND t.model = c.model
   AND t.impression_event_id <=> c.impression_event_id
WHEN MATCHED AND c.sign = -1 THEN DELETE
WHEN MATCHED THEN UPDATE SET *
WHEN NOT MATCHED AND c.sign = 1 THEN INSERT *
"""


def frame(spark, records):
    """``records`` as a Spark DataFrame of the output's schema plus ``goal_date``."""
    from pyspark.sql import functions as F

    from attribution.spark.layout import utc_date

    schema = spark_struct({"fields": OUTPUT_SCHEMA["fields"]})
    rows = [tuple(r[f.name] for f in schema.fields) for r in records]
    return spark.createDataFrame(rows, schema).withColumn(
        PARTITION_COLUMN, utc_date(F.col(PARTITION_SOURCE)))


def plain(name, value):
    """One value of a row as a plain, comparable value: timestamps as UTC ISO text (Spark's
    ``toPandas`` gives them naive, in the session's time zone, UTC here), nulls as None."""
    if name == "trail":
        return tuple(value)
    if value is None or value is pd.NA or value != value:
        return None
    if isinstance(value, pd.Timestamp):
        return (value.tz_convert(None) if value.tzinfo else value).isoformat()
    return value.isoformat() if hasattr(value, "isoformat") else value


def canonical(rows: pd.DataFrame) -> list[tuple]:
    """Rows as sorted tuples of plain values, for comparing readers."""
    return sorted((tuple((k, plain(k, v)) for k, v in sorted(record.items()))
                   for record in rows.to_dict("records")), key=repr)


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    """A changelog of ``BATCHES`` (version k: micro-batch k, with its frontier) and a current
    table kept by MERGE (version 0: micro-batch 0 inserted, 1: micro-batch 1 merged, 2: a
    commit of a table property, which publishes no frontier)."""
    root = tmp_path_factory.mktemp("delta")
    changelog, current = root / "changelog", root / "current"
    for batch_id, (records, watermark) in enumerate(zip(BATCHES, WATERMARKS)):
        metadata = frontier_metadata(batch_id, watermark, LATENESS)
        (frame(spark, records).write.format("delta").mode("append").partitionBy(PARTITION_COLUMN)
         .option("userMetadata", metadata).save(str(changelog)))
        if batch_id == 0:
            (frame(spark, records).write.format("delta").partitionBy(PARTITION_COLUMN)
             .option("userMetadata", metadata).save(str(current)))
        else:
            frame(spark, records).createOrReplaceTempView("new_changes")
            spark.conf.set(USER_METADATA, metadata)
            try:
                spark.sql(MERGE.format(table=current))
            finally:
                spark.conf.unset(USER_METADATA)
    spark.sql(f"ALTER TABLE delta.`{current}` SET TBLPROPERTIES ('purpose' = 'tests')")
    return changelog, current


def test_deltalake_reads_what_spark_reads(spark, tables):
    changelog, current = tables
    for table in tables:
        ours = read_attributions(table)
        theirs = read_attributions_spark(spark, table).toPandas()
        assert list(ours.columns) == list(theirs.columns) and ours.columns[-1] == PARTITION_COLUMN
        assert canonical(ours) == canonical(theirs)
    changes = read_attributions(changelog)
    assert len(changes) == 6 and sorted(changes["sign"]) == [-1, 1, 1, 1, 1, 1]
    # The MERGE of the docs keeps the current table equal to the fold of the changelog.
    folded = fold_changelog(changes)
    assert canonical(read_attributions(current)) == canonical(folded)
    assert set(read_attributions(current)["credit"]) == {0.0, 0.5, 1.0}


def test_rows_and_frontier_come_from_the_same_version(tables):
    changelog, current = tables
    first = read_committed_output(changelog, version=0)
    assert (first.format, first.version) == ("delta", 0)
    assert sorted(first.rows["goal_event_id"]) == ["g1", "g3"]
    assert first.final_through_ms == WATERMARKS[0] - LATENESS
    assert first.watermark_ms == WATERMARKS[0]
    latest = read_committed_output(changelog)
    assert latest.version == 1 and len(latest.rows) == 6
    assert latest.frontier == Frontier(version=1, batch_id=1, watermark_ms=WATERMARKS[1],
                                       allowed_lateness_ms=LATENESS,
                                       final_through_ms=WATERMARKS[1] - LATENESS)
    # The current table's last commit (a table property) publishes nothing: the frontier in
    # force is the MERGE's.
    now = read_committed_output(current)
    assert now.version == 2 and now.frontier.version == 1 and now.frontier.batch_id == 1
    assert read_frontier(current, 0).final_through_ms == WATERMARKS[0] - LATENESS
    assert len(read_attributions(current, version=0)) == 2


def test_files_no_commit_lists_are_not_read(tables, tmp_path):
    changelog, _ = tables
    copy = tmp_path / "changelog"
    shutil.copytree(changelog, copy)
    before = canonical(read_attributions(copy))
    # A writer killed before its commit leaves complete part files, and perhaps a commit file
    # it was still writing under a temporary name; neither is part of any version.
    part = next(copy.glob(f"{PARTITION_COLUMN}=*/*.parquet"))
    shutil.copy(part, part.parent / "part-00000-dead-beef-c000.snappy.parquet")
    (part.parent / "part-00001-dead-beef-c000.snappy.parquet").write_bytes(b"")
    (copy / "_delta_log" / ".00000000000000000002.json.dead-beef.tmp").write_text('{"add"')
    assert canonical(read_attributions(copy)) == before
    assert read_committed_output(copy).version == 1
    with pytest.raises(NotAttributionOutput, match="at version 7"):
        read_attributions(copy, version=7)
