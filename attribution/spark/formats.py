"""The event formats, one table: each format's name, its file extensions and whether its records
are text to parse (JSON) or typed rows (Parquet, Avro).

Every other list of formats derives from ``EVENT_FORMATS``: the jobs' and the generator's
``--format`` choices, the file readers with and without Spark (``sources.files``, ``files``), the
Kafka source's value encodings (``sources.kafka``). It imports nothing beyond the standard
library, so programs that never start Spark (the generator, its CLI) can use it for free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .storage import available, location


@dataclass(frozen=True)
class EventFormat:
    """One event format.

    :param name: the ``--format`` value.
    :param label: how help texts and errors name it.
    :param extensions: the file name endings of its files; only files with one of them are
        input, so a README or a ``_SUCCESS`` marker next to the data does not turn into
        all-null rows.
    :param text: True when a record is text to parse (JSON lines; a line that is not JSON still
        reaches the dead letter verbatim), False when the reader hands typed rows.
    """

    name: str
    label: str
    extensions: tuple[str, ...]
    text: bool

    @property
    def glob(self) -> str:
        """Hadoop's glob of this format's file names: ``*.parquet``, ``*.{json,jsonl}``."""
        if len(self.extensions) == 1:
            return "*" + self.extensions[0]
        return "*.{" + ",".join(e.lstrip(".") for e in self.extensions) + "}"


EVENT_FORMATS = {f.name: f for f in (
    EventFormat("json", "JSON lines", (".json", ".jsonl"), text=True),
    EventFormat("parquet", "Parquet", (".parquet",), text=False),
    EventFormat("avro", "Avro", (".avro",), text=False),
)}
FORMATS = tuple(EVENT_FORMATS)


def event_format(name: str) -> EventFormat:
    """The format called ``name``; ``ValueError`` naming the valid ones otherwise.

    :param name: a ``--format`` value.
    """
    try:
        return EVENT_FORMATS[name]
    except KeyError:
        raise ValueError(f"unsupported input format {name!r}; expected one of "
                         f"{', '.join(FORMATS)}") from None


def format_of(path: Union[str, os.PathLike]) -> Optional[str]:
    """The format a file's name implies, or ``None`` for other files.

    :param path: a file path; only its name's ending counts.
    """
    name = Path(path).name.lower()
    for fmt in EVENT_FORMATS.values():
        if name.endswith(fmt.extensions):
            return fmt.name
    return None


def format_mismatch(events_dir: str, fmt: str) -> Optional[str]:
    """Why ``events_dir`` cannot be ``fmt`` input, when it holds files of another format and
    none of ``fmt`` (a run would silently read nothing); ``None`` otherwise.

    :param events_dir: the input directory, a path or any Hadoop URI (``storage``; a URI
        before Spark starts is not listed: ``None``).
    :param fmt: the chosen input format, a key of ``EVENT_FORMATS``.

    Names starting with ``_`` or ``.`` are skipped, as Spark skips them. The listing stops at
    the first file of the chosen format, so a large directory of right files costs little.
    """
    if not available(events_dir):
        return None
    found = dict.fromkeys(EVENT_FORMATS, 0)
    pending = [location(events_dir)]
    while pending:
        for entry in pending.pop().iterdir():
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir():
                pending.append(entry)
                continue
            other = format_of(entry.name)
            if other == fmt:
                return None
            if other is not None:
                found[other] += 1
    others = [(n, other) for other, n in found.items() if n]
    if not others:
        return None
    count, other = max(others)
    return (f"--format {fmt} but {events_dir} holds {count} "
            f"{'/'.join(EVENT_FORMATS[other].extensions)} file{'s' if count > 1 else ''} and no "
            f"{'/'.join(EVENT_FORMATS[fmt].extensions)} file; use --format {other}")
