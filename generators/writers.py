"""Rendering generated events into spec files: JSON lines, Parquet and Avro, written atomically.

Events arrive here as integer columns (``behaviour.EventColumns``) plus a ``Vocabulary`` of the
few distinct strings (URLs, user ids, campaigns). Rendering is vectorised: Arrow ``take`` for
Parquet, pre-escaped JSON tokens indexed by numpy for JSON lines. The files match what
``attribution.spark.files`` writes and reads: the Avro ``EVENT_SCHEMA``, microsecond UTC
timestamps in Parquet, ISO-8601 ``...sssZ`` strings in JSON with null fields present as ``null``.

Every file is written under a hidden temporary name and renamed into place, so a file stream
never sees a partial file. Output is byte-for-byte reproducible: fixed Parquet options and an
Avro sync marker derived from the seed and file name instead of random bytes.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Callable, Optional

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from attribution.schema import EVENT_FIELDS, EVENT_SCHEMA, EVENT_TYPES
from attribution.spark.formats import FORMATS
from attribution.spark.types import arrow_schema

from .behaviour import VISIT, EventColumns

EXTENSIONS = {"json": ".json", "parquet": ".parquet", "avro": ".avro"}
EVENT_ID_PREFIX = "ev-"
HEARTBEAT_ID_PREFIX = "hb-"
ID_DIGITS = 12
_ARROW_SCHEMA = arrow_schema(EVENT_SCHEMA)
# Pinned so that a newer pyarrow default does not silently change the bytes. Dictionary
# encoding only for the columns with few distinct values: trying it on the unique event ids and
# timestamps cost a quarter of the writing time and made the files 16% larger.
PARQUET_OPTIONS = dict(version="2.6", compression="snappy",
                       use_dictionary=["user_id", "event_type", "url", "referer", "source_url",
                                       "target_url", "campaign"],
                       write_statistics=True, data_page_version="1.0", store_schema=True)
_JSON_LINE = ('{{"event_id": "{}", "user_id": {}, "event_type": "{}", "ts": "{}Z", "url": {}, '
              '"referer": {}, "is_goal": {}, "impression_id": {}, "source_url": {}, '
              '"target_url": {}, "campaign": {}, "value": {}}}\n')
_GOAL_TOKENS = np.array(["false", "true", "null"], dtype=object)
_TYPE_NAMES = np.array(list(EVENT_TYPES), dtype=object)  # visit=0, impression=1, heartbeat=2


def part_name(index: int, fmt: str) -> str:
    """``part-00000.json`` and so on; name order is arrival order.

    :param index: the file's position in arrival order.
    :param fmt: the file format, one of ``FORMATS``.
    """
    return f"part-{index:05d}{EXTENSIONS[fmt]}"


class Vocabulary:
    """The distinct strings events index into, with their Arrow and JSON renderings cached."""

    def __init__(self, urls: list[str], user_ids: list[str], campaigns: list[str]):
        """Keep the strings and build their Arrow arrays once.

        :param urls: the site's URLs.
        :param user_ids: the user ids.
        :param campaigns: the campaign names.
        """
        self.urls = urls
        self.user_ids = user_ids
        self.campaigns = campaigns
        # A trailing null entry: index NULL (-1) is remapped to it, which is cheaper than a mask.
        self._urls_arrow = string_array(urls + [None])
        self._users_arrow = string_array(user_ids + [None])
        self._campaigns_arrow = string_array(campaigns + [None])
        self._tokens: dict[str, np.ndarray] = {}

    def _json_tokens(self, name: str) -> np.ndarray:
        if name not in self._tokens:
            self._tokens[name] = np.array([json.dumps(v) for v in getattr(self, name)] + ["null"],
                                          dtype=object)
        return self._tokens[name]

    def url_tokens(self) -> np.ndarray:
        """JSON tokens of the URLs; index -1 (``NULL``) lands on the trailing ``null``."""
        return self._json_tokens("urls")

    def user_tokens(self) -> np.ndarray:
        return self._json_tokens("user_ids")

    def campaign_tokens(self) -> np.ndarray:
        return self._json_tokens("campaigns")

    def urls_at(self, index: np.ndarray) -> pa.Array:
        """The URLs at ``index`` as an Arrow array (index -1 is null).

        :param index: indexes into ``urls``.
        """
        return _take(self._urls_arrow, np.where(index < 0, len(self.urls), index))

    def users_at(self, index: np.ndarray) -> pa.Array:
        """The user ids at ``index`` as an Arrow array (index -1 is null).

        :param index: indexes into ``user_ids``.
        """
        return _take(self._users_arrow, np.where(index < 0, len(self.user_ids), index))

    def campaigns_at(self, index: np.ndarray) -> pa.Array:
        """The campaigns at ``index`` as an Arrow array (index -1 is null).

        :param index: indexes into ``campaigns``.
        """
        return _take(self._campaigns_arrow, np.where(index < 0, len(self.campaigns), index))


# Arrow arrays here are built from their buffers: ``pa.array`` (on a list or a numpy array)
# imports pandas to look for pandas objects, a quarter of a second that a run which never
# touches pandas should not pay.

def _validity(valid: Optional[np.ndarray]) -> tuple[Optional[pa.Buffer], int]:
    """Arrow's validity bitmap and null count for a boolean mask (``None``: all valid)."""
    if valid is None or valid.all():
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()), int((~valid).sum())


