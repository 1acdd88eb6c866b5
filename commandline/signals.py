"""SIGINT (Ctrl-C) and SIGTERM as requests to stop, not as exceptions from anywhere.

Python's default turns Ctrl-C into a ``KeyboardInterrupt`` raised wherever the program happens to
be, for a Spark job usually inside a py4j call to the JVM, which then logs tracebacks while the
half-finished call is torn down; SIGTERM kills the process without a word. Inside
``StopRequests`` either signal is only recorded: the command checks ``requested`` where stopping
is safe, finishes there (a streaming job: after the current micro-batch), prints its report and
exits with ``exit_code``. A second signal exits at once.

A signal may also reach the command through another process: the JVM of a Spark job hands on
the SIGTERM (and, under ``spark-submit``, the SIGINT) it receives (``forwarded``). A signal sent
to the whole process group arrives both ways; each way counts its own signals, so that is one
request, and a second signal by either way exits at once.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional, TextIO

from .exits import ExitCode

_EXIT_CODES = {signal.SIGINT: ExitCode.INTERRUPTED, signal.SIGTERM: ExitCode.TERMINATED}


class StopRequests:
    """Record SIGINT and SIGTERM for the duration of a ``with`` block.

    :param announce: what the command does on the first signal, printed as
        ``"<SIGNAL>: <announce> (send it again to stop at once)"``; ``None`` prints nothing.
    :param interrupt: also raise ``KeyboardInterrupt`` on the first signal, for a loop that
        stops by catching it (SIGTERM included).
    :param stream: where the announcement goes (default: the current ``sys.stderr``).

    Outside the main thread signal handlers cannot be installed; the block then changes nothing.
    """

    def __init__(self, announce: Optional[str] = None, interrupt: bool = False,
                 stream: Optional[TextIO] = None):
        self.announce = announce
        self.interrupt = interrupt
        self.stream = stream
        self.signum: Optional[int] = None
        self._previous: dict = {}
        self._received: set = set()  # the ways a signal came by: "own", "forwarded"

    @property
    def requested(self) -> bool:
        """True once a stop was requested."""
        return self.signum is not None

    @property
    def signal_name(self) -> Optional[str]:
        """``"SIGINT"`` or ``"SIGTERM"`` once a stop was requested."""
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> ExitCode:
        """The exit code for the signal received (``ExitCode.OK`` when none was)."""
        return _EXIT_CODES.get(self.signum, ExitCode.OK)

    def __enter__(self) -> "StopRequests":
        return self.install()

    def install(self) -> "StopRequests":
        """Handle SIGINT and SIGTERM here, again if something replaced the handlers since:
        PySpark's SparkContext installs its own SIGINT handler when it starts (cancel every job,
        raise ``KeyboardInterrupt``). The handlers found first are restored on exit."""
        if threading.current_thread() is threading.main_thread():
            for signum in _EXIT_CODES:
                previous = signal.signal(signum, self._handle)
                self._previous.setdefault(signum, previous)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def forwarded(self, signum: int) -> None:
        """Record SIGINT or SIGTERM received by another process on this command's behalf (the
        JVM of a Spark job), as if it had come here; never raises ``KeyboardInterrupt``.

        :param signum: the signal's number.
        """
        self._handle(signum, None, way="forwarded")

    def _handle(self, signum, _frame, way: str = "own") -> None:
        stream = self.stream or sys.stderr
        name = signal.Signals(signum).name
        if way in self._received:
            print(f"{name} again: stopping at once; the micro-batch in flight, if any, is redone "
                  "on restart", file=stream, flush=True)
            sys.stdout.flush()
            os._exit(int(_EXIT_CODES[signum]))
        self._received.add(way)
        if self.signum is not None:  # the same request, arrived the other way too
            return
        self.signum = signum
        if self.announce:
            print(f"{name}: {self.announce} (send it again to stop at once)", file=stream,
                  flush=True)
        if self.interrupt and way == "own":
            raise KeyboardInterrupt(name)
