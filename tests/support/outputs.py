"""The job's outputs, read through Spark's commit protocol or written without Spark.

* ``PARQUET_OUTPUT``: the job's output options where the sink is not the subject;
* ``committed_attributions``: the rows a Spark file sink committed;
* ``attribution_record``, ``output_table``, ``goal_date_dir``, ``write_sink_output``,
  ``write_batch_output``, ``write_partitioned_batch_output``, ``ADDED_OUTPUT_TYPES``:
  attribution output written without Spark, laid out as Spark's streaming file sink or batch
  writer lays it out.
"""
from __future__ import annotations

import json
from collections import defaultdict
from datetime import timezone
from pathlib import Path

from attribution.core import Attribution
from attribution.oracle import sort_key

# The output options of the tests whose subject is not the sink: Parquet files. An idempotent
# Delta append costs about as much again per micro-batch (Delta reconstructs the table's state to
# look up the writer's last version), and the Delta sink has tests of its own (test_delta_output,
# the crash tests, the report's).
PARQUET_OUTPUT = ("--output-format", "parquet")


def committed_attributions(spark, path: Path) -> list[Attribution]:
    """The output rows the file sink committed, as ``Attribution``s (epoch-ms timestamps): Spark's
    own reading, without the partition column it adds (``goal_date``, not a field of the rows)."""
    from pyspark.sql import functions as F

    from attribution.schema import PARTITION_COLUMN

    frame = spark.read.parquet(str(path)).drop(PARTITION_COLUMN)
    frame = (frame.withColumn("goal_ts", F.unix_millis("goal_ts"))
                  .withColumn("impression_ts", F.unix_millis("impression_ts")))
    return sorted((Attribution(**{**r.asDict(), "trail": tuple(r.trail)})
                   for r in frame.collect()), key=sort_key)


# Types of the columns spec sections 7 and 8 add to the output, as Spark writes them.
ADDED_OUTPUT_TYPES = {"impression_campaign": "string", "goal_value": "float64",
                      "credited_value": "float64", "sign": "int32", "revision": "int32",
                      "emit_timing": "string"}


def attribution_record(goal: str, goal_ts: int, impression: int | None = None, *,
                       model: str = "last_touch", credit: float | None = None,
                       user_id: str = "u", **added) -> dict:
    """One output row as a dict: ``impression`` is an impression_id (None: organic), timestamps
    in epoch ms; ``added`` sets columns of ``ADDED_OUTPUT_TYPES``."""
    from attribution.events import ms_to_datetime

    organic = impression is None
    return {"user_id": user_id, "goal_event_id": goal, "goal_url": f"/goal/{goal}",
            "goal_ts": ms_to_datetime(goal_ts), "impression_id": impression,
            "impression_event_id": None if organic else f"i-{impression}",
            "impression_source_url": None if organic else "/search",
            "impression_target_url": None if organic else "/landing",
            "impression_ts": None if organic else ms_to_datetime(goal_ts - 60_000),
            "trail": [] if organic else ["/landing"], "model": model,
            "credit": (0.0 if organic else 1.0) if credit is None else credit, **added}


def output_table(records: list[dict]):
    """Records of ``attribution_record`` as an Arrow table: the output schema, plus the added
    columns the first record has."""
    import pyarrow as pa

    from attribution.schema import OUTPUT_SCHEMA
    from attribution.spark.types import arrow_schema

    # An added column is written only where the records have it, as output of a version before
    # it would lack it.
    present = set(records[0]) if records else set()
    return pa.Table.from_pylist(records, schema=pa.schema(
        [f for f in arrow_schema(OUTPUT_SCHEMA)
         if f.name not in ADDED_OUTPUT_TYPES or f.name in present]))


def goal_date_dir(record: dict) -> str:
    """The partition directory of an output record: ``goal_date=`` its goal's UTC date."""
    from attribution.schema import PARTITION_COLUMN

    return f"{PARTITION_COLUMN}={record['goal_ts'].astimezone(timezone.utc).date().isoformat()}"


def write_sink_output(out: Path, batches: list[list[dict]], compact_interval: int = 10,
                      partitioned: bool = False) -> list[Path]:
    """Write micro-batches as Spark's streaming file sink does: one part file per batch, then its
    ``_spark_metadata`` log file (``<id>.compact`` repeating all earlier entries every
    ``compact_interval`` batches). ``partitioned``: each part file under the ``goal_date=``
    directory of its batch's first record (one date per batch). Returns the part files, in
    batch order."""
    import pyarrow.parquet as pq

    log = out / "_spark_metadata"
    log.mkdir(parents=True, exist_ok=True)
    parts, entries = [], []
    for batch, records in enumerate(batches):
        directory = out / goal_date_dir(records[0]) if partitioned else out
        directory.mkdir(exist_ok=True)
        part = directory / f"part-00000-{batch:08d}-0000-0000-0000-000000000000-c000.snappy.parquet"
        pq.write_table(output_table(records), part)
        parts.append(part)
        entry = {"path": part.as_uri(), "size": part.stat().st_size, "isDir": False,
                 "modificationTime": 0, "blockReplication": 1, "blockSize": 33554432,
                 "action": "add"}
        entries.append(entry)
        compact = (batch + 1) % compact_interval == 0
        name = f"{batch}.compact" if compact else str(batch)
        listed = entries if compact else [entry]
        (log / name).write_text("\n".join(["v1", *(json.dumps(e) for e in listed)]))
    return parts


def write_batch_output(out: Path, records: list[dict], success: bool = True) -> Path:
    """Write rows as a finished (``success``) or unfinished Spark batch write: one part file and
    the ``_SUCCESS`` marker. Returns the part file."""
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    part = out / "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet"
    pq.write_table(output_table(records), part)
    if success:
        (out / "_SUCCESS").write_text("")
    return part


def write_partitioned_batch_output(out: Path, records: list[dict]) -> list[Path]:
    """Write rows as a finished Spark batch write partitioned by goal date does: one part file
    per ``goal_date=`` directory, then ``_SUCCESS``. Returns the part files in path order."""
    import pyarrow.parquet as pq

    by_dir: dict = defaultdict(list)
    for record in records:
        by_dir[goal_date_dir(record)].append(record)
    parts = []
    for name in sorted(by_dir):
        (out / name).mkdir(parents=True)
        part = out / name / "part-00000-00000000-0000-0000-0000-000000000000.c000.snappy.parquet"
        pq.write_table(output_table(by_dir[name]), part)
        parts.append(part)
    (out / "_SUCCESS").write_text("")
    return parts