def numpy_array(values: np.ndarray, type: pa.DataType,
                valid: Optional[np.ndarray] = None) -> pa.Array:
    """A fixed-width Arrow array (integers, timestamps, booleans) over numpy ``values``.

    :param values: the values; booleans for ``pa.bool_()``, else of the type's width.
    :param type: the Arrow type.
    :param valid: which entries are not null (``None``: all).
    """
    bitmap, nulls = _validity(valid)
    if pa.types.is_boolean(type):
        data = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    else:
        data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(type, len(values), [bitmap, pa.py_buffer(data.tobytes())],
                                 null_count=nulls)


def string_array(values: list[Optional[str]]) -> pa.Array:
    """An Arrow string array of ``values`` (``None`` is null).

    :param values: the strings, ``None`` for null.
    """
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    bitmap, nulls = _validity(np.array([v is not None for v in values], dtype=bool))
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(b"".join(encoded)), bitmap, nulls)


_TYPE_NAMES_ARROW = string_array(list(EVENT_TYPES))


def _take(values: pa.Array, index: np.ndarray) -> pa.Array:
    return pc.take(values, numpy_array(index.astype(np.int64), pa.int64()))


def id_array(seq: np.ndarray, prefix: str = EVENT_ID_PREFIX) -> pa.Array:
    """Fixed-width ids such as ``ev-000000000042``, built as raw bytes (no Python loop).

    Fixed width makes string order equal number order, so generation order breaks ts ties.

    :param seq: the events' sequence numbers.
    :param prefix: the text before the number.
    """
    seq = np.asarray(seq, dtype=np.int64)
    if len(seq) and (seq.min() < 0 or seq.max() >= 10 ** ID_DIGITS):
        raise ValueError(f"event numbers must lie in [0, 1e{ID_DIGITS})")
    head = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    width = len(head) + ID_DIGITS
    buf = np.empty((len(seq), width), dtype=np.uint8)
    buf[:, : len(head)] = head
    rest = seq.copy()
    for column in range(width - 1, len(head) - 1, -1):
        rest, digit = np.divmod(rest, 10)
        buf[:, column] = digit + ord("0")
    if len(seq) * width >= 2 ** 31:
        raise ValueError("too many events for one file; use more --files")
    offsets = np.arange(len(seq) + 1, dtype=np.int32) * width
    return pa.StringArray.from_buffers(len(seq), pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(buf.tobytes()))


def to_arrow(events: EventColumns, vocab: Vocabulary) -> pa.Table:
    """Events as an Arrow table in the event schema (timestamps in microseconds, UTC).

    :param events: the events' columns.
    :param vocab: the strings the columns index into.
    """
    visit = events.kind == VISIT
    columns = {
        "event_id": id_array(events.seq),
        "user_id": vocab.users_at(events.user),
        "event_type": _take(_TYPE_NAMES_ARROW, events.kind),
        "ts": numpy_array(events.ts * 1000, _ARROW_SCHEMA.field("ts").type),
        "url": vocab.urls_at(events.url),
        "referer": vocab.urls_at(events.referer),
        "is_goal": numpy_array(events.is_goal, pa.bool_(), valid=visit),
        "impression_id": numpy_array(events.impression_id.astype(np.int64), pa.int64(),
                                     valid=events.impression_id >= 0),
        "source_url": vocab.urls_at(events.source),
        "target_url": vocab.urls_at(events.target),
        "campaign": vocab.campaigns_at(events.campaign),
        "value": numpy_array(events.value, pa.float64(), valid=~np.isnan(events.value)),
    }
    return pa.Table.from_arrays([columns[name] for name in EVENT_FIELDS], schema=_ARROW_SCHEMA)


