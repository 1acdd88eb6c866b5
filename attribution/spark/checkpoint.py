"""The checkpoint's record of the state layout and the input: written on a query's first run,
checked later; and the number of users its state holds.

Spark refuses some incompatible restarts itself (a changed key type) but not all: under another
bucket count a user hashes to another key, and its state would silently be lost. The options
that shape the state are therefore written into the checkpoint and compared on every start.
So are the attribution models: a model added to a running query would find none of its own
consumption in the state, and credit impressions that it had already credited. So are the input
directory and format: Spark's file source would fail on another directory with a long trace, or
read files of another format as nothing at all.

Every read and write goes through ``storage``, so a checkpoint on any Hadoop file system
(``hdfs://``, ``s3a://``, ``file://``) is pinned and checked as a local one is. Before Spark
starts, a URI cannot be read yet (``storage.available``): the job's check before Spark then
defers to the same check once the session runs.
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple, Optional

import pandas as pd

from joins.durations import format_duration_ms

from ..config import DEFAULT_MODELS, AttributionConfig
from .apply_in_pandas import STATE_COLUMN_FORMAT
from .pipeline import (
    ALIGNED_BUCKET_KEYS,
    DEFAULT_STATE_BUCKETS,
    INDEX_BUCKET_KEYS,
    state_buckets_for,
    users_counted_by_change,
)
from .sources.offset_log import batch_files, log_lines
from .storage import is_uri, location


class CheckpointMismatch(ValueError):
    """The options that shape the state differ from those the checkpoint was started with."""


LAYOUT_FILE = "attribution-state-layout.json"
# The input's entries in LAYOUT_FILE -> the option that sets each: where the events come from
# (a directory, or Kafka topics; one of the two) and their format.
INPUT_KEYS = {"events": "--events", "kafka_topics": "--kafka-topics", "format": "--format"}
_WHERE = ("events", "kafka_topics")


class PinnedState(NamedTuple):
    """How a checkpoint keys applyInPandasWithState's state."""
    state_buckets: int   # the bucket count (0 = one key per user)
    bucket_keys: str     # how bucket numbers become keys (``pipeline.BUCKET_KEY_SCHEMES``)


def shuffle_partitions_of(checkpoint: str) -> Optional[int]:
    """The shuffle partitions a query under a checkpoint runs with: Spark records them in each
    offset-log entry and keeps them on a restart, whatever the session's setting.

    :param checkpoint: the query's checkpoint directory (a path or any Hadoop URI).
    :returns: the count, or ``None`` before the first micro-batch.
    """
    entries = batch_files(location(checkpoint) / "offsets")
    if not entries:
        return None
    for line in log_lines(entries[max(entries)])[:1]:  # the batch's metadata
        value = json.loads(line).get("conf", {}).get("spark.sql.shuffle.partitions")
        return int(value) if value is not None else None
    return None


def needs_shuffle_partitions(checkpoint: str, backend: str,
                             state_buckets: Optional[int]) -> bool:
    """True when ``pin_state_layout`` needs the shuffle partitions: an automatic bucket count
    (``state_buckets`` ``None``) for applyInPandasWithState on a checkpoint that nothing has
    been recorded in yet.

    :param checkpoint: the query's checkpoint directory.
    :param backend: one of ``pipeline.BACKENDS``.
    :param state_buckets: the bucket count asked for; ``None`` for ``--state-buckets auto``.
    """
    root = location(checkpoint)
    return (state_buckets is None and backend == "applyInPandasWithState"
            and not (root / LAYOUT_FILE).exists() and not (root / "offsets").is_dir())


def _chosen_buckets(checkpoint: str, shuffle_partitions: Optional[int]) -> int:
    """applyInPandasWithState's bucket count for ``--state-buckets auto``: the one the
    checkpoint recorded; ``DEFAULT_STATE_BUCKETS`` for a checkpoint that a version before the
    record started; else ``state_buckets_for`` the shuffle partitions."""
    if needs_shuffle_partitions(checkpoint, "applyInPandasWithState", None):
        if shuffle_partitions is None:
            raise ValueError("a new checkpoint's automatic bucket count needs the shuffle "
                             "partitions")
        return state_buckets_for(shuffle_partitions)
    path = location(checkpoint) / LAYOUT_FILE
    if path.exists():
        recorded = json.loads(path.read_text())
        if recorded.get("backend") == "applyInPandasWithState":
            return int(recorded.get("state_buckets", DEFAULT_STATE_BUCKETS))
    # Started by a version before the record, or another backend (refused by the caller in the
    # layout's words).
    return DEFAULT_STATE_BUCKETS


