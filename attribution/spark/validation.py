"""Spark-side input validation: every raw record becomes a valid event or a dead letter.

Raw records are classified by Spark SQL expressions only (no Python UDF on the hot path) into a
valid event in the event schema, or an invalid record with a reason. The reasons repeat the
wording of ``attribution.events`` (``missing user_id``, ``unknown event_type 'click'``,
``visit without url``, ``url too long (N chars > 8192)``, ``value must be a finite number, got
nan``...), so a record rejected by the Spark job and by the pure-Python oracle reads the same.

Raw records come from an input source (``attribution.spark.sources``), which says whether they
are text or typed, what names their origin, and what their arrival time is. JSON records (the
lines of a file, the values of Kafka records) are *text*, so one that is not JSON at all still
reaches the dead letter verbatim, and parsed with ``try_parse_json`` into a VARIANT. The variant
keeps the JSON type of every field, which lets the rules reject wrong types the way
``attribution.events`` does (Spark's JSON reader would silently turn ``"url": 5`` into the string
``"5"`` and ``"ts": 5`` into five *seconds*). Typed input (Parquet, Avro) is already typed by its
writer: its rows get the same semantic rules; a Parquet file whose column types contradict the
event schema cannot be read at all by Spark: its source leaves it out and dead-letters its rows
(``sources.files.ParquetFiles``), or, where it cannot, ``unreadable_input`` explains it to the
user (``docs/attribution-job.md``).

Everything here must run *before* ``withWatermark``: only valid rows may move the watermark. In
particular an event far in the future (``--max-future-skew``) would otherwise drag the watermark
forward and turn every later event late.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..config import MAX_STRING_LENGTH, parse_duration_ms
from ..schema import EVENT_FIELDS, EVENT_SCHEMA, field_kinds
from .jvm_cache import once_per_jvm
from .layout import DETECTED_DATE
from .sinks import ParquetSink
from .sources import ARRIVAL_COLUMN, EventSource, as_source, file_source
from .sources.files import unreadable_file
from .types import spark_struct

# How far past its arrival time (a file's modification time, a Kafka timestamp) an event may
# claim to be. Clocks of real clients drift by minutes, and time zones mistaken for UTC shift by
# hours; a day covers both.
DEFAULT_MAX_FUTURE_SKEW = "1 day"

VALIDATION_METRICS = "validation"  # observed-metrics name: per micro-batch count of invalid rows

# Accepted JSON forms of ``ts``: ISO-8601 date and time, optional fraction (up to microseconds,
# truncated to milliseconds like ``attribution.events.ts_to_ms``), explicit offset ('Z', +01:00).
_TS_PATTERNS = ("yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX", "yyyy-MM-dd'T'HH:mm[:ss][.SSSSSS]XXX",
                "yyyy-MM-dd HH:mm:ss[.SSSSSS]XXX")
_TS_PATTERN_WITHOUT_OFFSET = "yyyy-MM-dd['T'][ ]HH:mm[:ss][.SSSSSS]"
_REASON_PREVIEW = 64  # characters of an offending value quoted in a reason, as events.py does


def _pandas_time_range() -> tuple[str, str]:
    """The event times the stateful backends can take: applyInPandasWithState hands ``ts`` to
    pandas as ``datetime64[ns]``, which ends in 1677 and 2262 (a year-9999 event crashes it)."""
    import pandas as pd

    return (pd.Timestamp.min.ceil("D").strftime("%Y-%m-%dT%H:%M:%SZ"),
            pd.Timestamp.max.floor("D").strftime("%Y-%m-%dT%H:%M:%SZ"))


SUPPORTED_TS_RANGE = _pandas_time_range()

_STRING_FIELDS = ("event_id", "user_id", "url", "referer", "source_url", "target_url", "campaign")
_INTEGER_VARIANT_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def max_future_skew_ms(text: str) -> int:
    """Parse ``--max-future-skew`` (a duration such as ``"1 day"``) into milliseconds.

    :param text: the option's value.
    """
    return parse_duration_ms(text)


# -- reading raw records: the sources do (``attribution.spark.sources``) -----------------------
#
# These three keep the directory-and-format calls of the jobs; new code builds a source once
# (``sources.file_source``, ``sources.KafkaSource``) and calls its methods.

def read_raw_stream(spark, events_dir: str, fmt: str,
                    max_files_per_trigger: Optional[int] = None) -> DataFrame:
    """``fmt`` files of ``events_dir`` as a stream of raw records (``EventSource.read_stream``).

    :param spark: the session.
    :param events_dir: the input directory.
    :param fmt: a key of ``formats.EVENT_FORMATS``.
    :param max_files_per_trigger: at most this many new files per micro-batch (None: all).
    """
    return file_source(fmt, events_dir, max_files_per_trigger).read_stream(spark)


def read_raw_batch(spark, events_dir: str, fmt: str) -> DataFrame:
    """``fmt`` files of ``events_dir`` read once as raw records (``EventSource.read_batch``).

    :param spark: the session.
    :param events_dir: the input directory.
    :param fmt: a key of ``formats.EVENT_FORMATS``.
    """
    return file_source(fmt, events_dir).read_batch(spark)


# -- the field view: a kind and a typed value per field ----------------------------------------
#
# The rules below see every field as two columns: ``k_<name>``, the Python type name of the raw
# value (``str``, ``int``, ``float``, ``bool``, ``dict``, ``list``; null when absent or JSON null),
# and ``<name>`` itself, typed as in the event schema. The JSON view derives both from the
# variant; the Parquet view knows them from the file schema.

def _python_kind(variant_type: Column) -> Column:
    """``schema_of_variant`` output (e.g. ``BIGINT``, ``DECIMAL(2,1)``) as a Python type name."""
    t = variant_type
    return (F.when(t.isNull() | (t == "VOID"), F.lit(None).cast("string"))
             .when(t == "STRING", "str")
             .when(t.isin(*_INTEGER_VARIANT_TYPES) | t.rlike(r"^DECIMAL\(\d+,0\)$"), "int")
             .when(t.startswith("DECIMAL") | t.isin("DOUBLE", "FLOAT"), "float")
             .when(t == "BOOLEAN", "bool")
             .when(t.startswith("OBJECT"), "dict")
             .when(t.startswith("ARRAY"), "list")
             .otherwise(F.lower(t)))


def _record_kind(variant: Column) -> Column:
    """The Python type name of the whole parsed line, or null when it is not JSON.

    Read from the line's first character, which decides a JSON value's type; cheaper than
    ``schema_of_variant``, which would describe every field of every valid record.
    """
    first = F.substring(F.ltrim("raw_record"), 1, 1)
    return (F.when(variant.isNull(), F.lit(None).cast("string"))
             .when(first == "{", "dict").when(first == "[", "list").when(first == '"', "str")
             .when(first.isin("t", "f"), "bool").when(first == "n", "NoneType")
             .when(F.trim("raw_record").rlike(r"^-?[0-9]+$"), "int")
             .otherwise("float"))


def _parse_ts(text: Column) -> Column:
    return F.coalesce(*(F.try_to_timestamp(text, F.lit(p)) for p in _TS_PATTERNS))


@once_per_jvm
def _json_view_stages(passed: tuple) -> tuple[list, list, list]:
    """The Columns of ``_json_view``'s three projections, ``passed`` through the first."""
    v = F.col("_v")
    columns = [F.col("raw_record"), *passed, _record_kind(v).alias("k_record"),
               F.lit(None).cast("string").alias("read_error")]
    for name in EVENT_FIELDS:
        columns.append(F.schema_of_variant(F.try_variant_get(v, f"$.{name}", "variant"))
                       .alias(f"t_{name}"))
    for name in (*_STRING_FIELDS, "event_type"):
        # Only read as a string when it is one, except event_type, whose reason quotes any value.
        columns.append(F.try_variant_get(v, f"$.{name}", "string").alias(name))
    columns += [F.try_variant_get(v, "$.ts", "string").alias("ts_text"),
                F.try_variant_get(v, "$.is_goal", "boolean").alias("is_goal"),
                F.try_variant_get(v, "$.value", "double").alias("value"),
                F.try_variant_get(v, "$.impression_id", "bigint").alias("id_long"),
                F.try_variant_get(v, "$.impression_id", "double").alias("id_double")]

    kinds = [F.col("*"),
             *(_python_kind(F.col(f"t_{name}")).alias(f"k_{name}") for name in EVENT_FIELDS),
             _parse_ts(F.col("ts_text")).alias("ts_parsed")]

    # Like events.py, an integral float (1.0) is an integer id; 1.5 is not (a bigint cast of the
    # variant would silently truncate it).
    id_kind, id_double = F.col("k_impression_id"), F.col("id_double")
    integral_float = (id_kind == "float") & (id_double == F.floor(id_double))
    is_text_ts = F.col("k_ts") == "str"
    typed = [
        F.col("*"),
        ((id_kind == "int") | integral_float).alias("impression_id_integral"),
        F.when(id_kind == "int", F.col("id_long"))
         .when(integral_float, id_double.try_cast("bigint")).alias("impression_id"),
        F.when(is_text_ts, F.col("ts_parsed")).alias("ts"),
        F.when(is_text_ts & F.col("ts_parsed").isNull(),
               F.try_to_timestamp("ts_text", F.lit(_TS_PATTERN_WITHOUT_OFFSET)))
         .alias("ts_without_offset"),
    ]
    return columns, kinds, typed


