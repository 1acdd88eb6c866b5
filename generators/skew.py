"""The dataset's pictures of its disorder: ``skew.png`` and ``delays.png``.

``skew.png`` has two panels of event time against arrival order, as in the Dataflow paper's
figures. Each record is a dot at (arrival position, event time); an ordered stream would be a
rising line, disorder shows as dots below the running maximum. The green staircase is the
watermark each file's rows are judged against, which is the watermark of the batch before
(``disorder.late_mask``), and late records are red. The top panel is the whole run; over months a
2-minute bound and a heavy tail both look like a line, so the bottom panel zooms into the
busiest stretch whose event time spans ``zoom_ms`` (a few times the disorder bound), where they
differ. Records too old for the zoom's scale sit on its bottom edge as triangles.

``delays.png`` is the distribution of arrival delay (how far behind the maximum event time seen
a record arrives) for impressions and for visits, on a log axis: a histogram and the share of
records delayed more than a given time, with the watermark delay (and the model's bound) marked.

matplotlib is an optional extra: ``draw_pictures`` returns no paths when it is missing. The
object-oriented API is used (no pyplot), so no global state is touched, and the PNGs carry no
software-version metadata. ``draw_pictures`` takes plain arrays so that it can run in a helper
process (``generators.workers``) while the main one writes files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from joins.durations import format_duration_ms

SKEW_FILE = "skew.png"
DELAYS_FILE = "delays.png"
# Dots per panel: a 1000-pixel-wide panel shows no more, and drawing them is most of the cost.
_MAX_POINTS = 50_000
# Bars of the delay histogram, and finer log bins per bar for the tail curve.
_BARS, _FINE_PER_BAR = 60, 8
# Delay axis ticks at round human durations: 1 ms, 10 ms, 100 ms, 1 s, 10 s, 1 min, 10 min,
# 1 h, 6 h, 1 day, 1 week, 30 days, 1 year.
_DELAY_TICKS_MS = [1, 10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000, 21_600_000,
                   86_400_000, 604_800_000, 2_592_000_000, 31_536_000_000]
_WATERMARK_LABEL = ("watermark each file is judged by: the previous file's batch's "
                    "(late: at or below)")


@dataclass
class DisorderPicture:
    """What the pictures show, as plain arrays (picklable, no dataset objects).

    :param arrival_ts: event time (epoch ms) of every record, in arrival order.
    :param is_impression: per record, whether it is an impression (else a visit).
    :param late: per record, whether Spark's rule drops it as late.
    :param file_edges: record positions where files start, and the end.
    :param watermarks: per file, the watermark its records are judged by.
    :param watermark_delay_ms: the watermark delay ``D``.
    :param zoom_ms: the event-time width of the zoomed panel.
    :param bound_ms: the disorder model's bound on arrival delay, if it has one.
    :param title: the pictures' title.
    """

    arrival_ts: np.ndarray
    is_impression: np.ndarray
    late: np.ndarray
    file_edges: np.ndarray
    watermarks: np.ndarray
    watermark_delay_ms: int
    zoom_ms: int
    bound_ms: Optional[int]
    title: str


def draw_pictures(picture: DisorderPicture, out_dir) -> list[Path]:
    """Draw ``skew.png`` and ``delays.png``.

    :param picture: what to draw (``Dataset.picture``).
    :param out_dir: the directory to write them to.
    :returns: their paths (none when matplotlib is not installed).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        return []
    out_dir = Path(out_dir)
    return [_draw_skew(picture, out_dir / SKEW_FILE), _draw_delays(picture, out_dir / DELAYS_FILE)]


def _figure(width: float, height: float, rows: int = 1, cols: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False).ravel()


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return path


def zoom_window(arrival_ts: np.ndarray, width_ms: int) -> tuple[int, int]:
    """The arrival positions ``[lo, hi)`` of the busiest stretch over which the maximum event
    time seen rises by at most ``width_ms``: the most records, the earliest on ties.

    :param arrival_ts: event times (epoch ms) in arrival order.
    :param width_ms: the most the running maximum event time may rise within the stretch.
    """
    if not len(arrival_ts):
        return 0, 0
    top = np.maximum.accumulate(arrival_ts)
    ends = np.searchsorted(top, top + max(width_ms, 1), side="left")
    lo = int(np.argmax(ends - np.arange(len(top))))
    return lo, int(ends[lo])


def _draw_skew(p: DisorderPicture, path: Path) -> Path:
    fig, (whole, zoom) = _figure(10, 9.5, rows=2)
    _panel(whole, p, 0, len(p.arrival_ts))
    whole.set_title(p.title)
    lo, hi = zoom_window(p.arrival_ts, p.zoom_ms)
    _panel(zoom, p, lo, hi, floor_ms=p.zoom_ms)
    zoom.set_title(f"zoom: the busiest {format_duration_ms(p.zoom_ms)} of event time, "
                   f"{hi - lo:,} records (arrival {lo:,} to {max(hi - 1, lo):,})")
    return _save(fig, path)


