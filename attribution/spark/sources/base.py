"""The interface every event source implements: ``EventSource``, and the raw-record shape it
hands to validation.

A source knows its transport (a directory of files, Kafka topics) and its format (JSON, Parquet,
Avro); validation, the dead letter, the watermark and the late-record audit know neither. What
they need from a source is in the class below, and nothing else.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from ..formats import EventFormat
from ..storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

# The column of a raw record holding its arrival time: the reference of the future-skew rule.
ARRIVAL_COLUMN = "arrival_time"
# The column of a text record (``EventFormat.text``): the record as it arrived.
RAW_RECORD_COLUMN = "raw_record"
# The column of a typed record: null when decoded, else why a part of the input could not be
# (validation dead-letters the row with this reason, every event field null).
READ_ERROR_COLUMN = "read_error"


class EventSource(ABC):
    """Where a job's events come from: one transport in one format.

    **Call order.** A job calls, for one run:

    1. ``check()``, once, before it starts Spark: a problem the user can fix, as one line.
    2. In streaming mode, ``read_stream(spark, limited)`` once per streaming query that reads
       the input (the main query with its per-trigger limit, the dead-letter query without); in
       batch mode, ``read_batch(spark)``, which may be called again for a second pass. Both give
       *raw records*, which go to ``validation.classify`` and nowhere else.
    3. Whenever it audits late records, per committed micro-batch ``k``:
       ``committed_input(checkpoint, k)`` says from the query's checkpoint alone what ``k``
       read (``None``: nothing); ``earliest_ts_ms`` may prove from that alone that none of it
       can be late; otherwise ``read_committed(spark, part)`` reads exactly those records again.
       If that read fails, ``lost_input(error)`` tells a source that no longer holds them
       (Kafka's retention) from any other failure.

    **Raw records.** Every row has the ``origin_fields`` columns (where the record came from:
    the dead letter and the late-record output carry them) and ``ARRIVAL_COLUMN`` (a
    timestamp). A text format's rows have ``RAW_RECORD_COLUMN`` (a string); a typed format's
    rows the event schema's fields and ``READ_ERROR_COLUMN``.

    **Guarantees a source gives.** The same committed micro-batch reads the same records, with
    the same origin and arrival time, every time: the main query, the dead-letter query, a
    rerun and the audit then judge every record alike, so each lands in exactly one of the
    output and the dead letter. The arrival time is fixed when the record is written to the
    source (a file's modification time, a Kafka record's timestamp), never the time of reading.
    """

    #: ``(name, Avro type)`` fields in the Avro schema style of ``attribution.schema``: the
    #: columns that name a record's origin, in the raw records, the dead letter and the
    #: late-record output.
    origin_fields: ClassVar[tuple[dict, ...]]
    #: The arrival time as the future-skew rule's reason names it: "its file's modification
    #: time".
    arrival: ClassVar[str]

    def __init__(self, fmt: EventFormat):
        """:param fmt: the format of the records (of the files, or of each Kafka value)."""
        self.format = fmt

    @property
    def origin_columns(self) -> tuple[str, ...]:
        """The names of ``origin_fields``."""
        return tuple(f["name"] for f in self.origin_fields)

    def check(self) -> Optional[str]:
        """Why the input cannot be read as configured, in one line, or ``None``. Called before
        Spark starts, so it may not use Spark; the default finds nothing."""
        return None

    @abstractmethod
    def read_stream(self, spark: "SparkSession", limited: bool = True) -> "DataFrame":
        """The input as a stream of raw records.

        :param spark: the session.
        :param limited: apply the source's per-micro-batch limit (files or offsets per
            trigger), when it has one; a query with no watermark to step takes everything new.
        """

    @abstractmethod
    def read_batch(self, spark: "SparkSession") -> "DataFrame":
        """The whole input, read once, as a batch of raw records.

        :param spark: the session.
        """

    @abstractmethod
    def committed_input(self, checkpoint: Location, batch_id: int) -> Optional[Any]:
        """What micro-batch ``batch_id`` of the query checkpointed at ``checkpoint`` read, as a
        value ``read_committed`` and ``earliest_ts_ms`` take (its files, its offset ranges);
        ``None`` when it read nothing (a micro-batch that only fired timers).

        :param checkpoint: the query's checkpoint directory (``storage.location``: a path or
            any Hadoop URI); the source is its first (only) source, ``sources/0``.
        :param batch_id: a micro-batch the query committed.
        """

    @abstractmethod
    def read_committed(self, spark: "SparkSession", part: Any) -> "DataFrame":
        """The raw records of ``part`` (from ``committed_input``), as ``read_stream`` gave them.

        :param spark: the session.
        :param part: what a committed micro-batch read.
        """

    def earliest_ts_ms(self, part: Any) -> Optional[float]:
        """The earliest event time of ``part`` in epoch milliseconds if it can be known without
        reading its records (+infinity when it holds none), else ``None``: the default.

        :param part: what a committed micro-batch read (``committed_input``).
        """
        return None

    def lost_input(self, error: BaseException) -> Optional[str]:
        """When re-reading a committed micro-batch failed because the source no longer holds
        its records, why, in one line; ``None`` for any other failure, which the caller lets
        through. The default: ``None`` (a source that keeps what it delivered).

        :param error: what ``read_committed`` or reading its result raised.
        """
        return None

    def leave_out(self, error: BaseException, checkpoint: Optional[str] = None) -> Optional[str]:
        """When ``error`` is Spark failing to decode a part of the input that the source can
        leave out of every later read (and hand to the dead letter by itself,
        ``unreadable_dead_letters``), leave it out and say so in one line; otherwise ``None``,
        the default (the caller lets the error through).

        :param error: what a query or a batch read raised.
        :param checkpoint: the query's local checkpoint, where what is left out is recorded for
            later runs (``restore_left_out``); ``None``: for this run only.
        """
        return None

    def restore_left_out(self, checkpoint: str) -> None:
        """Leave out again what ``leave_out`` recorded in ``checkpoint``; the default: nothing.

        :param checkpoint: the query's local checkpoint.
        """

    def left_out_parts(self) -> list:
        """What ``leave_out`` left out, as ``unreadable_dead_letters`` takes it (the files);
        empty by default."""
        return []

    def unreadable_dead_letters(self, part: Any) -> Optional["pa.Table"]:
        """The dead letters (``raw_record``, ``reason`` and the origin columns) of what
        ``leave_out`` left out of ``part`` (from ``committed_input``, or the whole input's
        files in batch mode); ``None`` when nothing was, the default.

        :param part: what a micro-batch read.
        """
        return None

    def describe(self) -> str:
        """The input as a report names it, e.g. ``JSON lines files in /data/events``."""
        return f"{self.format.label} from {type(self).__name__}"
