"""The checkpoint's record of the state layout: written on a query's first run, checked later.

Spark refuses some incompatible restarts itself (a changed key type) but not all: under another
bucket count a user hashes to another key, and its state would silently be lost. The options
that shape the state are therefore written into the checkpoint and compared on every start.
So are the attribution models: a model added to a running query would find none of its own
consumption in the state, and credit impressions that it had already credited.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config import DEFAULT_MODELS, AttributionConfig
from .apply_in_pandas import STATE_COLUMN_FORMAT
from .pipeline import ALIGNED_BUCKET_KEYS, INDEX_BUCKET_KEYS


class CheckpointMismatch(ValueError):
    """The options that shape the state differ from those the checkpoint was started with."""


LAYOUT_FILE = "attribution-state-layout.json"


def pin_state_layout(checkpoint: str, backend: str, state_buckets: int, tws_state: str,
                     config: AttributionConfig = AttributionConfig()) -> str:
    """Record the state layout in the checkpoint on its first run; refuse a different one later.

    :param checkpoint: the query's checkpoint directory.
    :param backend: one of ``pipeline.BACKENDS``.
    :param state_buckets: applyInPandasWithState's bucket count (0 = one key per user).
    :param tws_state: transformWithState's state layout.
    :param config: the attribution rules; their models, and the half-life when ``time_decay``
        is one of them, are pinned (a layout written before models existed means
        ``last_touch`` alone).
    :returns: how bucket numbers become keys for this checkpoint (``ALIGNED_BUCKET_KEYS``, or
        ``INDEX_BUCKET_KEYS`` for checkpoints started before aligned keys existed).
    :raises CheckpointMismatch: the checkpoint was started with another layout.

    Spark notices a changed key type, but not a changed bucket count: under 128 buckets a user
    hashes to another key than under 64, and its state would silently be lost. The format of
    applyInPandasWithState's state column is pinned too (``STATE_COLUMN_FORMAT``), and so is how
    bucket numbers become keys, which is not an option but the checkpoint's.
    (Remote checkpoints, e.g. ``hdfs://``, are not checked; they get "aligned" keys.)
    """
    bucket_keys = ALIGNED_BUCKET_KEYS
    if "://" in checkpoint:
        return bucket_keys
    layout = {"backend": backend}
    if backend == "applyInPandasWithState":
        layout["state_buckets"] = state_buckets
        layout["state_column"] = STATE_COLUMN_FORMAT
        layout["bucket_keys"] = bucket_keys
    else:
        layout["tws_state"] = tws_state
    layout["models"] = list(config.models)
    if "time_decay" in config.models:
        layout["half_life_ms"] = config.half_life_ms
    path = Path(checkpoint) / LAYOUT_FILE
    if path.exists():
        pinned = json.loads(path.read_text())
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
            given = ", ".join(f"{k}={_text(v)}" for k, v in layout.items())
            started = ", ".join(f"{k}={_text(v)}" for k, v in pinned.items())
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} was started with {started}; this run asks for "
                f"{given}. Use the original options, or a new --checkpoint (and --output).")
        return bucket_keys
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(layout) + "\n")
    return bucket_keys


def _text(value) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)