def heartbeat_record(ts_ms: int, seq: int) -> dict:
    """The trailing heartbeat: an id and a time, every other field null.

    :param ts_ms: the heartbeat's event time, in epoch milliseconds.
    :param seq: the sequence number its id is made of.
    """
    record = {name: None for name in EVENT_FIELDS}
    record.update(event_id=f"{HEARTBEAT_ID_PREFIX}{seq:0{ID_DIGITS}d}", event_type="heartbeat",
                  ts=ts_ms)
    return record


def _heartbeat_table(record: dict) -> pa.Table:
    """The one-row table of a heartbeat record: strings and a time, every other field null."""
    columns = []
    for field in _ARROW_SCHEMA:
        value = record[field.name]
        if value is None:
            columns.append(pa.nulls(1, field.type))
        elif pa.types.is_timestamp(field.type):
            columns.append(numpy_array(np.array([value * 1000], dtype=np.int64), field.type))
        else:
            columns.append(string_array([value]))
    return pa.Table.from_arrays(columns, schema=_ARROW_SCHEMA)


def json_lines(events: EventColumns, vocab: Vocabulary) -> str:
    """Events as JSON lines, each line equal to ``json.dumps`` of the record.

    :param events: the events' columns.
    :param vocab: the strings the columns index into.
    """
    goal = np.where(events.kind == VISIT, events.is_goal.astype(np.int64), 2)
    impression = np.where(events.impression_id < 0, "null",
                          events.impression_id.astype(str)).tolist()
    urls = vocab.url_tokens()
    iso = np.datetime_as_string(events.ts.astype("datetime64[ms]"), unit="ms").tolist()
    return "".join(map(
        _JSON_LINE.format,
        id_array(events.seq).to_pylist(), vocab.user_tokens()[events.user].tolist(),
        _TYPE_NAMES[events.kind].tolist(), iso, urls[events.url].tolist(),
        urls[events.referer].tolist(), _GOAL_TOKENS[goal].tolist(), impression,
        urls[events.source].tolist(), urls[events.target].tolist(),
        vocab.campaign_tokens()[events.campaign].tolist(), map(_json_number, _values(events))))


def _values(events: EventColumns) -> list:
    """The ``value`` column as Python floats, ``None`` for none."""
    return [None if v != v else v for v in events.value.tolist()]


def _json_number(value: Optional[float]) -> str:
    return "null" if value is None else repr(value)


def avro_records(events: EventColumns, vocab: Vocabulary) -> list[dict]:
    """Events as dicts for fastavro (``ts`` as epoch milliseconds, nulls as ``None``).

    :param events: the events' columns.
    :param vocab: the strings the columns index into.
    """
    urls = np.array(vocab.urls + [None], dtype=object)
    users = np.array(vocab.user_ids + [None], dtype=object)
    campaigns = np.array(vocab.campaigns + [None], dtype=object)
    visit = events.kind == VISIT
    goal = np.where(visit, events.is_goal, None).tolist()
    impression = np.where(events.impression_id < 0, None, events.impression_id).tolist()
    columns = (id_array(events.seq).to_pylist(), users[events.user].tolist(),
               _TYPE_NAMES[events.kind].tolist(), events.ts.tolist(), urls[events.url].tolist(),
               urls[events.referer].tolist(), goal, impression, urls[events.source].tolist(),
               urls[events.target].tolist(), campaigns[events.campaign].tolist(), _values(events))
    return [dict(zip(EVENT_FIELDS, values)) for values in zip(*columns)]


def sync_marker(seed: int, name: str) -> bytes:
    """A reproducible Avro sync marker (fastavro would otherwise use random bytes).

    :param seed: the generator's seed.
    :param name: the file's name.
    """
    return hashlib.sha256(f"streamgen:{seed}:{name}".encode()).digest()[:16]


