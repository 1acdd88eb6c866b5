"""The generator as a Spark source (Python Data Source API):
``spark.readStream.format("streamgen")``.

Register once per session with ``register(spark)``, then::

    spark.readStream.format("streamgen")
         .option("rowsPerSecond", 5000)      # wall-clock admission; 0 = as fast as asked
         .option("maxRowsPerBatch", 10000)   # cap per micro-batch; 0 = no cap
         .option("totalRows", 1000000)       # end of the stream; 0 = endless
         .option("disorder", "bounded").option("max_delay", "30 seconds")
         .load()

Every ``GeneratorParams`` field is an option too (``seed``, ``users``, ``disorder``,
``max_delay``, ``late_fraction``, ``redelivery_rate``, ...; case, dashes and underscores do not
matter). Offsets are stream positions, ``{"segment", "row", "events"}``, counted in records,
never in time: the records between two offsets are a pure function of the options, so a query
restarted from its checkpoint replays exactly the records it would have read uninterrupted.
Wall-clock time only decides where micro-batches are cut. ``spark.read.format("streamgen")``
reads the first ``totalRows`` records as a batch.
"""
from __future__ import annotations

import time
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from attribution.schema import EVENT_SCHEMA
from attribution.spark.types import arrow_schema, spark_struct

from .params import GeneratorParams
from .stream import Position, stream_for
from .writers import to_arrow

SOURCE_NAME = "streamgen"
# Options of the source itself; every other option must name a GeneratorParams field.
SOURCE_OPTIONS = {"rowspersecond": 1000, "maxrowsperbatch": 0, "totalrows": 0,
                  "numpartitions": 2}
_ARROW_BATCH_ROWS = 8_192
_SPARK_ARROW_SCHEMA = pa.schema([f.with_nullable(True) for f in arrow_schema(EVENT_SCHEMA)])


def register(spark) -> str:
    """Register the source with a session.

    :param spark: the ``SparkSession`` to register it with.
    :returns: its format name, ``streamgen``.
    """
    spark.dataSource.register(SyntheticEventSource)
    return SOURCE_NAME


def _parse_options(options) -> tuple[GeneratorParams, dict]:
    """Split reader options into generator params and the source's own settings."""
    source = dict(SOURCE_OPTIONS)
    generator = {}
    for key, value in dict(options).items():
        name = str(key).replace("_", "").replace("-", "").lower()
        if name in SOURCE_OPTIONS:
            try:
                source[name] = int(value)
            except ValueError:
                raise ValueError(f"{SOURCE_NAME} option {key}: expected an integer, got "
                                 f"{value!r}") from None
            if source[name] < 0:
                raise ValueError(f"{SOURCE_NAME} option {key} must be non-negative")
        elif name == "path":
            continue
        else:
            generator[key] = value
    params = GeneratorParams.from_options(generator)
    known = {f.replace("_", "") for f in params.to_dict()}
    unknown = [k for k in generator
               if str(k).replace("_", "").replace("-", "").lower() not in known]
    if unknown:
        raise ValueError(f"unknown {SOURCE_NAME} option(s): {', '.join(sorted(unknown))}; "
                         f"source options: rowsPerSecond, maxRowsPerBatch, totalRows, "
                         f"numPartitions; generator options: {', '.join(sorted(params.to_dict()))}")
    if source["numpartitions"] < 1:
        raise ValueError(f"{SOURCE_NAME} option numPartitions must be at least 1")
    return params, source


class SyntheticEventSource(DataSource):
    """Synthetic, disordered spec events from ``generators.stream``."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``streamgen``."""
        return SOURCE_NAME

    def schema(self):
        """The spec's event schema."""
        return spark_struct(EVENT_SCHEMA)

    def streamReader(self, schema) -> "SyntheticEventStreamReader":
        """A streaming reader for this source's options.

        :param schema: the schema Spark resolved (always ``schema()``'s).
        :raises ValueError: an option is unknown or out of range.
        """
        return SyntheticEventStreamReader(self.options)

    def reader(self, schema) -> "SyntheticEventBatchReader":
        """A batch reader for this source's options.

        :param schema: the schema Spark resolved (always ``schema()``'s).
        :raises ValueError: an option is unknown or out of range.
        """
        return SyntheticEventBatchReader(self.options)


class RangePartition(InputPartition):
    """A slice of the stream.

    :param pieces: ``(segment, row_from, row_to)`` ranges, ``row_to`` excluded.
    """

    def __init__(self, pieces: list[tuple[int, int, int]]):
        super().__init__(pieces)
        self.pieces = pieces


