"""The event and output schemas, defined once as Avro, and everything derived from them.

The Avro records below are the single source of truth for field names, types and nullability.
Spark ``StructType``s, pandas dtypes and Arrow schemas are computed from them
(``attribution.spark.types``), never written by hand elsewhere.
"""
from __future__ import annotations

from typing import Any

import fastavro

TIMESTAMP_MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
DATE = {"type": "int", "logicalType": "date"}
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
        {"name": "event_type",
         "type": {"type": "enum", "name": "EventType", "symbols": list(EVENT_TYPES)}},
        {"name": "ts", "type": TIMESTAMP_MILLIS},
        {"name": "url", "type": _optional("string"), "default": None},
        {"name": "referer", "type": _optional("string"), "default": None},
        {"name": "is_goal", "type": _optional("boolean"), "default": None},
        {"name": "impression_id", "type": _optional("long"), "default": None},
        {"name": "source_url", "type": _optional("string"), "default": None},
        {"name": "target_url", "type": _optional("string"), "default": None},
        # Optional fields of section 7: an impression's campaign, a goal's conversion value.
        {"name": "campaign", "type": _optional("string"), "default": None},
        {"name": "value", "type": _optional("double"), "default": None},
    ],
})

OUTPUT_SCHEMA: dict = fastavro.parse_schema({
    "type": "record",
    "name": "Attribution",
    "namespace": "streamjoin.attribution",
    "doc": "One output row per goal, model and credited impression (spec sections 4, 6-8).",
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
        {"name": "impression_campaign", "type": _optional("string"), "default": None},
        {"name": "goal_value", "type": _optional("double"), "default": None},
        {"name": "credited_value", "type": _optional("double"), "default": None},
        # Section 8 (revisions). Until a run can revise its rows, every row has these defaults.
        {"name": "sign", "type": "int", "default": 1},
        {"name": "revision", "type": "int", "default": 0},
        {"name": "emit_timing", "type": "string", "default": "ON_TIME"},
    ],
})

# The attribution output is partitioned by the goal's UTC date. The partition column is not a field
# of OUTPUT_SCHEMA: the core's rows do not carry it, and Spark writes it as a directory level
# (``goal_date=YYYY-MM-DD``), not into the part files. It is always the UTC date of
# ``PARTITION_SOURCE``, and is derived from it wherever it is computed; the readers return it
# after the output's fields.
PARTITION_FIELD: dict = {"name": "goal_date", "type": DATE}
PARTITION_COLUMN: str = PARTITION_FIELD["name"]
PARTITION_SOURCE = "goal_ts"

EVENT_FIELDS: tuple[str, ...] = tuple(f["name"] for f in EVENT_SCHEMA["fields"])
OUTPUT_FIELDS: tuple[str, ...] = tuple(f["name"] for f in OUTPUT_SCHEMA["fields"])
# The defaults of the output columns that have one: what a row carries when its feature is off.
OUTPUT_DEFAULTS: dict = {f["name"]: f["default"] for f in OUTPUT_SCHEMA["fields"]
                         if "default" in f}


def unwrap_nullable(avro_type: Any) -> tuple[Any, bool]:
    """Return (non-null type, nullable) for a field type, unwrapping ``["null", T]`` unions.

    :param avro_type: an Avro field type, possibly a ``["null", T]`` union.
    """
    if isinstance(avro_type, list):
        non_null = [t for t in avro_type if t != "null"]
        if len(non_null) != 1:
            raise TypeError(f"only [null, T] unions are supported, got {avro_type}")
        return non_null[0], True
    return avro_type, False


def type_kind(avro_type: Any) -> str:
    """A short name for an Avro type: string, boolean, int, long, double, timestamp, date, enum
    or array.

    :param avro_type: an Avro field type, possibly a nullable union.
    """
    if isinstance(avro_type, dict):
        if avro_type.get("logicalType") == "timestamp-millis":
            return "timestamp"
        if avro_type.get("logicalType") == "date":
            return "date"
        if avro_type["type"] in ("enum", "array"):
            return avro_type["type"]
        return type_kind(avro_type["type"])
    return {"string": "string", "boolean": "boolean", "long": "long", "int": "int",
            "double": "double", "float": "double"}[avro_type]


def field_kinds(schema: dict) -> dict[str, tuple[str, bool]]:
    """Map each field of a record schema to ``(kind, nullable)``.

    :param schema: an Avro record schema, as parsed JSON.
    """
    out = {}
    for f in schema["fields"]:
        t, nullable = unwrap_nullable(f["type"])
        out[f["name"]] = (type_kind(t), nullable)
    return out