def pin_state_layout(checkpoint: str, backend: str, state_buckets: Optional[int],
                     tws_state: str, config: AttributionConfig = AttributionConfig(), *,
                     events: Optional[str] = None, input_format: Optional[str] = None,
                     kafka_topics: Optional[str] = None,
                     shuffle_partitions: Optional[int] = None) -> PinnedState:
    """Record the state layout (and the input) in the checkpoint on its first run; refuse a
    different one later.

    :param checkpoint: the query's checkpoint directory (a path or any Hadoop URI; a URI needs
        the Spark session running, ``storage.available``).
    :param backend: one of ``pipeline.BACKENDS``.
    :param state_buckets: applyInPandasWithState's bucket count (0 = one key per user);
        ``None`` (``--state-buckets auto``): the checkpoint's, or for a new checkpoint
        ``pipeline.state_buckets_for(shuffle_partitions)``.
    :param tws_state: transformWithState's state layout.
    :param config: the attribution rules; their models, and the half-life when ``time_decay``
        is one of them, are pinned (a layout written before models existed means
        ``last_touch`` alone).
    :param events: the input directory (a path recorded absolute, a URI as it is; ``None``: not
        checked).
    :param input_format: the input format (``None``: not checked).
    :param kafka_topics: the Kafka topics read instead of ``events``, comma-separated (recorded
        sorted; ``None``: not checked). The brokers' address is not recorded: a cluster may move.
    :param shuffle_partitions: the query's shuffle partitions; needed only for ``state_buckets``
        ``None`` with a new local checkpoint.
    :returns: the bucket count, and how bucket numbers become keys for this checkpoint
        (``ALIGNED_BUCKET_KEYS``, or ``INDEX_BUCKET_KEYS`` for checkpoints started before
        aligned keys existed).
    :raises CheckpointMismatch: the checkpoint was started with another layout or input.

    Spark notices a changed key type, but not a changed bucket count: under 128 buckets a user
    hashes to another key than under 64, and its state would silently be lost. The format of
    applyInPandasWithState's state column is pinned too (``STATE_COLUMN_FORMAT``), and so is
    how bucket numbers become keys, which is not an option but the checkpoint's.
    A layout file of a version that did not record the input is accepted with any input, which
    is then recorded.
    """
    bucket_keys = ALIGNED_BUCKET_KEYS
    if state_buckets is None:
        state_buckets = (_chosen_buckets(checkpoint, shuffle_partitions)
                         if backend == "applyInPandasWithState" else 0)
    source = {}
    if events is not None:
        source["events"] = events if is_uri(events) else os.path.realpath(events)
    if kafka_topics is not None:
        source["kafka_topics"] = ",".join(sorted(t.strip() for t in kafka_topics.split(",")
                                                 if t.strip()))
    if input_format is not None:
        source["format"] = input_format
    layout = {"backend": backend}
    if backend == "applyInPandasWithState":
        layout["state_buckets"] = state_buckets
        layout["state_column"] = STATE_COLUMN_FORMAT
        layout["bucket_keys"] = bucket_keys
    else:
        layout["tws_state"] = tws_state
    layout["models"] = list(config.models)
    layout.update(config.model_options())  # what the configured models read (half-life...)
    # Revisions keep other state (open goals) and another Spark watermark; recorded only when
    # on, so that a layout without them means neither.
    if config.allowed_lateness_ms:
        layout["allowed_lateness_ms"] = config.allowed_lateness_ms
    if config.early_results:
        layout["early_results"] = True
    path = location(checkpoint) / LAYOUT_FILE
    if path.exists():
        recorded = json.loads(path.read_text())
        _check_input(checkpoint, recorded, source)
        pinned = {k: v for k, v in recorded.items() if k not in INPUT_KEYS}
        if pinned.get("backend") == "applyInPandasWithState":
            pinned.setdefault("state_column", "binary")  # versions before the text column
            if pinned["state_column"] != STATE_COLUMN_FORMAT:
                raise CheckpointMismatch(
                    f"checkpoint {checkpoint} holds applyInPandasWithState state in the "
                    f"{pinned['state_column']} column of an earlier version of this job, which "
                    f"this version cannot read (it stores {STATE_COLUMN_FORMAT}). Finish that "
                    "query with the version that started it, or start a new --checkpoint (and "
                    "--output).")
            # Checkpoints started before aligned keys hold their users under bucket numbers.
            pinned.setdefault("bucket_keys", INDEX_BUCKET_KEYS)
            bucket_keys = layout["bucket_keys"] = pinned["bucket_keys"]
        pinned.setdefault("models", list(DEFAULT_MODELS))  # versions before models existed
        if pinned != layout:
            differing = [k for k in {**layout, **pinned} if pinned.get(k) != layout.get(k)]
            given, started = _as_options(layout, differing), _as_options(pinned, differing)
            hint = (" (--state-buckets auto, the default, takes the checkpoint's count)"
                    if "state_buckets" in layout
                    and pinned.get("state_buckets") != layout["state_buckets"] else "")
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} was started with {started}; this run asks for "
                f"{given}. Use the original options{hint}, or a new --checkpoint (and "
                "--output).")
        unrecorded = {k: v for k, v in source.items() if k not in recorded}
        if unrecorded:
            path.write_text(json.dumps({**recorded, **unrecorded}) + "\n")
        return PinnedState(state_buckets, bucket_keys)
    path.write_text(json.dumps({**layout, **source}) + "\n")
    return PinnedState(state_buckets, bucket_keys)