def _panel(ax, p: DisorderPicture, lo: int, hi: int, floor_ms: Optional[int] = None) -> None:
    """Records ``lo..hi`` of the arrival order, their running maximum and the watermarks.

    With ``floor_ms`` the event-time axis starts that far below the running maximum at ``lo``;
    older records are drawn on the bottom edge.
    """
    position = np.arange(lo, hi)
    ts = p.arrival_ts[lo:hi]
    late = p.late[lo:hi]
    top = np.maximum.accumulate(p.arrival_ts[:hi])[lo:hi] if hi > lo else ts
    # Thin the records so big runs still plot fast, but keep every late record and the most
    # delayed ones: the disorder is in the outliers.
    shown = np.zeros(len(ts), dtype=bool)
    shown[::max(1, len(ts) // _MAX_POINTS)] = True
    if len(ts) > _MAX_POINTS:
        lag = top - ts
        shown[np.argpartition(lag, len(lag) - _MAX_POINTS // 10)[-(_MAX_POINTS // 10):]] = True
    as_time = lambda ms: np.asarray(ms, dtype=np.int64).astype("datetime64[ms]")  # noqa: E731
    below = np.zeros(len(ts), dtype=bool)
    if floor_ms is not None and len(ts):
        floor = int(top[0]) - floor_ms
        below = ts < floor
        if below.any():
            ax.scatter(position[below], as_time(np.full(int(below.sum()), floor)), marker="v",
                       s=14, color="tab:purple", label="older than this panel shows")
    on_time = shown & ~late & ~below
    ax.scatter(position[on_time], as_time(ts[on_time]), s=2 if floor_ms is None else 6,
               color="tab:blue", label="record")
    if (late & ~below).any():
        ax.scatter(position[late & ~below], as_time(ts[late & ~below]), s=8, color="tab:red",
                   label="late record")
    if hi > lo:
        # The running maximum is a staircase: draw it from where it rises (thinned, as dots).
        rises = np.concatenate([[0], np.flatnonzero(np.diff(top)) + 1, [len(top) - 1]])
        rises = rises[::max(1, len(rises) // _MAX_POINTS)]
        ax.step(position[rises], as_time(top[rises]), where="post", color="black",
                linewidth=0.8, label="max event time seen")
    labelled = False
    for k in range(len(p.watermarks)):
        a, b = max(int(p.file_edges[k]), lo), min(int(p.file_edges[k + 1]), hi)
        mark = int(p.watermarks[k])
        # 0 is Spark's initial watermark (nothing is late yet); off-panel marks are not drawn.
        if mark <= 0 or b <= a or (floor_ms is not None and mark < int(top[0]) - floor_ms):
            continue
        ax.hlines(as_time(mark), a, max(b - 1, a), color="tab:green", linewidth=1.2,
                  label=None if labelled else _WATERMARK_LABEL)
        labelled = True
    ax.set_xlabel("arrival order (record number)")
    ax.set_ylabel("event time (UTC)")
    ax.legend(loc="upper left", fontsize="small")


def _log_counts(lag: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of the positive ``lag`` values in the log-spaced bins ``edges`` (one pass, no
    sort: the bin is computed from the logarithm)."""
    positive = lag[lag > 0].astype(np.float64)
    step = np.log(edges[-1] / edges[0]) / (len(edges) - 1)
    index = np.clip((np.log(positive / edges[0]) / step).astype(np.int64), 0, len(edges) - 2)
    return np.bincount(index, minlength=len(edges) - 1)


def _draw_delays(p: DisorderPicture, path: Path) -> Path:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig, (hist, tail) = _figure(12, 4.8, cols=2)
    top = np.maximum.accumulate(p.arrival_ts) if len(p.arrival_ts) else p.arrival_ts
    lag = top - p.arrival_ts
    high = max(float(lag.max()) if len(lag) else 0.0, 2.0) * 1.0001
    # Fine log bins for the tail curve; the histogram shows them _FINE_PER_BAR at a time.
    edges = np.geomspace(1.0, high, _BARS * _FINE_PER_BAR + 1)
    for name, mask, color in (("impressions", p.is_impression, "tab:orange"),
                              ("visits", ~p.is_impression, "tab:blue")):
        own = lag[mask]
        if not len(own):
            continue
        fine = _log_counts(own, edges)
        zero = float((own == 0).mean())
        hist.stairs(fine.reshape(_BARS, _FINE_PER_BAR).sum(axis=1), edges[::_FINE_PER_BAR],
                    color=color, linewidth=1.4,
                    label=f"{name}: {len(own):,} records, {zero:.0%} at the front (no delay)")
        # Share of *all* this source's records delayed more than each fine bin's left edge.
        beyond = np.cumsum(fine[::-1])[::-1] / len(own)
        shown = beyond > 0
        if shown.any():
            tail.step(edges[:-1][shown], beyond[shown], where="post", color=color, label=name)
    for ax in (hist, tail):
        ax.set_xscale("log")
        ax.axvline(p.watermark_delay_ms, color="tab:red", linestyle="--", linewidth=1,
                   label=f"watermark delay {format_duration_ms(p.watermark_delay_ms)}")
        if p.bound_ms:
            ax.axvline(p.bound_ms, color="black", linestyle=":", linewidth=1,
                       label=f"model bound {format_duration_ms(p.bound_ms)}")
        ax.xaxis.set_major_locator(FixedLocator(_DELAY_TICKS_MS))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_duration_ms(x)))
        ax.set_xlabel("arrival delay: behind the max event time seen (log)")
    hist.set_ylim(bottom=0, top=hist.get_ylim()[1] * 1.35)  # room for the legend
    hist.set_ylabel("records")
    hist.set_title("arrival delay per source")
    tail.set_yscale("log")
    tail.set_ylabel("share of the source's records delayed more")
    tail.set_title("tail: share delayed more than x (log-log)")
    hist.legend(loc="upper left", fontsize="small")
    tail.legend(loc="lower left", fontsize="small")
    fig.suptitle(p.title, fontsize="medium")
    return _save(fig, path)
