"""Tests of the schemas and what is derived from them (Spark, pandas, Arrow), without Spark.

``pyspark.sql.types`` is imported, but no SparkSession or JVM is started.
"""
from __future__ import annotations

import datetime as dt
import io

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from attribution import Event, attribute_batch
from attribution.core import Attribution
from attribution.events import ts_to_ms
from attribution.schema import (
    EVENT_FIELDS,
    EVENT_SCHEMA,
    EVENT_TYPES,
    OUTPUT_FIELDS,
    OUTPUT_SCHEMA,
    PARTITION_COLUMN,
    PARTITION_FIELD,
    PARTITION_SOURCE,
)
from attribution.spark.types import arrow_schema, pandas_dtypes, spark_ddl, spark_struct

# The spec's tables (sections 1, 4, 7 and 8), written out here independently of schema.py:
# field, kind, and whether the value may be null.
SPEC_EVENT_FIELDS = [
    ("event_id", "string", False), ("user_id", "string", True), ("event_type", "enum", False),
    ("ts", "timestamp", False), ("url", "string", True), ("referer", "string", True),
    ("is_goal", "boolean", True), ("impression_id", "long", True),
    ("source_url", "string", True), ("target_url", "string", True),
    ("campaign", "string", True), ("value", "double", True),
]
SPEC_OUTPUT_FIELDS = [
    ("user_id", "string", False), ("goal_event_id", "string", False),
    ("goal_url", "string", False), ("goal_ts", "timestamp", False),
    ("impression_id", "long", True), ("impression_event_id", "string", True),
    ("impression_source_url", "string", True), ("impression_target_url", "string", True),
    ("impression_ts", "timestamp", True), ("trail", "array<string>", False),
    ("model", "string", False), ("credit", "double", False),
    ("impression_campaign", "string", True), ("goal_value", "double", True),
    ("credited_value", "double", True), ("sign", "int", False), ("revision", "int", False),
    ("emit_timing", "string", False),
]
SPARK_TYPES = {"string": T.StringType(), "enum": T.StringType(), "boolean": T.BooleanType(),
               "int": T.IntegerType(), "long": T.LongType(), "double": T.DoubleType(),
               "timestamp": T.TimestampType(),
               "array<string>": T.ArrayType(T.StringType(), containsNull=False)}
ARROW_TYPES = {"string": pa.string(), "enum": pa.string(), "boolean": pa.bool_(),
               "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
               "timestamp": pa.timestamp("us", tz="UTC"), "array<string>": pa.list_(pa.string())}
BOTH = pytest.mark.parametrize("schema, spec", [(EVENT_SCHEMA, SPEC_EVENT_FIELDS),
                                                (OUTPUT_SCHEMA, SPEC_OUTPUT_FIELDS)],
                               ids=["event", "output"])


@BOTH
def test_avro_schema_has_the_spec_fields_in_order(schema, spec):
    assert [f["name"] for f in schema["fields"]] == [name for name, _, _ in spec]
    for f, (name, _, nullable) in zip(schema["fields"], spec):
        avro_nullable = isinstance(f["type"], list) and "null" in f["type"]
        assert avro_nullable == nullable, name


def test_field_tuples_follow_the_schemas():
    assert EVENT_FIELDS == tuple(name for name, _, _ in SPEC_EVENT_FIELDS)
    assert OUTPUT_FIELDS == tuple(name for name, _, _ in SPEC_OUTPUT_FIELDS)
    # An output row is a tuple in that order (what the Spark adapters rely on), with the
    # schema's defaults.
    assert Attribution._fields == OUTPUT_FIELDS
    defaults = {f["name"]: f["default"] for f in OUTPUT_SCHEMA["fields"] if "default" in f}
    assert {k: defaults[k] for k in Attribution._field_defaults} == Attribution._field_defaults
    assert set(Attribution._field_defaults) == {"impression_campaign", "goal_value",
                                                "credited_value", "sign", "revision",
                                                "emit_timing"}


def test_event_type_enum_and_timestamps_are_the_spec_ones():
    fields = {f["name"]: f["type"] for f in EVENT_SCHEMA["fields"]}
    assert list(fields["event_type"]["symbols"]) == list(EVENT_TYPES) == \
        ["visit", "impression", "heartbeat"]
    assert fields["ts"]["logicalType"] == "timestamp-millis"  # spec section 1: Avro millis


@BOTH
def test_spark_struct_names_and_types_follow_the_avro_schema(schema, spec):
    struct = spark_struct(schema)
    assert isinstance(struct, T.StructType)
    assert [(f.name, f.dataType) for f in struct.fields] == \
        [(name, SPARK_TYPES[kind]) for name, kind, _ in spec]