def _json_view(raw: DataFrame, passed: list[str]) -> DataFrame:
    # Built in stages, each a projection over the previous one's columns. The rules test every
    # kind many times inside CASE WHEN branches, where Spark does not share common
    # subexpressions: computed inline, each test would re-extract the field from the variant.
    # Spark keeps a projection separate when inlining it would repeat an expensive expression.
    columns, kinds, typed = _json_view_stages(tuple(passed))
    parsed = raw.withColumn("_v", F.try_parse_json("raw_record"))
    return parsed.select(*columns).select(*kinds).select(*typed)


@once_per_jvm
def _typed_view_columns(passed: tuple) -> list:
    """The Columns of ``_typed_view``'s projection, ``passed`` through."""
    kinds = {"string": "str", "enum": "str", "boolean": "bool", "long": "int", "double": "float",
             "timestamp": "timestamp"}
    # raw_record is left to ``classify``, which renders it for the invalid rows only.
    columns = [*passed, F.lit("dict").alias("k_record"), F.col("read_error")]
    for name, (kind, _nullable) in field_kinds(EVENT_SCHEMA).items():
        columns.append(F.when(F.col(name).isNotNull(), F.lit(kinds[kind])).alias(f"k_{name}"))
    columns += [F.col(n) for n in EVENT_FIELDS]
    columns += [F.lit(None).cast("string").alias("ts_text"),
                F.col("impression_id").isNotNull().alias("impression_id_integral"),
                F.lit(None).cast("timestamp").alias("ts_without_offset")]
    return columns


