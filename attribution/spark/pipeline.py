"""Assembles the attribution query on Spark: events DataFrame in, attribution DataFrame out.

Streaming: ``withWatermark`` on ``ts`` first (so heartbeats advance event time), then heartbeats
are dropped, then the per-user stateful operator of the chosen backend runs the core. Batch: the
same core per user over all input, fired at a watermark of +infinity.

Both outputs carry Spark *observed metrics* (goals and attributed goals per model, see
``output_metrics``) so that progress lines and the final report count what was really emitted;
the stream's also carry the change in the number of users held in state where Spark's state row
count is not that number (``users_counted_by_change``).
"""
from __future__ import annotations

from typing import Optional, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..config import AttributionConfig, parse_duration_ms, spark_interval
from ..schema import OUTPUT_SCHEMA
from .apply_in_pandas import (
    BUCKET_COLUMN,
    STATE_DDL,
    make_batch_function,
    make_bucket_state_function,
    make_group_state_function,
)
from .bucket_keys import MAX_ALIGNED_BUCKETS, aligned_bucket_keys
from .frames import INPUT_COLUMNS, PACKED_COLUMN, PACKED_KEYS, STATE_USERS_CHANGE
from .types import spark_struct

BACKENDS = ("applyInPandasWithState", "transformWithState")
# The faster of the two on the benchmark (benchmarks/streaming; README, Performance):
# applyInPandasWithState keyed by hash buckets of users, so its per-key pandas cost is paid per
# bucket, not per user.
DEFAULT_BACKEND = "applyInPandasWithState"
# applyInPandasWithState's keys. A new checkpoint takes BUCKETS_PER_SHUFFLE_PARTITION buckets per
# shuffle partition (at most MAX_ALIGNED_BUCKETS), so the stateful stage has work for every task
# on any cluster, and each bucket stays as large as on the measured 2-partition default (64);
# fixed by the query's first run, like the shuffle partitions. DEFAULT_STATE_BUCKETS is what a
# checkpoint that predates the record has. 0 = one key per user.
BUCKETS_PER_SHUFFLE_PARTITION = 32
DEFAULT_STATE_BUCKETS = 64
# How a bucket number becomes its state key: "aligned" (``bucket_keys``) spreads the
# buckets evenly over Spark's partitions; "index", the bucket number itself, is what queries
# started before it use, and must keep using.
ALIGNED_BUCKET_KEYS, INDEX_BUCKET_KEYS = "aligned", "index"
BUCKET_KEY_SCHEMES = (ALIGNED_BUCKET_KEYS, INDEX_BUCKET_KEYS)
OUTPUT_METRICS = "attribution_output"
TWS_STATE_LAYOUTS = ("compact", "declared")
DEFAULT_TWS_STATE = "compact"


def state_buckets_for(shuffle_partitions: int) -> int:
    """The bucket count a new checkpoint takes for ``shuffle_partitions`` partitions:
    ``BUCKETS_PER_SHUFFLE_PARTITION`` per partition, at most ``MAX_ALIGNED_BUCKETS`` (then the
    largest multiple of the partitions under it, so that the partitions still share evenly).

    :param shuffle_partitions: the query's shuffle partitions.
    """
    if shuffle_partitions < 1:
        raise ValueError(f"shuffle partitions must be >= 1, not {shuffle_partitions}")
    wanted = BUCKETS_PER_SHUFFLE_PARTITION * shuffle_partitions
    if wanted <= MAX_ALIGNED_BUCKETS:
        return wanted
    return max(MAX_ALIGNED_BUCKETS // shuffle_partitions * shuffle_partitions,
               min(shuffle_partitions, MAX_ALIGNED_BUCKETS))


def drop_heartbeats(watermarked: DataFrame) -> DataFrame:
    """Remove heartbeats *after* the watermark has seen them.

    A plain ``event_type != 'heartbeat'`` filter does not reference the event-time column, so
    Spark's optimizer pushes it below ``EventTimeWatermark`` (and into the file scan): heartbeats
    would vanish before advancing event time. Referencing ``ts`` keeps the filter above it.
    ``ts`` is never null here (validation rejects such records), so the extra term is inert.

    :param watermarked: the events, with their watermark already defined.
    """
    return watermarked.filter((F.col("event_type") != F.lit("heartbeat")) | F.col("ts").isNull())


def _stateful_input(events: DataFrame) -> DataFrame:
    """Heartbeats out (after the watermark saw them), epoch-ms time alongside ``ts``."""
    return (drop_heartbeats(events)
                  .withColumn("ts_ms", F.unix_millis("ts"))
                  .select(*INPUT_COLUMNS))