def atomic_write(path: Path, write: Callable[[Path], None], mtime_ns: Optional[int] = None) -> None:
    """Write ``path`` via a hidden temporary file in the same directory, then rename it.

    Readers that skip hidden files (Spark, ``attribution.spark.files``) never see a partial
    file, and the rename is atomic on one filesystem. ``mtime_ns`` sets the modification time first:
    Spark's file source orders new files by it.

    :param path: the file to write.
    :param write: writes the content to the path it is given (the temporary file).
    :param mtime_ns: the modification time to set, in nanoseconds; ``None`` leaves it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def heartbeat_json(heartbeat: dict) -> str:
    """A heartbeat record as its JSON line (no newline), ``ts`` as in the event files.

    :param heartbeat: the heartbeat record (``heartbeat_record``).
    """
    from attribution.events import ms_to_iso

    return json.dumps({**heartbeat, "ts": ms_to_iso(heartbeat["ts"])})


@functools.lru_cache(maxsize=1)
def _parsed_event_schema():
    return fastavro.parse_schema(EVENT_SCHEMA)


def avro_value(record: dict) -> bytes:
    """One record as Avro binary in the event schema, without a container file's header: the
    value of a Kafka record, read with the same schema.

    :param record: the record, as ``avro_records`` or ``heartbeat_record`` gives it.
    """
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, _parsed_event_schema(), record)
    return buffer.getvalue()


def record_values(fmt: str, events: Optional[EventColumns], vocab: Vocabulary,
                  heartbeat: Optional[dict] = None) -> list[tuple[str, bytes]]:
    """Events (or one heartbeat) as ``(key, value)`` pairs of Kafka records: the key is the
    user id (a heartbeat, which has none, its event id); the value one event, exactly a line of
    the JSON file or a record of the Avro file that ``write_events_file`` writes.

    :param fmt: ``json`` or ``avro`` (``TOPIC_FORMATS``).
    :param events: the events, in arrival order (ignored with ``heartbeat``).
    :param vocab: the strings they index into.
    :param heartbeat: a ``heartbeat_record`` to render instead.
    """
    if heartbeat is not None:
        value = (heartbeat_json(heartbeat).encode() if fmt == "json"
                 else avro_value(heartbeat))
        return [(heartbeat["event_id"], value)]
    keys = np.array(vocab.user_ids, dtype=object)[events.user].tolist()
    if fmt == "json":
        values = [line.encode() for line in json_lines(events, vocab).splitlines()]
    elif fmt == "avro":
        values = [avro_value(r) for r in avro_records(events, vocab)]
    else:
        raise ValueError(f"a Kafka record holds one event as json or avro, not {fmt!r}")
    return list(zip(keys, values))


def file_record_values(path: Path, fmt: str) -> list[tuple[str, bytes]]:
    """The records of an event file as ``(key, value)`` pairs of Kafka records, in file order
    (as ``record_values``: keyed by user id, a heartbeat by its event id).

    :param path: a JSON-lines or Avro event file this module wrote.
    :param fmt: its format.
    """
    pairs = []
    if fmt == "json":
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            pairs.append((record["user_id"] or record["event_id"], line.encode()))
    elif fmt == "avro":
        with open(path, "rb") as fh:
            for record in fastavro.reader(fh):
                pairs.append((record["user_id"] or record["event_id"], avro_value(record)))
    else:
        raise ValueError(f"a Kafka record holds one event as json or avro, not {fmt!r}")
    return pairs


def write_events_file(path: Path, fmt: str, events: Optional[EventColumns], vocab: Vocabulary,
                      seed: int, heartbeat: Optional[dict] = None,
                      mtime_ns: Optional[int] = None) -> int:
    """Write one event file (or, with ``heartbeat``, a heartbeat file); return its record count.

    :param path: the file to write.
    :param fmt: the file format, one of ``FORMATS``.
    :param events: the events' columns; ``None`` with ``heartbeat``.
    :param vocab: the strings the columns index into.
    :param seed: the generator's seed (it makes Avro's sync marker reproducible).
    :param heartbeat: a heartbeat record to write instead of events.
    :param mtime_ns: the modification time to set, in nanoseconds; ``None`` leaves it.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    path = Path(path)
    if fmt == "json":
        if heartbeat is not None:
            text = heartbeat_json(heartbeat) + "\n"
        else:
            text = json_lines(events, vocab)
        atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"), mtime_ns)
    elif fmt == "parquet":
        if heartbeat is not None:
            table = _heartbeat_table(heartbeat)
        else:
            table = to_arrow(events, vocab)
        atomic_write(path, lambda p: pq.write_table(table, p, **PARQUET_OPTIONS), mtime_ns)
    else:
        records = [heartbeat] if heartbeat is not None else avro_records(events, vocab)

        def write_avro(p: Path) -> None:
            with open(p, "wb") as fh:
                fastavro.writer(fh, EVENT_SCHEMA, records, sync_marker=sync_marker(seed, path.name))

        atomic_write(path, write_avro, mtime_ns)
    return 1 if heartbeat is not None else len(events)