def _typed_view(raw: DataFrame, passed: list[str]) -> DataFrame:
    return raw.select(*_typed_view_columns(tuple(passed)))


# -- the rules ---------------------------------------------------------------------------------

def _iso(ts: Column) -> Column:
    return F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")


def _quoted(value: Column) -> Column:
    return F.concat(F.lit("'"), F.substring(value, 1, _REASON_PREVIEW), F.lit("'"))


def _string_rules(name: str, required: bool, what: str = "") -> list[tuple[Column, Column]]:
    """(condition, reason) pairs of ``attribution.events._string``, in its order."""
    kind, value = F.col(f"k_{name}"), F.col(name)
    rules = []
    if required:
        rules.append((kind.isNull(),
                      F.lit(f"{what} without {name}" if what else f"missing {name}")))
    rules += [
        (kind.isNotNull() & (kind != "str"),
         F.concat(F.lit(f"{name} must be a string, got "), kind)),
        ((kind == "str") & (F.length(value) > MAX_STRING_LENGTH),
         F.concat(F.lit(f"{name} too long ("), F.length(value).cast("string"),
                  F.lit(f" chars > {MAX_STRING_LENGTH})"))),
    ]
    if required:
        rules.append(((kind == "str") & (value == ""),
                      F.lit(f"{what} with empty {name}" if what else f"empty {name}")))
    return rules


