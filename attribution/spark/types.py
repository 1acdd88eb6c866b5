"""Spark, pandas and Arrow types derived from the Avro schemas of ``attribution.schema``.

Nothing here names a field: every type follows from the one Avro definition of the event and
output records, through ``field_kinds``.
"""
from __future__ import annotations

import pyarrow as pa

from ..schema import field_kinds, type_kind, unwrap_nullable


def spark_struct(schema: dict):
    """Derive the Spark ``StructType`` of an Avro record schema (all fields nullable in Spark
    file sources anyway; non-null Avro fields are marked non-nullable for output contracts).

    :param schema: an Avro record schema, as parsed JSON.
    """
    # Imported here: the Arrow schema below serves programs that never start Spark (the
    # generator, the file readers), which should not pay for importing pyspark.
    from pyspark.sql import types as T

    scalar = {"string": T.StringType(), "enum": T.StringType(), "boolean": T.BooleanType(),
              "int": T.IntegerType(), "long": T.LongType(), "double": T.DoubleType(),
              "timestamp": T.TimestampType(), "date": T.DateType()}
    fields = []
    for f in schema["fields"]:
        t, nullable = unwrap_nullable(f["type"])
        kind = type_kind(t)
        if kind == "array":
            item_kind = type_kind(t["items"])
            spark_type = T.ArrayType(scalar[item_kind], containsNull=False)
        else:
            spark_type = scalar[kind]
        fields.append(T.StructField(f["name"], spark_type, nullable=True))
    return T.StructType(fields)


def spark_ddl(schema: dict) -> str:
    """The schema as a Spark DDL string, e.g. for ``applyInPandasWithState`` output.

    :param schema: an Avro record schema, as parsed JSON.
    """
    return spark_struct(schema).simpleString()[len("struct<"):-1]


_PANDAS_DTYPES = {"string": "object", "enum": "object", "boolean": "boolean", "int": "Int32",
                  "long": "Int64", "double": "float64", "timestamp": "datetime64[ns, UTC]",
                  "date": "object", "array": "object"}


def pandas_dtypes(schema: dict) -> dict[str, str]:
    """Derive pandas dtypes (nullable extension types where Avro allows null).

    :param schema: an Avro record schema, as parsed JSON.
    """
    out = {}
    for name, (kind, nullable) in field_kinds(schema).items():
        dtype = _PANDAS_DTYPES[kind]
        if kind in ("int", "long") and not nullable:
            dtype = dtype.lower()
        out[name] = dtype
    return out


def arrow_schema(schema: dict):
    """Derive the pyarrow schema; timestamps are microsecond UTC, as Spark reads Parquet best.

    :param schema: an Avro record schema, as parsed JSON.
    """
    scalar = {"string": pa.string(), "enum": pa.string(), "boolean": pa.bool_(), "int": pa.int32(),
              "long": pa.int64(), "double": pa.float64(), "timestamp": pa.timestamp("us", tz="UTC"),
              "date": pa.date32()}
    fields = []
    for f in schema["fields"]:
        t, nullable = unwrap_nullable(f["type"])
        kind = type_kind(t)
        arrow_type = pa.list_(scalar[type_kind(t["items"])]) if kind == "array" else scalar[kind]
        fields.append(pa.field(f["name"], arrow_type, nullable=nullable))
    return pa.schema(fields)