def _packed_input(events: DataFrame) -> DataFrame:
    """Heartbeats out; ``user_id``, ``ts``, the event as one JSON column (``PACKED_KEYS``) and
    the times the bucket function decides on (``ts_ms``, and ``goal_ms`` for goals).

    For applyInPandasWithState, which builds pandas columns once per key per micro-batch:
    measured on 100k events keyed by user, one packed column instead of nine halves that cost.
    """
    ts_ms = F.unix_millis("ts")
    packed = F.to_json(F.struct(*((ts_ms if field == "ts_ms" else F.col(field)).alias(key)
                                  for field, key in PACKED_KEYS.items())))
    is_goal = (F.col("event_type") == F.lit("visit")) & F.coalesce(F.col("is_goal"), F.lit(False))
    return drop_heartbeats(events).select(
        "user_id", "ts", packed.alias(PACKED_COLUMN), ts_ms.alias("ts_ms"),
        F.when(is_goal, ts_ms).alias("goal_ms"))


def output_metrics(models: Sequence[str]) -> list[Column]:
    """Aggregates of output rows, per model ``m``: ``goals_m``, the goals it gave rows for, and
    ``attributed_m``, those credited to impressions; and ``revisions`` (rows of a revision
    ``>= 1``, ``sign = +1``) and ``retractions`` (rows of ``sign = -1``) over every model.

    A model gives a goal one row per credited impression, so rows are not goals. But an
    attributed goal's credits sum to 1 (within 1e-9) and an organic goal has one row of credit
    0: the sum of a model's credits, rounded, is its attributed goals, and its organic rows the
    rest. (Observed metrics allow no distinct count.) Each row counts with its ``sign``, so a
    changelog's counts are those of its net table: a retraction takes back what its row added.
    Marker rows (no model, ``sign`` 0) count nowhere.

    :param models: the configured attribution models.
    """
    sign = F.col("sign")
    metrics = []
    for m in models:
        mine = F.col("model") == F.lit(m)
        attributed = F.round(F.coalesce(F.sum(F.when(mine, F.col("credit") * sign)), F.lit(0.0)))
        organic = F.coalesce(F.sum(F.when(mine & F.col("impression_id").isNull(), sign)), F.lit(0))
        metrics += [(attributed.cast("long") + organic.cast("long")).alias(metric_name("goals", m)),
                    attributed.cast("long").alias(metric_name("attributed", m))]
    metrics += [F.count(F.when((sign > 0) & (F.col("revision") > 0), 1)).alias("revisions"),
                F.count(F.when(sign < 0, 1)).alias("retractions")]
    return metrics


def metric_name(what: str, model: str) -> str:
    """The name of a per-model metric of ``output_metrics``: ``goals`` or ``attributed``.

    :param what: ``goals`` or ``attributed``.
    :param model: an attribution model's name.
    """
    return f"{what}_{model}"


def users_counted_by_change(backend: str, state_buckets: Optional[int], tws_state: str) -> bool:
    """True for the layouts whose stateful function reports the change in users it holds
    (``frames.STATE_USERS_CHANGE``): Spark's state row count is then buckets
    (applyInPandasWithState over hash buckets) or state entries (transformWithState's declared
    layout), not users. With one key and one row per user it is the user count itself.

    :param backend: the stateful backend (``BACKENDS``).
    :param state_buckets: the hash buckets of applyInPandasWithState's state, 0 or ``None`` for one
        key per user.
    :param tws_state: transformWithState's state layout, ``compact`` or ``declared``.
    """
    if backend == "applyInPandasWithState":
        return bool(state_buckets)
    return tws_state == "declared"


def _observe_output(rows: DataFrame, models: Sequence[str],
                    users_by_change: bool = False) -> DataFrame:
    """Attach the output metrics; with ``users_by_change``, also sum the marker rows' changes in
    users held (``users_change``) and drop the marker rows."""
    users_change = (F.coalesce(F.sum(STATE_USERS_CHANGE), F.lit(0)) if users_by_change
                    else F.lit(0).cast("long"))
    observed = rows.observe(OUTPUT_METRICS, *output_metrics(models),
                            users_change.alias("users_change"))
    if not users_by_change:
        return observed
    return observed.filter(F.col(STATE_USERS_CHANGE).isNull()).drop(STATE_USERS_CHANGE)