def _value_rules() -> list[tuple[Column, Column]]:
    """(condition, reason) pairs of ``attribution.events._value``: a number, and a finite one
    (NaN and infinities named as Python prints them)."""
    kind, value = F.col("k_value"), F.col("value")
    number = kind.isin("int", "float")
    printed = (F.when(F.isnan(value), F.lit("nan"))
                .when(value > 0, F.lit("inf")).otherwise(F.lit("-inf")))
    return [
        (kind.isNotNull() & ~number, F.concat(F.lit("value must be a number, got "), kind)),
        (number & (F.isnan(value) | (F.abs(value) == F.lit(float("inf")))),
         F.concat(F.lit("value must be a finite number, got "), printed)),
    ]


def _ts_rules() -> list[tuple[Column, Column]]:
    kind, text = F.col("k_ts"), F.col("ts_text")
    return [
        (kind.isNull(), F.lit("missing ts")),
        # The spec's JSON form of ts is an ISO-8601 string; a bare number has no unit to trust.
        ((kind != "str") & (kind != "timestamp"),
         F.concat(F.lit("ts must be an ISO-8601 string, got "), kind)),
        ((kind == "str") & F.col("ts").isNull() & F.col("ts_without_offset").isNotNull(),
         F.concat(F.lit("ts "), _quoted(text), F.lit(" has no UTC offset"))),
        ((kind == "str") & F.col("ts").isNull(), F.concat(F.lit("unparseable ts "), _quoted(text))),
    ]


def _rules(skew_rule: tuple[Column, Column]) -> list[tuple[Column, Column]]:
    """(broken, reason) pairs in ``attribution.events.parse_event``'s order, with ``skew_rule``
    (from ``_skew_rule``) where the time-range checks begin."""
    event_type = F.col("event_type")
    is_heartbeat = F.col("k_event_type").eqNullSafe("str") & (event_type == "heartbeat")
    is_visit = F.col("k_event_type").eqNullSafe("str") & (event_type == "visit")
    is_impression = F.col("k_event_type").eqNullSafe("str") & (event_type == "impression")
    not_heartbeat = ~is_heartbeat

    rules: list[tuple[Column, Column]] = [
        # A part of a file the reader could not decode (Avro): its reason names file and place.
        (F.col("read_error").isNotNull(), F.col("read_error")),
        (F.col("k_record").isNull(), F.lit("malformed JSON")),
        (F.col("k_record") != "dict",
         F.concat(F.lit("record must be an object, got "), F.col("k_record"))),
        (F.col("k_event_type").isNull(), F.lit("missing event_type")),
        (~(is_heartbeat | is_visit | is_impression),
         F.concat(F.lit("unknown event_type "), _quoted(event_type))),
        *_string_rules("event_id", required=True),
        *_ts_rules(),
    ]
    rules += [(not_heartbeat & cond, reason)
              for cond, reason in _string_rules("user_id", required=True)]
    goal_kind = F.col("k_is_goal")
    rules.append((is_visit & goal_kind.isNotNull() & (goal_kind != "bool"),
                  F.concat(F.lit("is_goal must be a boolean, got "), goal_kind)))
    rules += [(is_visit & cond, reason)
              for cond, reason in (*_string_rules("url", required=True, what="visit"),
                                   *_string_rules("referer", required=False), *_value_rules())]
    id_kind = F.col("k_impression_id")
    rules += [
        (is_impression & id_kind.isNull(), F.lit("impression without impression_id")),
        (is_impression & ~F.col("impression_id_integral"),
         F.concat(F.lit("impression_id must be an integer, got "), id_kind)),
        (is_impression & F.col("impression_id").isNull(),
         F.lit("impression_id out of range for a 64-bit integer")),
    ]
    rules += [(is_impression & cond, reason)
              for cond, reason in (*_string_rules("source_url", required=True, what="impression"),
                                   *_string_rules("target_url", required=True, what="impression"),
                                   *_string_rules("campaign", required=False))]
    rules.append(skew_rule)
    low, high = SUPPORTED_TS_RANGE
    rules.append(((F.col("ts") < F.lit(low).cast("timestamp"))
                  | (F.col("ts") >= F.lit(high).cast("timestamp")),
                  F.concat(F.lit("ts "), _iso(F.col("ts")),
                           F.lit(f" is outside the supported range [{low}, {high})"))))
    return rules


