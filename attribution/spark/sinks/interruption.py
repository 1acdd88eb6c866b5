"""A ``foreachBatch`` function that ``StreamingQuery.stop()`` can interrupt cleanly.

PySpark runs a ``foreachBatch`` function's JVM calls on the query's own thread (pinned thread
mode). A ``stop()`` that lands while the function runs cancels the query's jobs and interrupts
that thread, so the call in flight raises a ``Py4JJavaError`` (an ``InterruptedException``, an
I/O exception it caused, or a ``SparkException`` of the cancelled job group), and the function
raises it back to the JVM. Spark then tells a stop from a failure by matching the error's text,
the Python traceback with the whole Java stack trace in it, against a regular expression
(``StreamExecution.PROXY_ERROR``) that recurses once per character after its first words. On
about 2,000 characters it overflows the thread's stack (measured on Spark 4.2 with the JVM's
default thread stack), and a Java stack trace is longer than that: the query thread dies with a
``StackOverflowError`` printed on the driver's terminal, after a stop that was otherwise clean.

``stop_safe`` wraps the function: such an error is raised again as ``InterruptedBatch``, whose
message keeps the error's header and the messages of its Java exception and causes but drops
their stack frames, and which hides the original (``from None``). Spark reads it as the stop it
is. Any other error passes unchanged, stack trace and all.
"""
from __future__ import annotations

import functools
from typing import Callable

from py4j.protocol import Py4JJavaError

# The texts by which Spark recognises a stop in a foreachBatch function's error
# (StreamExecution.isInterruptionException): its three interruption exceptions, and a job of the
# query's cancelled job group.
STOP_MARKERS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                "java.nio.channels.ClosedByInterruptException", "cancelled")
# Each kept line is cut to this length: the message must stay well under the 2,000 characters.
MAX_LINE = 240


class InterruptedBatch(Exception):
    """A ``foreachBatch`` function's JVM call interrupted by the query's stop; the message is
    the call's error without its Java stack frames."""


def without_stack_frames(error_text: str) -> str:
    """The header of a ``Py4JJavaError``'s text and the message lines of its Java exception and
    causes, each cut to ``MAX_LINE`` characters: every line that is not a stack frame (a frame,
    ``... N more`` and a suppressed exception are indented by a tab).

    :param error_text: ``str`` of the error: ``An error occurred while calling o1.save.`` and
        the Java exception's stack trace.
    """
    lines = [line for line in error_text.splitlines() if line and not line.startswith("\t")]
    return "\n".join(line[:MAX_LINE] for line in lines)


def stop_safe(function: Callable) -> Callable:
    """``function`` (a ``foreachBatch`` function) with a stop's interruption of its JVM calls
    raised as ``InterruptedBatch``.

    :param function: called with each micro-batch's DataFrame and id.
    """
    @functools.wraps(function)
    def call(batch, batch_id: int) -> None:
        try:
            function(batch, batch_id)
        except Py4JJavaError as error:
            text = without_stack_frames(str(error))
            if not any(marker in text for marker in STOP_MARKERS):
                raise
            # Spark looks for py4j's own name of the error before the exception's.
            raise InterruptedBatch(f"{type(error).__module__}.{type(error).__name__}: {text}") \
                from None

    return call
