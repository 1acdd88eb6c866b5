"""Helper processes, so that a large run's separable work (pictures, a share of the truth) runs
on the other cores while the main process builds and writes.

The processes are *spawned* (a fresh interpreter, not a fork): ``generate`` may run in a process
that already has threads (a Spark driver, Arrow's pools), which a fork would copy mid-flight.
A spawned interpreter imports the parent's ``__main__`` module again under another name, so a
script that calls ``generate`` must do so under ``if __name__ == "__main__":``, as usual with
``multiprocessing``. Start-up costs a fresh interpreter and its imports (about half a second),
which is why small runs stay in one process (``processes_for``).
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

# Below this many users a run is over before a helper process has finished starting.
PARALLEL_MIN_USERS = 10_000


def available_cores() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def processes_for(users: int, requested: Optional[int] = None) -> int:
    """How many processes a run uses, this one included.

    :param users: the run's users (its size).
    :param requested: an explicit count (at least 1), or ``None`` for two processes when the
        machine has two cores and the run has at least ``PARALLEL_MIN_USERS`` users, else one.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"processes must be a positive integer, got {requested!r}")
        return requested
    return 2 if available_cores() >= 2 and users >= PARALLEL_MIN_USERS else 1


def start_helpers(processes: int,
                  modules: tuple[str, ...] = ()) -> Optional[ProcessPoolExecutor]:
    """A pool of ``processes - 1`` spawned helpers (``None`` for one process), started now and
    importing ``modules``, so that their start-up overlaps with the caller's work.

    The caller shuts the pool down (``pool.shutdown()``) when done.

    :param processes: the processes of the run, this one included (``processes_for``).
    :param modules: modules each helper imports at once; one that is missing is skipped.
    """
    if processes <= 1:
        return None
    pool = ProcessPoolExecutor(max_workers=processes - 1,
                               mp_context=multiprocessing.get_context("spawn"))
    for _ in range(processes - 1):
        pool.submit(_import, modules)
    return pool


def _import(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra (matplotlib): the task that needs it says so
            pass
