"""The interface every sink implements: ``Sink``, where a job writes rows (the attribution
changelog, the dead letter, the late records)."""
from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

REPLACE_ALL, REPLACE_DATES = "all", "dates"  # what a batch write replaces


class Sink(ABC):
    """Where one of a job's outputs goes.

    **Call order.** A job calls, for one run:

    1. ``check()``, once, before it starts Spark: a problem the user can fix, as one line.
    2. In streaming mode, ``start_stream(rows, checkpoint, trigger, query_name)`` once per
       streaming query that writes here; the query's checkpoint keeps what was committed. In
       batch mode, ``write_batch(rows, replace)`` once.
    3. For driver-side records (the late-record audit), ``write_micro_batch(batch_id, table,
       detected)`` once per micro-batch that has some; a repeated call for the same
       ``batch_id`` (a crash between writing and recording it) replaces the first.

    **Guarantees a sink states.** Whether a reader sees each row once (Spark's file sink: the
    rows its ``_spark_metadata`` log commits) or at least once, with the key that identifies a
    row (a Kafka topic); ``exactly_once`` says which.
    """

    #: True when a reader of the sink sees every committed row exactly once.
    exactly_once: bool = True

    def check(self) -> Optional[str]:
        """Why the sink cannot be written as configured, in one line, or ``None``. Called
        before Spark starts; the default finds nothing."""
        return None

    @abstractmethod
    def start_stream(self, rows: "DataFrame", checkpoint: str, trigger: str,
                     query_name: str) -> "StreamingQuery":
        """Start the streaming query writing ``rows`` here, appending each micro-batch.

        :param rows: a streaming DataFrame.
        :param checkpoint: the query's checkpoint location.
        :param trigger: ``available-now`` or a processing-time interval
            (``pipeline.apply_trigger``).
        :param query_name: the query's name in Spark's progress and UI.
        """

    @abstractmethod
    def write_batch(self, rows: "DataFrame", replace: str = REPLACE_ALL) -> None:
        """Write ``rows`` once, replacing what the sink held.

        :param rows: a batch DataFrame.
        :param replace: ``REPLACE_ALL``: everything; ``REPLACE_DATES``: only the dates the
            rows fall in (a backfill of a window), for a sink laid out by date.
        """

    def write_micro_batch(self, batch_id: int, table: "pa.Table",
                          detected: dt.datetime) -> None:
        """Write the driver-side records of micro-batch ``batch_id``, replacing any earlier
        write of the same id. The default refuses: a sink that takes only Spark rows.

        :param batch_id: the micro-batch the records belong to.
        :param table: the records.
        :param detected: when the micro-batch ran (its date places the records).
        """
        raise NotImplementedError(f"{type(self).__name__} takes no driver-side records")
