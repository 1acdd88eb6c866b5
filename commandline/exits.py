"""Exit codes and one-line errors.

A failure the user can cause ends a command with one ``error:`` line on stderr that names the
cause and the fix, and with the exit code of its kind, so scripts can tell an unusable output
directory from a corrupt input file without parsing text.
"""
from __future__ import annotations

import sys
from enum import IntEnum
from typing import Optional, TextIO


class ExitCode(IntEnum):
    """The exit codes of every command of the project (documented in each ``--help``)."""

    OK = 0
    FAILED = 1          # anything unexpected: the error line names the log with the details
    USAGE = 2           # bad command-line arguments (argparse's own code)
    INPUT = 3           # the input cannot be read as asked
    OUTPUT = 4          # an output directory cannot be written
    CHECKPOINT = 5      # the checkpoint belongs to another run, or cannot be written
    NO_VALID_INPUT = 6  # the run read records and every one was invalid (all dead-lettered)
    INTERRUPTED = 130   # stopped by SIGINT (Ctrl-C): 128 + 2, as shells report it
    TERMINATED = 143    # stopped by SIGTERM: 128 + 15


_MEANINGS = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "unexpected failure (the error line names the log with the details)",
    ExitCode.USAGE: "bad command-line arguments",
    ExitCode.INPUT: "the input cannot be read as asked (missing, unreadable, corrupt or of "
                    "another --format)",
    ExitCode.OUTPUT: "an output directory is a file, not writable, or holds another query's "
                     "output",
    ExitCode.CHECKPOINT: "the checkpoint was started with other options or input, or is not "
                         "writable",
    ExitCode.NO_VALID_INPUT: "the run read records, but not one was valid: all are in the "
                             "dead letter, the error line gives the most frequent reasons",
    ExitCode.INTERRUPTED: "stopped by SIGINT (Ctrl-C) after the final report",
    ExitCode.TERMINATED: "stopped by SIGTERM after the final report",
}


def exit_codes_help(*codes: ExitCode) -> str:
    """The ``exit codes:`` block of a ``--help`` epilog, for ``codes`` (default: all).

    :param codes: the exit codes to list; none: every code.
    """
    lines = ["exit codes:"]
    lines += [f"  {int(code):<4} {_MEANINGS[code]}" for code in (codes or ExitCode)]
    return "\n".join(lines)


class Failure(Exception):
    """A failure the user can fix: a message naming the cause and the fix, and its exit code.

    :param code: the kind of failure (an ``ExitCode``).
    :param message: one sentence or two, printed after ``error:`` on a single line.
    """

    def __init__(self, code: ExitCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def report_failure(failure: Failure, stream: Optional[TextIO] = None) -> int:
    """Print ``failure`` as one ``error:`` line (newlines folded) and return its exit code.

    :param failure: the failure to report.
    :param stream: where the line goes (default: ``sys.stderr``).
    """
    print(f"error: {' '.join(failure.message.split())}", file=stream or sys.stderr, flush=True)
    return int(failure.code)