def _skew_rule(max_future_skew_ms: int, skew_text: str,
               arrival: str) -> tuple[Column, Column]:
    """The one rule of our own: ``ts`` may not be more than the skew ahead of the record's
    arrival time (``ARRIVAL_COLUMN``: the time its file was written, its Kafka timestamp), a
    reference every query and every rerun that reads the record sees alike, so each record
    lands in exactly one of the output and the dead letter. ``arrival`` names it in the
    reason (``EventSource.arrival``)."""
    # In epoch microseconds: a calendar-aware ``timestamp_add`` per row cost more than this test.
    written = F.col(ARRIVAL_COLUMN)
    too_far = F.unix_micros("ts") > F.unix_micros(written) + F.lit(max_future_skew_ms * 1000)
    return (too_far,
            F.concat(F.lit("ts "), _iso(F.col("ts")),
                     F.lit(f" is more than {skew_text} ahead of {arrival} "),
                     _iso(written), F.lit(" (--max-future-skew)")))


def _none_broken(conditions: list[Column]) -> Column:
    """True when no condition holds. A null condition (SQL's unknown) counts as not holding, as
    in a CASE, so a record is valid exactly when ``_first_reason`` is null."""
    broken = F.lit(False)
    for cond in conditions:
        broken = broken | F.coalesce(cond, F.lit(False))
    return ~broken


def _first_reason(rules: list[tuple[Column, Column]]) -> Column:
    """The reason of a record's first broken rule, or null when it breaks none."""
    reason = F.when(rules[0][0], rules[0][1])
    for cond, text in rules[1:]:
        reason = reason.when(cond, text)
    return reason.otherwise(F.lit(None).cast("string"))


@once_per_jvm
def _validity(max_future_skew_ms: int, skew_text: str, arrival: str) -> tuple[Column, Column]:
    """``valid`` (no rule broken) and ``reason`` (the first broken rule's) of ``classify``, the
    skew rule's arguments as ``_skew_rule`` takes them."""
    rules = _rules(_skew_rule(max_future_skew_ms, skew_text, arrival))
    return _none_broken([c for c, _ in rules]), _first_reason(rules)


@once_per_jvm
def _event_columns() -> list[Column]:
    """A valid row in the event schema, with the fields its event type does not use nulled,
    as ``attribution.events.parse_event`` builds its ``Event``."""
    event_type = F.col("event_type")
    is_visit, is_impression = event_type == "visit", event_type == "impression"
    schema = {f.name: f.dataType for f in spark_struct(EVENT_SCHEMA).fields}
    keep = {
        "event_id": F.col("event_id"),
        "user_id": F.when(event_type != "heartbeat", F.col("user_id")),
        "event_type": event_type,
        "ts": F.col("ts"),
        "url": F.when(is_visit, F.col("url")),
        "referer": F.when(is_visit, F.col("referer")),
        "is_goal": F.when(is_visit, F.coalesce(F.col("is_goal"), F.lit(False))),
        "impression_id": F.when(is_impression, F.col("impression_id")),
        "source_url": F.when(is_impression, F.col("source_url")),
        "target_url": F.when(is_impression, F.col("target_url")),
        "campaign": F.when(is_impression, F.col("campaign")),
        "value": F.when(is_visit, F.col("value")),
    }
    return [keep[name].cast(schema[name]).alias(name) for name in EVENT_FIELDS]


