"""The manifest: what a generator run produced and how disordered it is.

``manifest.json`` records the seed and every parameter, counts by kind, the site's shape, the
event-time range, the disorder statistics (maximum and p99 arrival delay, overall and per
source, and the late records for the chosen watermark delay, with ``no_late_events`` as a plain
boolean), one entry per file with its checksum, and a summary of the truth: its models and
half-life, attributed and organic goals per model, and per model the goals with two or more
candidate impressions (the goals whose credit a multi-touch model splits). It holds nothing
run-dependent (no clock, no absolute path), so it is as reproducible as the data. Long late
lists go to ``late_event_ids.txt``.

Machine-readable durations and times are integers whose key names the unit (``..._ms``: epoch or
duration milliseconds); ``summary`` says the same for people, in human units
(``joins.durations.format_duration_ms``), and is what the CLI prints.
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from attribution.events import ms_to_iso
from joins.durations import format_duration_ms

from .behaviour import IMPRESSION, VISIT

MANIFEST_VERSION = 1
LATE_IDS_FILE = "late_event_ids.txt"
INLINE_LATE_IDS = 1_000
ARRIVAL_DELAY_MEANING = ("how far behind the maximum event time seen so far (the record "
                         "included) a record arrives, in arrival order across all files")
LATE_RULE = ("files are read one per micro-batch in name order; batch j's watermark W_j is "
             "max(0, max ts of files before j - watermark_delay), W_0 = 0; like Spark 4.x, a "
             "record of file k is late iff ts <= W_(k-1), the previous batch's watermark; "
             "late_count_by_current_watermark counts ts <= W_k instead (a superset)")
_LIBRARIES = ("numpy", "faker", "pyarrow", "fastavro", "networkx")


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file's bytes.

    :param path: the file to hash.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def library_versions() -> dict:
    """Versions that the bytes depend on; same versions, same seed, same bytes."""
    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def event_counts(dataset) -> dict:
    """Counts by kind over the distinct generated events and the written records.

    :param dataset: the ``generators.dataset.Dataset`` generated.
    """
    ev = dataset.events
    visit = ev.kind == VISIT
    imp = ev.kind == IMPRESSION
    window = dataset.params.dedup_window_ms
    # Click-spam copies: impressions of the same ad to the same user in the same dedup bucket
    # beyond the first; they collapse into one logical impression (spec rule 3).
    logical = _distinct(ev.user[imp], ev.source[imp], ev.target[imp], ev.ts[imp] // window)
    # Repeat visits: a visit to a URL the same user has already visited.
    distinct_pairs = _distinct(ev.user[visit], ev.url[visit])
    records = len(dataset.arrival.rows)
    goal = visit & ev.is_goal
    return {
        "users": dataset.params.users,
        "sessions": int(len(dataset.sessions)),
        "paid_sessions": int(dataset.sessions.paid.sum()),
        "organic_sessions": int((~dataset.sessions.paid).sum()),
        "events": int(len(ev)),
        "visits": int(visit.sum()),
        "goals": int(goal.sum()),
        "goals_with_value": int((goal & ~np.isnan(ev.value)).sum()),
        "impressions": int(imp.sum()),
        "logical_impressions": int(logical),
        "click_spam_duplicates": int(imp.sum() - logical),
        "repeat_visits": int(visit.sum() - distinct_pairs),
        "records": int(records),
        "redelivered_records": int(records - len(ev)),
        "heartbeats": 1 if dataset.params.heartbeat else 0,
    }


def _distinct(*columns: np.ndarray) -> int:
    """Number of distinct rows of parallel integer columns (one sort, no Python loop)."""
    if not len(columns[0]):
        return 0
    # Rows as one mixed-radix int64 key when the columns' ranges fit (a single-key sort is
    # several times faster than lexsort over the columns); lexsort otherwise.
    key, radix = np.zeros(len(columns[0]), dtype=np.int64), 1
    for column in columns:
        low, width = int(column.min()), int(column.max()) - int(column.min()) + 1
        radix *= width
        if radix >= 2 ** 62:
            break
        key = key * width + (column.astype(np.int64) - low)
    else:
        # Sort and count changes: np.unique's hash path is far slower on wide int64 keys.
        key.sort()
        return int(1 + np.count_nonzero(key[1:] != key[:-1]))
    order = np.lexsort(columns[::-1])
    changed = np.zeros(len(order), dtype=bool)
    changed[0] = True
    for column in columns:
        sorted_column = column[order]
        changed[1:] |= sorted_column[1:] != sorted_column[:-1]
    return int(changed.sum())


def site_summary(dataset) -> dict:
    """The site's shape: pages, goal and search pages, links, ads, domains, campaigns.

    :param dataset: the ``generators.dataset.Dataset`` generated.
    """
    site = dataset.site
    return {
        "pages": int(site.n_pages),
        "goal_pages": int(site.is_goal.sum()),
        "search_pages": int(site.n_search),
        "links": int(len(site.link_idx)),
        "ads": int(len(site.ad_source)),
        "domains": dataset.params.domains,
        "campaigns": len(site.campaigns),
    }


def truth_summary(table: pa.Table, config, multi_candidate: dict, relative_path: str,
                  path: Path) -> dict:
    """The manifest's ``truth`` entry.

    :param table: the truth rows (output schema).
    :param config: the ``AttributionConfig`` they were computed with.
    :param multi_candidate: per model, the goals with two or more candidates
        (``generators.truth.Truth``).
    :param relative_path: the truth file's path under the output directory.
    :param path: the truth file, for its checksum.
    """
    model = table.column("model")
    goal = table.column("goal_event_id")
    paid = table.column("impression_id").is_valid()
    goals, attributed = {}, {}
    for m in config.models:
        mine = pc.equal(model, m)
        goals[m] = len(pc.unique(goal.filter(mine)))
        attributed[m] = len(pc.unique(goal.filter(pc.and_(mine, paid))))
    return {
        "path": relative_path,
        "models": list(config.models),
        "half_life": format_duration_ms(config.half_life_ms),
        "half_life_ms": config.half_life_ms,
        "rows": table.num_rows,
        "goals": len(pc.unique(goal)),
        "attributed_goals": attributed,
        "organic_goals": {m: goals[m] - attributed[m] for m in config.models},
        "multi_candidate_goals": {m: int(multi_candidate[m]) for m in config.models},
        "sha256": sha256_of(path),
    }


def _quantile(values: np.ndarray, q: float) -> int:
    return int(np.percentile(values, q, method="higher")) if len(values) else 0


def delay_stats(lag: np.ndarray) -> dict:
    """Records, median, p99 and maximum of some records' arrival delays (milliseconds).

    :param lag: the records' arrival delays in ms (``disorder.arrival_lag``).
    """
    return {"records": int(len(lag)), "p50_ms": _quantile(lag, 50), "p99_ms": _quantile(lag, 99),
            "max_ms": int(lag.max()) if len(lag) else 0}


def event_time_range(ts: np.ndarray) -> dict:
    """First and last event time and the span between them.

    :param ts: event times in epoch ms, in any order.
    """
    if not len(ts):
        return {"first_ms": None, "last_ms": None, "span_ms": 0}
    first, last = int(ts.min()), int(ts.max())
    return {"first_ms": first, "last_ms": last, "first": ms_to_iso(first),
            "last": ms_to_iso(last), "span_ms": last - first}


def _when(ms: int) -> str:
    """``2024-01-01 00:00`` (UTC, to the minute): how a person reads a timestamp."""
    return ms_to_iso(ms)[:16].replace("T", " ")


def summary(manifest: dict) -> dict:
    """One line each for people, in human units: event time, disorder, truth (when computed).

    :param manifest: the manifest as ``build_manifest`` makes it (before its ``summary``).
    """
    params, d, span = manifest["params"], manifest["disorder"], manifest["event_time"]
    lines = {}
    if span["first_ms"] is not None:
        lines["event_time"] = (f"event time {_when(span['first_ms'])} to {_when(span['last_ms'])} "
                               f"UTC ({format_duration_ms(span['span_ms'])})")
    by_source = ", ".join(f"{name}s {format_duration_ms(s['p99_ms'])}"
                          for name, s in d["arrival_delay_by_source"].items() if s["records"])
    late = ("no late events" if d["no_late_events"] else f"{d['late_count']:,} late records")
    lines["disorder"] = (f"disorder {d['model']}: max arrival delay "
                         f"{format_duration_ms(d['max_arrival_delay_ms'])}, p99 "
                         f"{format_duration_ms(d['p99_arrival_delay_ms'])} (p99 by source: "
                         f"{by_source}); {late} for a {params['watermark_delay']} watermark delay")
    truth = manifest["truth"]
    if truth:
        first = truth["models"][0]
        lines["truth"] = (f"truth: {truth['goals']:,} goals under {len(truth['models'])} models "
                          f"(half-life {truth['half_life']}), {truth['rows']:,} rows; {first}: "
                          f"{truth['attributed_goals'][first]:,} attributed, "
                          f"{truth['organic_goals'][first]:,} organic")
        lines["multi_candidate"] = ("goals with 2 or more candidate impressions: " + ", ".join(
            f"{n:,} {m}" for m, n in truth["multi_candidate_goals"].items()))
    return lines


def build_manifest(dataset, files: list[dict], late_ids: list[str], strict_late: int,
                   truth: Optional[dict], heartbeat: Optional[dict]) -> dict:
    """The manifest as a dict.

    :param dataset: the ``generators.dataset.Dataset`` generated.
    :param files: one entry per written file (name, records, event-time range, watermark, late
        records, checksum), in name order.
    :param late_ids: the late records' event ids in arrival order, by Spark's rule.
    :param strict_late: how many records the stricter current-watermark reading counts (see
        ``disorder.late_mask``).
    :param truth: the ``truth_summary`` entry, or ``None`` when no truth was computed.
    :param heartbeat: the heartbeat's file, event id and time, or ``None`` without one.
    """
    params = dataset.params
    lag = dataset.arrival_lag()
    kind = dataset.events.kind[dataset.arrival.rows]
    disorder = {
        "model": params.disorder,
        "arrival_delay_meaning": ARRIVAL_DELAY_MEANING,
        "max_arrival_delay_ms": int(lag.max()) if len(lag) else 0,
        "p99_arrival_delay_ms": _quantile(lag, 99),
        "arrival_delay_by_source": {"impression": delay_stats(lag[kind == IMPRESSION]),
                                    "visit": delay_stats(lag[kind == VISIT])},
        "watermark_delay_ms": params.watermark_delay_ms,
        "late_rule": LATE_RULE,
        "late_requested": int(dataset.arrival.requested_late),
        "late_made_on_purpose": int(dataset.arrival.forced_late.sum()),
        "late_count": len(late_ids),
        "no_late_events": not late_ids,
        "late_count_by_current_watermark": int(strict_late),
    }
    if len(late_ids) <= INLINE_LATE_IDS:
        disorder["late_event_ids"] = late_ids
    else:
        disorder["late_event_ids_file"] = LATE_IDS_FILE
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "generator": "generators (streamgen)",
        "seed": params.seed,
        "params": params.to_dict(),
        "library_versions": library_versions(),
        "site": site_summary(dataset),
        "counts": event_counts(dataset),
        "event_time": event_time_range(dataset.events.ts),
        "disorder": disorder,
        "files": files,
        "heartbeat": heartbeat,
        "truth": truth,
    }
    manifest["summary"] = summary(manifest)
    return manifest


def write_manifest(manifest: dict, out: Path, late_ids: list[str]) -> Path:
    """Write ``manifest.json`` (and the late id list when it is long).

    :param manifest: the manifest from ``build_manifest``.
    :param out: the output directory.
    :param late_ids: the late records' event ids, written to ``late_event_ids.txt`` when the
        manifest refers to that file.
    :returns: the path of ``manifest.json``.
    """
    out = Path(out)
    if "late_event_ids_file" in manifest["disorder"]:
        (out / LATE_IDS_FILE).write_text("".join(i + "\n" for i in late_ids), encoding="utf-8")
    path = out / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path
