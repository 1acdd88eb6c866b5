"""The skew picture: event time against arrival order, as in the Dataflow paper's figures.

Each record is a dot at (arrival position, event time); an ordered stream would be a rising
line, disorder shows as dots below the running maximum. The staircase is the watermark each
file's rows are judged against, and late records are red. matplotlib is an optional extra: ``plot_skew`` returns
False when it is missing. The object-oriented API is used (no pyplot), so no global state is
touched, and the PNG carries no software-version metadata.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

_MAX_POINTS = 200_000


def plot_skew(arrival_ts: np.ndarray, late: np.ndarray, file_edges: np.ndarray,
              watermarks: np.ndarray, path: Path, title: str) -> bool:
    """Draw the picture to ``path``; False when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    n = len(arrival_ts)
    # Keep every late record and thin the rest, so big runs still plot fast.
    stride = max(1, n // _MAX_POINTS)
    keep = np.zeros(n, dtype=bool)
    keep[::stride] = True
    keep |= late
    position = np.arange(n)
    event_time = arrival_ts.astype("datetime64[ms]")
    fig = Figure(figsize=(10, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    on_time = keep & ~late
    ax.scatter(position[on_time], event_time[on_time], s=2, color="tab:blue", label="record")
    if late.any():
        ax.scatter(position[late], event_time[late], s=6, color="tab:red", label="late record")
    if n:
        ax.plot(position, np.maximum.accumulate(arrival_ts).astype("datetime64[ms]"),
                color="black", linewidth=0.8, label="max event time seen")
    has_mark = watermarks > 0  # 0 is Spark's initial watermark: nothing is late yet
    for k in np.nonzero(has_mark)[0]:
        lo, hi = int(file_edges[k]), int(file_edges[k + 1])
        mark = np.datetime64(int(watermarks[k]), "ms")
        ax.hlines(mark, lo, max(hi - 1, lo), color="tab:green", linewidth=1.2,
                  label="watermark" if k == np.nonzero(has_mark)[0][0] else None)
    ax.set_xlabel("arrival order (record number)")
    ax.set_ylabel("event time (UTC)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return True
