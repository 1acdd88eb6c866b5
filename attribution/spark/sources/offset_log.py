"""Reading a streaming query's checkpoint beside Spark (through ``storage``): which
micro-batches it committed, and the offsets of its source at each (what a source's
``committed_input`` starts from).

Spark writes ``offsets/<k>`` before running micro-batch ``k`` (a ``v1`` line, the batch's
metadata as JSON, then one line per source: its end offset as JSON, or ``-`` for none) and
``commits/<k>`` once its output is committed. Each source keeps its own log under
``sources/<i>``.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from ..storage import Location

_BATCH = re.compile(r"^(\d+)(\.compact)?$")  # "7", "9.compact"; not ".7.crc" or temps


def log_lines(path: Location) -> list[str]:
    """The lines of a ``v1`` metadata log file after its version line.

    :param path: one file of a checkpoint log.
    """
    text = path.read_text(encoding="utf-8")
    # Some sources (Kafka's initial offsets) write a zero byte before the version.
    lines = text.lstrip("\x00").split("\n")
    if lines[0] != "v1":
        raise ValueError(f"{path}: unsupported checkpoint log version {lines[0]!r}")
    return lines[1:]


def batch_files(log_dir: Location) -> dict[int, Location]:
    """The files of a checkpoint log by batch id (compact files included).

    :param log_dir: a log directory (``offsets``, ``commits``, ``sources/0``).
    """
    out = {}
    if log_dir.is_dir():
        for entry in log_dir.iterdir():
            match = _BATCH.match(entry.name)
            if match and entry.is_file():
                out[int(match[1])] = entry
    return out


def committed_batches(checkpoint: Location) -> list[int]:
    """The micro-batches the query committed, in order.

    :param checkpoint: the query's checkpoint directory.
    """
    return sorted(batch_files(checkpoint / "commits"))


def batch_offsets(checkpoint: Location, batch_id: int) -> tuple[dict, Optional[dict]]:
    """A micro-batch's metadata (``batchWatermarkMs``, ``batchTimestampMs``...) and the end
    offset of its (only) source, ``None`` when the source had none yet.

    :param checkpoint: the query's checkpoint directory.
    :param batch_id: a micro-batch with an offset log entry.
    """
    lines = [line for line in log_lines(checkpoint / "offsets" / str(batch_id)) if line]
    metadata = json.loads(lines[0])
    source = None if len(lines) < 2 or lines[1] == "-" else json.loads(lines[1])
    return metadata, source


def source_range(checkpoint: Location, batch_id: int) -> tuple[Optional[dict], Optional[dict]]:
    """The source's offsets micro-batch ``batch_id`` read between: the previous micro-batch's
    end offset (``None`` for the first) and its own.

    :param checkpoint: the query's checkpoint directory.
    :param batch_id: a micro-batch with an offset log entry.
    """
    _, end = batch_offsets(checkpoint, batch_id)
    start = batch_offsets(checkpoint, batch_id - 1)[1] if batch_id > 0 else None
    return start, end
