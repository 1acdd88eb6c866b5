"""The event and output schemas, defined once as Avro, and everything derived from them.

The Avro records below are the single source of truth for field names, types and nullability.
Spark ``StructType``s, pandas dtypes and Arrow schemas are computed from them, never written by
hand elsewhere. Spark is imported lazily so that the engine-free core can import this module.
"""
from __future__ import annotations

from typing import Any

import fastavro

TIMESTAMP_MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
EVENT_TYPES = ("visit", "impression", "heartbeat")


def _optional(avro_type: Any) -> list:
    return ["null", avro_type]


EVENT_SCHEMA: dict = fastavro.parse_schema({
    "type": "record",
    "name": "Event",
    "namespace": "streamjoin.attribution",
    "doc": "One input record (spec section 1).",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "user_id", "type": _optional("string"), "default": None},
        {"name": "event_type", "type": {"type": "enum", "name": "EventType", "symbols": list(EVENT_TYPES)}},
        {"name": "ts", "type": TIMESTAMP_MILLIS},
        {"name": "url", "type": _optional("string"), "default": None},
        {"name": "referer", "type": _optional("string"), "default": None},
        {"name": "is_goal", "type": _optional("boolean"), "default": None},
        {"name": "impression_id", "type": _optional("long"), "default": None},
        {"name": "source_url", "type": _optional("string"), "default": None},
        {"name": "target_url", "type": _optional("string"), "default": None},
    ],
})

OUTPUT_SCHEMA: dict = fastavro.parse_schema({
    "type": "record",
    "name": "Attribution",
    "namespace": "streamjoin.attribution",
    "doc": "One output row per goal (spec section 4).",
    "fields": [
        {"name": "user_id", "type": "string"},
        {"name": "goal_event_id", "type": "string"},
        {"name": "goal_url", "type": "string"},
        {"name": "goal_ts", "type": TIMESTAMP_MILLIS},
        {"name": "impression_id", "type": _optional("long"), "default": None},
        {"name": "impression_event_id", "type": _optional("string"), "default": None},
        {"name": "impression_source_url", "type": _optional("string"), "default": None},
        {"name": "impression_target_url", "type": _optional("string"), "default": None},
        {"name": "impression_ts", "type": _optional(TIMESTAMP_MILLIS), "default": None},
        {"name": "trail", "type": {"type": "array", "items": "string"}},
        {"name": "model", "type": "string"},
        {"name": "credit", "type": "double"},
    ],
})

EVENT_FIELDS: tuple[str, ...] = tuple(f["name"] for f in EVENT_SCHEMA["fields"])
OUTPUT_FIELDS: tuple[str, ...] = tuple(f["name"] for f in OUTPUT_SCHEMA["fields"])


def _unwrap(avro_type: Any) -> tuple[Any, bool]:
    """Return (non-null type, nullable) for a field type, unwrapping ``["null", T]`` unions."""
    if isinstance(avro_type, list):
        non_null = [t for t in avro_type if t != "null"]
        if len(non_null) != 1:
            raise TypeError(f"only [null, T] unions are supported, got {avro_type}")
        return non_null[0], True
    return avro_type, False


def _kind(avro_type: Any) -> str:
    """A short name for an Avro type: string, boolean, long, double, timestamp, enum or array."""
    if isinstance(avro_type, dict):
        if avro_type.get("logicalType") == "timestamp-millis":
            return "timestamp"
        if avro_type["type"] in ("enum", "array"):
            return avro_type["type"]
        return _kind(avro_type["type"])
    return {"string": "string", "boolean": "boolean", "long": "long", "int": "long",
            "double": "double", "float": "double"}[avro_type]


def field_kinds(schema: dict) -> dict[str, tuple[str, bool]]:
    """Map each field of a record schema to ``(kind, nullable)``."""
    out = {}
    for f in schema["fields"]:
        t, nullable = _unwrap(f["type"])
        out[f["name"]] = (_kind(t), nullable)
    return out


def spark_struct(schema: dict):
    """Derive the Spark ``StructType`` of an Avro record schema (all fields nullable in Spark
    file sources anyway; non-null Avro fields are marked non-nullable for output contracts)."""
    from pyspark.sql import types as T

    scalar = {"string": T.StringType(), "enum": T.StringType(), "boolean": T.BooleanType(),
              "long": T.LongType(), "double": T.DoubleType(), "timestamp": T.TimestampType()}
    fields = []
    for f in schema["fields"]:
        t, nullable = _unwrap(f["type"])
        kind = _kind(t)
        if kind == "array":
            item_kind = _kind(t["items"])
            spark_type = T.ArrayType(scalar[item_kind], containsNull=False)
        else:
            spark_type = scalar[kind]
        fields.append(T.StructField(f["name"], spark_type, nullable=True))
    return T.StructType(fields)


def spark_ddl(schema: dict) -> str:
    """The schema as a Spark DDL string, e.g. for ``applyInPandasWithState`` output."""
    return spark_struct(schema).simpleString()[len("struct<"):-1]


_PANDAS_DTYPES = {"string": "object", "enum": "object", "boolean": "boolean", "long": "Int64",
                  "double": "float64", "timestamp": "datetime64[ns, UTC]", "array": "object"}


def pandas_dtypes(schema: dict) -> dict[str, str]:
    """Derive pandas dtypes (nullable extension types where Avro allows null)."""
    out = {}
    for name, (kind, nullable) in field_kinds(schema).items():
        dtype = _PANDAS_DTYPES[kind]
        if kind == "long" and not nullable:
            dtype = "int64"
        out[name] = dtype
    return out


def arrow_schema(schema: dict):
    """Derive the pyarrow schema; timestamps are microsecond UTC, as Spark reads Parquet best."""
    import pyarrow as pa

    scalar = {"string": pa.string(), "enum": pa.string(), "boolean": pa.bool_(), "long": pa.int64(),
              "double": pa.float64(), "timestamp": pa.timestamp("us", tz="UTC")}
    fields = []
    for f in schema["fields"]:
        t, nullable = _unwrap(f["type"])
        kind = _kind(t)
        arrow_type = pa.list_(scalar[_kind(t["items"])]) if kind == "array" else scalar[kind]
        fields.append(pa.field(f["name"], arrow_type, nullable=nullable))
    return pa.schema(fields)