def attribution_stream(events: DataFrame, *, watermark_delay_ms: int,
                       config: AttributionConfig = AttributionConfig(),
                       backend: str = DEFAULT_BACKEND,
                       tws_state: str = DEFAULT_TWS_STATE,
                       state_buckets: Optional[int] = DEFAULT_STATE_BUCKETS,
                       bucket_keys: str = ALIGNED_BUCKET_KEYS) -> DataFrame:
    """The streaming attribution of ``events`` (a streaming DataFrame in the event schema).

    ``tws_state`` picks transformWithState's state layout (see ``transform_with_state``):
    ``compact`` (one value per user, the fast one) or ``declared`` (list states per entry).
    ``state_buckets`` (applyInPandasWithState only) keys the state by that many hash buckets of
    ``user_id``, so one call serves many users (see ``apply_in_pandas.make_bucket_state_function``);
    0 or None keys it by user. Like the shuffle partitions, it is fixed by a query's first run
    and must not change under an existing checkpoint; so is ``bucket_keys`` (one of
    ``BUCKET_KEY_SCHEMES``).

    :param events: a streaming DataFrame in the event schema.
    :param watermark_delay_ms: how far Spark's watermark trails the latest event time, in
        milliseconds (the allowed lateness is added to it).
    :param config: the attribution rules' parameters.
    :param backend: the stateful backend (``BACKENDS``).
    :param tws_state: transformWithState's state layout, ``compact`` or ``declared``.
    :param state_buckets: applyInPandasWithState's hash buckets of ``user_id``; 0 or ``None`` keys
        the state by user.
    :param bucket_keys: how bucket keys are chosen, one of ``BUCKET_KEY_SCHEMES``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if tws_state not in TWS_STATE_LAYOUTS:
        raise ValueError(f"unknown transformWithState state layout {tws_state!r}; choose one of "
                         f"{', '.join(TWS_STATE_LAYOUTS)}")
    if bucket_keys not in BUCKET_KEY_SCHEMES:
        raise ValueError(f"unknown bucket key scheme {bucket_keys!r}; choose one of "
                         f"{', '.join(BUCKET_KEY_SCHEMES)}")
    # Spark's watermark trails the on-time one by the allowed lateness, so that records up to
    # that late reach the stateful function (see ``frames.on_time_watermark``).
    watermarked = events.withWatermark(
        "ts", spark_interval(watermark_delay_ms + config.allowed_lateness_ms))
    users_by_change = users_counted_by_change(backend, state_buckets, tws_state)
    output_type = spark_struct(OUTPUT_SCHEMA)
    if users_by_change:
        output_type = output_type.add(T.StructField(STATE_USERS_CHANGE, T.LongType()))
    if backend == "applyInPandasWithState":
        from pyspark.sql.streaming.state import GroupStateTimeout

        packed = _packed_input(watermarked)
        if state_buckets:
            bucket = F.pmod(F.xxhash64("user_id"), F.lit(int(state_buckets)))
            if bucket_keys == ALIGNED_BUCKET_KEYS:
                table = F.array(*(F.lit(k).cast("long")
                                  for k in aligned_bucket_keys(state_buckets)))
                bucket = F.element_at(table, (bucket + 1).cast("int"))
            grouped = packed.withColumn(BUCKET_COLUMN, bucket).groupBy(BUCKET_COLUMN)
            function = make_bucket_state_function(config)
        else:
            grouped, function = packed.groupBy("user_id"), make_group_state_function(config)
        rows = grouped.applyInPandasWithState(
            function, outputStructType=output_type, stateStructType=STATE_DDL,
            outputMode="append", timeoutConf=GroupStateTimeout.EventTimeTimeout)
    else:
        from .transform_with_state import AttributionProcessor, CompactAttributionProcessor

        processor = (CompactAttributionProcessor if tws_state == "compact"
                     else AttributionProcessor)(config)
        rows = _stateful_input(watermarked).groupBy("user_id").transformWithState(
            processor, outputStructType=output_type,
            outputMode="Append", timeMode="EventTime")
    return _observe_output(rows, config.models, users_by_change)


def attribution_batch(events: DataFrame,
                      config: AttributionConfig = AttributionConfig()) -> DataFrame:
    """Batch mode: the same core per user over the whole input, watermark at +infinity.

    Each user's events are brought together by a hash partitioning and a sort on ``user_id``,
    and a partition at a time goes through the core in Arrow (no pandas frame per user).

    :param events: a batch DataFrame in the event schema.
    :param config: the attribution rules' parameters.
    """
    rows = (_stateful_input(events).repartition("user_id").sortWithinPartitions("user_id")
            .mapInArrow(make_batch_function(config), schema=spark_struct(OUTPUT_SCHEMA)))
    return rows


AVAILABLE_NOW = "available-now"


def trigger_interval_ms(trigger: str, what: str = "trigger") -> "int | None":
    """The processing-time interval of a trigger, in milliseconds; ``None`` for
    ``available-now``. Checked here, before Spark starts, so a bad trigger is one line.

    :param trigger: ``available-now`` or an interval (``"10 seconds"``, as every duration).
    :param what: the option's name, used in the error message.
    :raises ValueError: ``trigger`` is neither (``once`` is named: it runs one micro-batch of
        whatever a source offers and leaves the rest unread, which ``available-now`` does not).
    """
    if trigger == AVAILABLE_NOW:
        return None
    if trigger.strip().lower() == "once":
        raise ValueError(f"{what} 'once' is not supported: use '{AVAILABLE_NOW}', which "
                         "processes everything present in as many micro-batches as the "
                         "per-trigger limits make, then stops")
    try:
        return parse_duration_ms(trigger, what)
    except ValueError as err:
        raise ValueError(f"{err}; or '{AVAILABLE_NOW}' to process what is present and stop") \
            from None


def apply_trigger(writer, trigger: str):
    """Apply a trigger: ``available-now`` or a processing-time interval.

    :param writer: a ``DataStreamWriter``.
    :param trigger: ``available-now`` or a processing-time interval (``"10 seconds"``).
    :raises ValueError: ``trigger`` is neither (``trigger_interval_ms``).
    """
    interval = trigger_interval_ms(trigger)
    if interval is None:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=spark_interval(interval))
