"""The benchmark's progress log: one line per step on stderr, so that stdout holds only the
tables. A leaf module, importable by every other module of the benchmark."""
from __future__ import annotations

import sys


def log(message: str) -> None:
    """Print a progress line on stderr.

    :param message: the line, without its newline.
    """
    print(message, file=sys.stderr, flush=True)