def classify(raw: DataFrame, source: Union[EventSource, str], max_future_skew_ms: int,
             skew_text: Optional[str] = None) -> DataFrame:
    """Every raw record with ``valid``, its ``reason`` (null when valid), the event columns, the
    raw text (for typed input, the row as JSON, on invalid rows only) and the record's origin
    (``source.origin_columns``: its file; its topic, partition and offset).

    :param raw: raw records of ``source`` (``read_stream``, ``read_batch``, ``read_committed``).
    :param source: the source that read them, or a format name for that format's files
        (``sources.as_source``): whether records are text to parse (JSON) or typed rows, what
        names their origin, and what their arrival time is.
    :param max_future_skew_ms: how far ``ts`` may be ahead of the record's arrival time.
    :param skew_text: the skew as the user wrote it, for the reason text.

    The number of invalid records is attached as observed metrics (``VALIDATION_METRICS``), per
    micro-batch in a stream. Every rule depends on the record, its origin and its arrival time
    only, so the main query, the dead-letter query and any rerun judge every record alike.

    Select on ``valid``, not on ``reason`` (``valid_events`` and ``dead_letters`` do): the
    reason, one CASE over every rule, makes a method too large for the JVM's JIT (HotSpot
    interprets methods over 8,000 bytes of bytecode); inlined into the filter of valid rows, it
    cost more than the attribution. ``valid`` has no strings to build and stays compiled; the
    reason is evaluated only where ``valid`` is false.
    """
    source = as_source(source)
    origin = list(source.origin_columns)
    passed = [*origin, ARRIVAL_COLUMN]
    view = _json_view(raw, passed) if source.format.text else _typed_view(raw, passed)
    valid, reason = _validity(max_future_skew_ms, skew_text or f"{max_future_skew_ms} ms",
                              source.arrival)
    view = (view.withColumn("valid", valid)
                .observe(VALIDATION_METRICS, F.count(F.when(~F.col("valid"), 1)).alias("invalid"))
                .withColumn("reason", F.when(~F.col("valid"), reason)))
    if not source.format.text:
        # A typed row has no text of its own; it is rendered as JSON only for the dead letter
        # (on every valid row this cost more than all the rules).
        view = view.withColumn("raw_record", F.when(~F.col("valid") & F.col("read_error").isNull(),
                                                    F.to_json(F.struct(*EVENT_FIELDS))))
    return view.select("raw_record", *origin, "valid", "reason", *_event_columns())


def valid_events(classified: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
    """The valid rows of ``classify`` in the event schema, ready for ``withWatermark``.

    :param classified: from ``classify``.
    :param keep: more columns of ``classify`` to keep, e.g. the origin ``["source_file"]``.
    """
    return classified.filter(F.col("valid")).select(*EVENT_FIELDS, *keep)


def dead_letters(classified: DataFrame) -> DataFrame:
    """The invalid rows in the dead-letter schema: raw record, reason, origin (the source's
    columns: ``source_file`` for files), and when (the micro-batch's processing time) they were
    rejected.

    :param classified: from ``classify``.
    """
    origin = [c for c in classified.columns
              if c not in ("raw_record", "valid", "reason", *EVENT_FIELDS)]
    # The fallback reason is for a rule whose own text came out null; none is known to.
    return (classified.filter(~F.col("valid"))
                      .select("raw_record", F.coalesce("reason", F.lit("invalid record"))
                              .alias("reason"), *origin,
                              F.current_timestamp().alias("detected_at")))


def start_dead_letter_stream(classified: DataFrame, path: str, checkpoint: str, trigger: str,
                             query_name: str = "dead_letter", by_detected_date: bool = False):
    """Write ``dead_letters(classified)`` to Parquet files (``sinks.ParquetSink``) as a second
    streaming query.

    It reads the input itself, under its own checkpoint, so it is exactly-once like the main
    output; it may run ahead of or behind the main query by a few micro-batches.

    :param classified: the input's records through ``classify``.
    :param path: the dead-letter directory.
    :param checkpoint: the dead-letter query's own checkpoint.
    :param trigger: as the main query's (``pipeline.apply_trigger``).
    :param query_name: the query's name.
    :param by_detected_date: lay the files out under ``detected_date=YYYY-MM-DD`` (``layout``).
    """
    sink = ParquetSink(path, DETECTED_DATE if by_detected_date else None)
    return sink.start_stream(dead_letters(classified), checkpoint, trigger, query_name)


# -- input that cannot be read at all -----------------------------------------------------------

def unreadable_input(error: BaseException) -> Optional[str]:
    """If ``error`` is Spark failing to read an input file (e.g. a Parquet file whose column
    types contradict the event schema), a one-paragraph explanation naming the file and how to
    resume; otherwise ``None``.

    Spark cannot decode any row of such a file. This is for a job that cannot leave it out
    (``EventSource.leave_out``): the micro-batch that holds it is never committed, so stopping
    here loses nothing.

    :param error: the error a query or a batch job raised.
    """
    found = unreadable_file(error)
    if found is None:
        return None
    return (f"input file {found[0]} cannot be read as events ({found[1]}). "
            "Nothing from the micro-batch holding it was committed. Replace the file, under the "
            "same name, with a corrected one (or an empty file in the event schema) and rerun with "
            "the same --checkpoint: the job resumes at that batch.")