def _split(pieces: list[tuple[int, int, int]], parts: int) -> list[RangePartition]:
    """Cut pieces into about ``parts`` partitions of similar row counts."""
    total = sum(hi - lo for _, lo, hi in pieces)
    if not total:
        return []
    quota = -(-total // parts)
    out, current, room = [], [], quota
    for segment, lo, hi in pieces:
        while lo < hi:
            take = min(room, hi - lo)
            current.append((segment, lo, lo + take))
            lo += take
            room -= take
            if room == 0:
                out.append(RangePartition(current))
                current, room = [], quota
    if current:
        out.append(RangePartition(current))
    return out


def _read(params: GeneratorParams, partition: RangePartition) -> Iterator:
    stream = stream_for(params)
    for segment, lo, hi in partition.pieces:
        table = to_arrow(stream.segment(segment).take(np.arange(lo, hi)), stream.vocab)
        # Spark's schema marks every column nullable and insists the batches say the same.
        yield from table.cast(_SPARK_ARROW_SCHEMA).to_batches(max_chunksize=_ARROW_BATCH_ROWS)


class SyntheticEventStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are stream positions; see the module docstring.

    :param options: the reader's options: the source's own (``rowsPerSecond``,
        ``maxRowsPerBatch``, ``totalRows``, ``numPartitions``) and ``GeneratorParams`` fields.
    :raises ValueError: an option is unknown or out of range, or the stream would be endless
        and unthrottled.
    """

    def __init__(self, options):
        self.params, settings = _parse_options(options)
        self.rows_per_second = settings["rowspersecond"]
        self.max_rows_per_batch = settings["maxrowsperbatch"]
        self.total_rows = settings["totalrows"]
        self.num_partitions = settings["numpartitions"]
        if not self.rows_per_second and not self.total_rows:
            raise ValueError(f"{SOURCE_NAME}: an endless stream needs rowsPerSecond > 0 or "
                             "totalRows > 0, otherwise every micro-batch would be infinite")
        self._clock_start: Optional[float] = None
        self._clock_base = 0
        self._trigger_available_now = False
        self._available_now: Optional[int] = None

    def initialOffset(self) -> dict:
        """The stream's first position."""
        return Position().to_offset()

    def _available(self, start: Position) -> int:
        """How many records exist now: the rate's allowance, capped by ``totalRows``.

        Under Trigger.AvailableNow the amount is fixed at the first call: up to ``totalRows``,
        or else one second's worth of ``rowsPerSecond`` past where the query starts.
        """
        if self._trigger_available_now:
            if self._available_now is None:
                self._available_now = self.total_rows or start.events + self.rows_per_second
            return self._available_now
        if self.rows_per_second:
            if self._clock_start is None:
                self._clock_start, self._clock_base = time.monotonic(), start.events
            allowed = self._clock_base + int((time.monotonic() - self._clock_start)
                                             * self.rows_per_second)
        else:
            allowed = self.total_rows
        if self.total_rows:
            allowed = min(allowed, self.total_rows)
        return allowed

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerBatch`` records per micro-batch, or all available without a cap."""
        if self.max_rows_per_batch:
            return ReadMaxRows(self.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix how many records the run reads (see ``_available``)."""
        self._trigger_available_now = True
        self._available_now = None

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The position the next micro-batch reads up to.

        :param start: the offset the micro-batch starts at.
        :param limit: Spark's read limit (``ReadMaxRows`` caps the records).
        """
        begin = Position.from_offset(start)
        target = max(self._available(begin), begin.events)
        if isinstance(limit, ReadMaxRows):
            target = min(target, begin.events + limit.max_rows)
        if target == begin.events:
            return start
        return stream_for(self.params).advance(begin, target - begin.events).to_offset()

    def reportLatestOffset(self) -> Optional[dict]:
        """Not reported: the source has no backlog beyond what the rate admits."""
        return None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        """The records between two offsets, cut into ``numPartitions`` partitions.

        :param start: the micro-batch's first offset.
        :param end: its end offset (excluded).
        """
        stream = stream_for(self.params)
        pieces = stream.pieces(Position.from_offset(start), Position.from_offset(end))
        return _split(pieces, self.num_partitions)

    def read(self, partition: RangePartition) -> Iterator:
        """Generate one partition's records as Arrow batches.

        :param partition: the ranges to generate.
        """
        return _read(self.params, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: every range can be regenerated from the options.

        :param end: the offset committed.
        """


class SyntheticEventBatchReader(DataSourceReader):
    """The first ``totalRows`` records of the stream, as a batch DataFrame.

    :param options: the reader's options: the source's own (``rowsPerSecond``,
        ``maxRowsPerBatch``, ``totalRows``, ``numPartitions``) and ``GeneratorParams`` fields.
    :raises ValueError: an option is unknown or out of range, or ``totalRows`` is 0.
    """

    def __init__(self, options):
        self.params, settings = _parse_options(options)
        self.total_rows = settings["totalrows"]
        self.num_partitions = settings["numpartitions"]
        if not self.total_rows:
            raise ValueError(f"{SOURCE_NAME}: a batch read needs totalRows > 0")

    def partitions(self) -> list[RangePartition]:
        """The first ``totalRows`` records, cut into ``numPartitions`` partitions."""
        stream = stream_for(self.params)
        end = stream.advance(Position(), self.total_rows)
        return _split(stream.pieces(Position(), end), self.num_partitions) or \
            [RangePartition([])]

    def read(self, partition: RangePartition) -> Iterator:
        """Generate one partition's records as Arrow batches.

        :param partition: the ranges to generate.
        """
        return _read(self.params, partition)
