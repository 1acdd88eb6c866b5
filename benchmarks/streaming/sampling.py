"""Process sampling: resident memory and CPU time of the Spark JVM, its Python workers and this
driver, read from ``/proc`` by a background thread."""
from __future__ import annotations

import bisect
import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _process_table() -> dict[int, tuple[int, str, int, float]]:
    """pid -> (parent pid, command name, resident bytes, CPU seconds), for every process in
    /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:  # the process ended while we looked
            continue
        close = data.rfind(b")")
        comm = data[data.find(b"(") + 1:close].decode(errors="replace")
        rest = data[close + 2:].split()
        cpu = (int(rest[11]) + int(rest[12])) / _TICKS  # utime + stime
        table[int(entry.name)] = (int(rest[1]), comm, int(rest[21]) * _PAGE, cpu)
    return table


def _descendants(table: dict, root: int, skip: frozenset = frozenset()) -> list[int]:
    """``root`` and every process below it in ``table``, except the subtrees of ``skip``."""
    children = defaultdict(list)
    for pid, (ppid, *_) in table.items():
        children[ppid].append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


@dataclass
class MemoryPeaks:
    """Peak resident memory in bytes over one sampling window."""

    jvm: int = 0
    workers: int = 0   # all Python worker processes together, at one instant
    driver: int = 0    # this Python process
    total: int = 0     # JVM + workers + driver, at one instant
    samples: int = 0
    cpu_seconds: float = 0.0  # CPU time the whole process tree used in the window
    # (epoch seconds, CPU seconds used since the window began) at every sample, for cpu_between.
    cpu_timeline: list = field(default_factory=list, repr=False)


def cpu_between(timeline: list, start: float, end: float) -> Optional[float]:
    """The CPU seconds used from ``start`` to ``end`` (epoch seconds) by the sampled processes,
    interpolated linearly between the samples of ``timeline`` (``MemoryPeaks.cpu_timeline``);
    None when the samples do not cover that span.

    :param timeline: the samples, ``(epoch seconds, CPU seconds)``.
    :param start: the span's start, epoch seconds.
    :param end: the span's end, epoch seconds.
    """
    times = [t for t, _ in timeline]
    if not times or start < times[0] or end > times[-1] or end < start:
        return None

    def used_at(moment: float) -> float:
        i = bisect.bisect_left(times, moment)
        if times[i] == moment:
            return timeline[i][1]
        (t0, c0), (t1, c1) = timeline[i - 1], timeline[i]
        return c0 + (c1 - c0) * (moment - t0) / (t1 - t0)

    return used_at(end) - used_at(start)


class MemorySampler:
    """Samples the RSS of the Spark JVM, its Python workers and this driver in a thread.

    Under ``spark-submit`` the JVM is this process's parent; under plain ``python`` it is a child
    (the py4j gateway). Python workers are the JVM's ``python`` descendants. RSS of forked workers
    counts shared pages once per process, so the worker figure is an upper bound.

    CPU time is summed per process over the same tree: what each process used since the window
    began (or since it started, if it started within the window), up to the last sample that
    saw it. A short-lived worker may lose up to one sampling interval. On a machine shared with
    other work, CPU seconds are steadier than wall time.
    """

    def __init__(self, interval: float = 0.2):
        """``interval``: seconds between two samples.

        :param interval: seconds between two samples.
        """
        self.interval = interval
        self.me = os.getpid()
        self.peaks = MemoryPeaks()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cpu_base: dict[int, float] = {}   # pid -> its CPU seconds when the window began
        self._cpu_last: dict[int, float] = {}   # pid -> its CPU seconds at the latest sample
        self._alive: set[int] = set()
        self._excluded: frozenset = frozenset()

    @contextmanager
    def excluding(self, pid: int) -> Iterator[None]:
        """Leave process ``pid`` and its children out of the samples while inside (e.g. a load
        generator that is this process's child but not part of what is measured).

        :param pid: the process to leave out, with its children.
        """
        with self._lock:
            self._excluded = self._excluded | {pid}
        try:
            yield
        finally:
            with self._lock:
                self._excluded = self._excluded - {pid}

    def __enter__(self) -> "MemorySampler":
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def reset(self) -> MemoryPeaks:
        """Start a new window; return the peaks of the one that ended."""
        self.sample()
        with self._lock:
            peaks, self.peaks = self.peaks, MemoryPeaks()
            peaks.cpu_seconds = sum(cpu - self._cpu_base.get(pid, 0.0)
                                    for pid, cpu in self._cpu_last.items())
            # The next window starts from the live processes only (pids can be reused).
            self._cpu_base = {pid: self._cpu_last[pid] for pid in self._alive}
            self._cpu_last = dict(self._cpu_base)
            self.peaks.cpu_timeline.append((time.time(), 0.0))
        return peaks

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Take one sample: the peaks of each process group and each process's CPU."""
        table = _process_table()
        parent = table.get(self.me, (0, "", 0, 0.0))[0]
        root = parent if table.get(parent, (0, ""))[1] == "java" else self.me
        jvm = workers = driver = 0
        cpu = {}
        for pid in _descendants(table, root, self._excluded):
            if pid not in table:
                continue
            _, comm, rss, cpu[pid] = table[pid]
            if pid == self.me:
                driver += rss
            elif comm == "java":
                jvm += rss
            elif comm.startswith("python"):
                workers += rss
        with self._lock:
            p = self.peaks
            p.jvm, p.workers, p.driver = (max(p.jvm, jvm), max(p.workers, workers),
                                          max(p.driver, driver))
            p.total = max(p.total, jvm + workers + driver)
            p.samples += 1
            # Exited processes keep their last value: the window still counts what they used.
            self._cpu_last.update(cpu)
            self._alive = set(cpu)
            p.cpu_timeline.append((time.time(), sum(
                used - self._cpu_base.get(pid, 0.0) for pid, used in self._cpu_last.items())))