def test_spark_ddl_is_the_struct_as_a_column_list():
    assert spark_ddl(EVENT_SCHEMA) == (
        "event_id:string,user_id:string,event_type:string,ts:timestamp,url:string,"
        "referer:string,is_goal:boolean,impression_id:bigint,source_url:string,target_url:string,"
        "campaign:string,value:double")
    assert spark_ddl(OUTPUT_SCHEMA) == (
        "user_id:string,goal_event_id:string,goal_url:string,goal_ts:timestamp,"
        "impression_id:bigint,impression_event_id:string,impression_source_url:string,"
        "impression_target_url:string,impression_ts:timestamp,trail:array<string>,model:string,"
        "credit:double,impression_campaign:string,goal_value:double,credited_value:double,"
        "sign:int,revision:int,emit_timing:string")


def test_pandas_dtypes_use_nullable_types_where_the_schema_allows_null():
    assert pandas_dtypes(EVENT_SCHEMA) == {
        "event_id": "object", "user_id": "object", "event_type": "object",
        "ts": "datetime64[ns, UTC]", "url": "object", "referer": "object",
        "is_goal": "boolean", "impression_id": "Int64", "source_url": "object",
        "target_url": "object", "campaign": "object", "value": "float64"}
    assert pandas_dtypes(OUTPUT_SCHEMA) == {
        "user_id": "object", "goal_event_id": "object", "goal_url": "object",
        "goal_ts": "datetime64[ns, UTC]", "impression_id": "Int64",
        "impression_event_id": "object", "impression_source_url": "object",
        "impression_target_url": "object", "impression_ts": "datetime64[ns, UTC]",
        "trail": "object", "model": "object", "credit": "float64",
        "impression_campaign": "object", "goal_value": "float64", "credited_value": "float64",
        "sign": "int32", "revision": "int32", "emit_timing": "object"}


def test_pandas_dtypes_hold_an_organic_row():
    import pandas as pd

    rows = attribute_batch([Event("g", "u", "visit", 5, url="/g", is_goal=True)])
    frame = pd.DataFrame([r.to_record() for r in rows])
    frame["goal_ts"] = pd.to_datetime(frame["goal_ts"], unit="ms", utc=True)
    frame["impression_ts"] = pd.to_datetime(frame["impression_ts"], unit="ms", utc=True)
    frame = frame.astype(pandas_dtypes(OUTPUT_SCHEMA))
    assert frame["impression_id"].isna().all() and frame["impression_ts"].isna().all()
    assert frame["goal_ts"].iloc[0] == pd.Timestamp("1970-01-01T00:00:00.005Z")


@BOTH
def test_arrow_schema_uses_microsecond_utc_timestamps_and_the_avro_nullability(schema, spec):
    arrow = arrow_schema(schema)
    assert arrow.names == [name for name, _, _ in spec]
    for field, (name, kind, nullable) in zip(arrow, spec):
        assert field.type == ARROW_TYPES[kind], name
        assert field.nullable == nullable, name
    timestamps = [f for f in arrow if pa.types.is_timestamp(f.type)]
    assert timestamps and all(f.type.unit == "us" and f.type.tz == "UTC" for f in timestamps)


def test_the_partition_column_is_a_date_derived_from_an_output_field_it_is_not():
    assert (PARTITION_COLUMN, PARTITION_SOURCE) == ("goal_date", "goal_ts")
    assert PARTITION_SOURCE in OUTPUT_FIELDS and PARTITION_COLUMN not in OUTPUT_FIELDS
    partition = {"fields": [PARTITION_FIELD]}
    assert spark_struct(partition).fields[0].dataType == T.DateType()
    assert arrow_schema(partition).field(PARTITION_COLUMN).type == pa.date32()


def test_records_of_the_core_are_valid_avro():
    event = Event("v", "u", "visit", 1_700_000_000_123, url="/a", referer=None, is_goal=True)
    valued = Event("v2", "u", "visit", 7, url="/a", is_goal=True, value=12.5)
    click = Event("i", "u", "impression", 3, impression_id=42, source_url="s", target_url="/a",
                  campaign="spring")
    row = Attribution("u", "g", "/g", 5, 42, "i", "s", "/a", 3, ("/a", "/b"), "last_touch", 1.0)
    organic = Attribution("u", "g2", "/g", 6, None, None, None, None, None, (), "last_touch", 0.0)
    shared = Attribution("u", "g3", "/g", 7, 42, "i", "s", "/a", 3, (), "linear", 0.25, "spring",
                         12.5, 3.125)
    assert (row.sign, row.revision, row.emit_timing) == (1, 0, "ON_TIME")  # spec section 8
    for schema, records in ((EVENT_SCHEMA, [event.to_record(), valued.to_record(),
                                            click.to_record()]),
                            (OUTPUT_SCHEMA, [row.to_record(), organic.to_record(),
                                             shared.to_record()])):
        buf = io.BytesIO()
        fastavro.writer(buf, schema, records)
        buf.seek(0)
        back = [{k: ts_to_ms(v) if isinstance(v, dt.datetime) else v for k, v in r.items()}
                for r in fastavro.reader(buf)]
        assert back == records