# How a pinned setting reads as the option that sets it; a revising setting that is off has no
# entry in the layout file, and reads as its default (the others are absent for other backends).
_AS_OPTION = {
    "backend": lambda v: f"--backend {v}",
    "state_buckets": lambda v: f"--state-buckets {v}",
    "tws_state": lambda v: f"--tws-state {v}",
    "models": lambda v: f"--models {','.join(v)}",
    "half_life_ms": lambda v: f"--half-life '{format_duration_ms(v)}'",
    "allowed_lateness_ms": lambda v: f"--allowed-lateness '{format_duration_ms(v or 0)}'",
    "early_results": lambda v: "--early-results" if v else "no early results",
}
_OFF_WHEN_ABSENT = ("allowed_lateness_ms", "early_results")
# Settings without an option, which follow from the backend and the version that started it.
_NO_OPTION = ("state_column", "bucket_keys")


def _as_options(layout: dict, keys: list) -> str:
    """The settings ``keys`` of a checkpoint layout as the options that give them (a setting
    unknown here, e.g. from a newer version, as ``name=value``)."""
    shown = []
    for k in keys:
        if k in _AS_OPTION and (k in layout or k in _OFF_WHEN_ABSENT):
            shown.append(_AS_OPTION[k](layout.get(k)))
        elif k in layout and k not in _AS_OPTION and k not in _NO_OPTION:
            shown.append(f"{k}={layout[k]}")
    return ", ".join(shown)


def _check_input(checkpoint: str, recorded: dict, source: dict) -> None:
    """Refuse a run whose input (directory or topics, format) is not the one the checkpoint
    was started on; a record or a run that names none is not checked."""
    def given(entries: dict, keys: tuple) -> str:
        return " and ".join(f"{INPUT_KEYS[k]} {entries[k]}" for k in keys if k in entries)

    was, now = given(recorded, _WHERE), given(source, _WHERE)
    if was and now and was != now:
        raise CheckpointMismatch(
            f"checkpoint {checkpoint} was started on {was}; this run reads {now}. A checkpoint "
            f"follows one input: rerun with {was}, or give a new --checkpoint (and --output).")
    was, now = given(recorded, ("format",)), given(source, ("format",))
    if was and now and was != now:
        raise CheckpointMismatch(
            f"checkpoint {checkpoint} was started with {was}; this run asks for {now}. Rerun "
            f"with {was}, or give a new --checkpoint (and --output).")


def committed(checkpoint: str) -> bool:
    """True when a query has committed a micro-batch under a checkpoint.

    :param checkpoint: the checkpoint directory (a path or any Hadoop URI).
    """
    return any(not p.name.startswith(".") for p in (location(checkpoint) / "commits").iterdir())


def state_users_at_start(spark, checkpoint: str, backend: str, state_buckets: int,
                         tws_state: str) -> Optional[int]:
    """How many users the checkpoint's state holds after its last committed micro-batch, for
    the layouts whose progress counts users by change (``pipeline.users_counted_by_change``).

    :param spark: the session that reads the state (Spark's ``statestore`` data source).
    :param checkpoint: the query's checkpoint directory.
    :param backend: one of ``pipeline.BACKENDS``.
    :param state_buckets: the pinned bucket count (0 = one key per user).
    :param tws_state: transformWithState's state layout.
    :returns: 0 for a checkpoint with nothing committed; the count read from the state with
        Spark's state data source otherwise (one Spark job, at start only); ``None`` for the
        other layouts (Spark's own row count is the user count there).
    """
    if not users_counted_by_change(backend, state_buckets, tws_state):
        return None
    if not committed(checkpoint):
        return 0
    from pyspark.sql import functions as F

    # Spark 4.2's RocksDB provider reports snapshot loads to the driver's state store
    # coordinator, which a session registers only once its streaming query manager exists.
    spark.streams  # noqa: B018 - creates the manager (and the coordinator) before the read
    if backend == "transformWithState":  # the declared layout: one "wakeup" value per user
        return (spark.read.format("statestore").option("stateVarName", "wakeup")
                .load(checkpoint).count())
    from .apply_in_pandas import bucket_user_count

    @F.pandas_udf("long")
    def users(states: pd.Series) -> pd.Series:
        return states.map(bucket_user_count)

    states = spark.read.format("statestore").load(checkpoint)
    total = states.select(F.sum(users("value.groupState.state"))).first()[0]
    return int(total or 0)
