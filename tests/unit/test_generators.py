"""Tests of the synthetic event generators without Spark: site, behaviour, disorder, files.

Everything is checked on what was written to disk and read back with
``attribution.spark.files``, the way a consumer sees it, not on the generator's in-memory arrays.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import fastavro
import networkx as nx
import numpy as np
import pyarrow.parquet as pq
import pytest

from attribution.config import (
    DEFAULT_HALF_LIFE,
    DEFAULT_WATERMARK_DELAY,
    MODELS,
    MS_PER_DAY,
    parse_duration_ms,
)
from attribution.events import parse_event, ts_to_ms
from attribution.oracle import attribute_batch
from attribution.schema import EVENT_FIELDS, EVENT_SCHEMA
from attribution.spark.files import data_files, read_event_records, read_events
from attribution.spark.output import read_attribution_rows
from attribution.spark.types import arrow_schema
from generators.behaviour import EventColumns
from generators.dataset import OutputExists, build, generate
from generators.disorder import late_event_ids, late_event_ids_in_dir
from generators.params import GeneratorParams, duration_ms
from generators.site import LINK, SEARCH, build_site, forward_links, link_graph
from generators.stream import EventStream, Position
from generators.truth import read_truth
from generators.writers import atomic_write, part_name
from support import ROOT

SMALL = dict(users=150, files=6)


def _records_by_file(events_dir: Path) -> list[list[dict]]:
    return [list(read_event_records(f)) for f in data_files(events_dir)]


def _lags(events_dir: Path) -> np.ndarray:
    """How far behind the maximum event time seen so far each record arrives (file order)."""
    ts = np.array([ts_to_ms(r["ts"]) for f in _records_by_file(events_dir) for r in f],
                  dtype=np.int64)
    return np.maximum.accumulate(ts) - ts


def _late_reference(files: list[list[dict]], delay_ms: int) -> list[str]:
    """Spark 4.x's rule written out plainly: batch j's watermark is the largest event time of
    the files before it minus the delay (0 at first), and file k's rows are late when at or
    below batch k-1's watermark."""
    late, seen, watermarks = [], None, []
    for records in files:
        watermarks.append(0 if seen is None else max(0, seen - delay_ms))
        judged_by = watermarks[-2] if len(watermarks) > 1 else 0
        late += [r["event_id"] for r in records if ts_to_ms(r["ts"]) <= judged_by]
        for r in records:
            seen = ts_to_ms(r["ts"]) if seen is None else max(seen, ts_to_ms(r["ts"]))
    return late


# -- the default 2,000-user run -----------------------------------------------------------------

@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The CLI's default dataset, with redelivery switched on and a heartbeat."""
    out = tmp_path_factory.mktemp("default-run")
    params = GeneratorParams(redelivery_rate=0.02, heartbeat=True)
    assert params.users == 2_000
    return generate(params, out)


@pytest.fixture(scope="module")
def default_events(default_run):
    return read_events(default_run.events_dir)


def test_default_params_come_from_the_attribution_config():
    params = GeneratorParams()
    assert params.users == 2_000
    assert params.watermark_delay_ms == parse_duration_ms(DEFAULT_WATERMARK_DELAY)
    assert params.attribution_config().lookback_ms == parse_duration_ms("90 days")
    assert params.attribution_config().dedup_window_ms == MS_PER_DAY


def test_truth_equals_the_oracle_over_the_files_read_back(default_run, default_events):
    config = default_run.dataset.params.attribution_config()
    assert config.models == MODELS and config.half_life_ms == parse_duration_ms(DEFAULT_HALF_LIFE)
    expected = attribute_batch(default_events, config)
    truth = read_attribution_rows(default_run.truth_path)
    # Every model's rows: one last_touch row per goal, and the rest of the oracle's rows.
    assert {r.model for r in truth} == set(MODELS)
    assert len(read_truth(default_run.truth_path)) == default_run.manifest["counts"]["goals"] > 100
    assert truth == expected
    for model in MODELS:
        assert [r for r in truth if r.model == model] == attribute_batch(
            default_events, replace(config, models=(model,)))
    entry = default_run.manifest["truth"]
    assert entry["models"] == list(MODELS) and entry["half_life"] == DEFAULT_HALF_LIFE
    assert entry["half_life_ms"] == config.half_life_ms and entry["rows"] == len(truth)


def test_every_behaviour_appears_in_the_default_run(default_run, default_events):
    events = [e for e in default_events if e.event_type != "heartbeat"]
    truth = read_truth(default_run.truth_path)
    visits = [e for e in events if e.event_type == "visit"]
    impressions = [e for e in events if e.event_type == "impression"]
    search_urls = {e.source_url for e in impressions}

    # Organic goals, attributed goals, multi-hop trails.
    assert sum(1 for r in truth if r.organic) > 50
    assert sum(1 for r in truth if not r.organic) > 50
    assert sum(1 for r in truth if len(r.trail) >= 2) > 50

    # Paid sessions land from a search page; organic ones arrive without one.
    assert any(v.referer in search_urls for v in visits)
    assert any(v.referer is None for v in visits)

    # Click spam: the same ad clicked again by the same user, within one UTC day and across
    # midnight (consecutive days, less than an hour apart).
    clicks = defaultdict(list)
    for i in impressions:
        clicks[(i.user_id, i.source_url, i.target_url)].append(i.ts)
    same_day = across_midnight = 0
    for stamps in clicks.values():
        stamps.sort()
        for a, b in zip(stamps, stamps[1:]):
            if a // MS_PER_DAY == b // MS_PER_DAY:
                same_day += 1
            elif b // MS_PER_DAY == a // MS_PER_DAY + 1 and b - a < 3_600_000:
                across_midnight += 1
    assert same_day > 20 and across_midnight > 5

    # Impressions that lead nowhere: no later visit of that user lands from that ad.
    landings = defaultdict(list)
    for v in visits:
        landings[(v.user_id, v.referer, v.url)].append(v.ts)
    nowhere = sum(1 for i in impressions
                  if not any(t >= i.ts for t in landings.get((i.user_id, i.source_url,
                                                              i.target_url), ())))
    assert nowhere > 50

    # Goals as hops: a goal URL the user converted on appears in the trail of a later goal.
    goal_urls = defaultdict(set)
    for v in visits:
        if v.is_goal:
            goal_urls[v.user_id].add(v.url)
    assert sum(1 for r in truth if any(u in goal_urls[r.user_id] for u in r.trail)) > 10

    # Repeat visits to the same URL, and timestamp ties within a user.
    assert max(Counter((v.user_id, v.url) for v in visits).values()) >= 2
    assert sum(c - 1 for c in Counter((e.user_id, e.ts) for e in events).values()) > 10

    # Redeliveries: records repeated with the same event_id and identical content.
    copies = Counter(e.event_id for e in events)
    redelivered = [k for k, c in copies.items() if c > 1]
    assert len(redelivered) == default_run.manifest["counts"]["redelivered_records"] > 0
    first = {}
    for e in events:
        assert first.setdefault(e.event_id, e) == e

    # Sessions over days and weeks, some users returning after the lookback.
    spans = defaultdict(list)
    for e in events:
        spans[e.user_id].append(e.ts)
    lookback = default_run.dataset.params.lookback_ms
    assert sum(1 for s in spans.values() if max(s) - min(s) > lookback) > 20
    assert sum(1 for s in spans.values() if MS_PER_DAY < max(s) - min(s) <= lookback) > 500


def test_manifest_counts_match_the_files(default_run, default_events):
    m = default_run.manifest
    records = [e for e in default_events if e.event_type != "heartbeat"]
    assert m["counts"]["records"] == len(records)
    assert m["counts"]["events"] == len({e.event_id for e in records})
    assert m["counts"]["visits"] + m["counts"]["impressions"] == m["counts"]["events"]
    assert m["counts"]["heartbeats"] == 1
    assert [f["name"] for f in m["files"]] == [p.name for p in data_files(default_run.events_dir)]
    assert sum(f["records"] for f in m["files"]) == len(default_events)
    on_disk = json.loads((default_run.out / "manifest.json").read_text())
    assert on_disk == m
    assert on_disk["seed"] == 1 and on_disk["params"]["users"] == 2_000


def test_heartbeat_file_closes_the_stream(default_run, default_events):
    last = data_files(default_run.events_dir)[-1]
    (record,) = list(read_event_records(last))
    assert record["event_type"] == "heartbeat" and record["user_id"] is None
    assert all(record[k] is None for k in EVENT_FIELDS
               if k not in ("event_id", "event_type", "ts"))
    top = max(e.ts for e in default_events if e.event_type != "heartbeat")
    delay = default_run.dataset.params.watermark_delay_ms
    assert ts_to_ms(record["ts"]) - delay > top


def test_default_run_has_no_late_events_and_says_so(default_run):
    d = default_run.manifest["disorder"]
    assert d["no_late_events"] is True and d["late_count"] == 0
    assert late_event_ids_in_dir(default_run.events_dir, d["watermark_delay_ms"]) == []
    assert 0 < d["p99_arrival_delay_ms"] <= d["max_arrival_delay_ms"] <= duration_ms("2 minutes")
    assert d["max_arrival_delay_ms"] == int(_lags(default_run.events_dir).max())


def test_skew_picture_is_a_png(default_run):
    png = default_run.out / "skew.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_files_are_ordered_by_mtime_for_spark(default_run):
    # Spark's file source orders new files by modification time (milliseconds).
    mtimes = [p.stat().st_mtime_ns // 1_000_000 for p in data_files(default_run.events_dir)]
    assert all(a < b for a, b in zip(mtimes, mtimes[1:]))


# -- the site model -----------------------------------------------------------------------------

def test_site_links_form_a_dag_with_back_links_and_ads_on_search_pages():
    params = GeneratorParams(pages=120, domains=4, search_pages=10)
    graph = build_site(params)
    pages = [n for n, k in graph.nodes(data="kind") if k != SEARCH]
    assert len(pages) == 120
    assert nx.is_directed_acyclic_graph(forward_links(graph))
    assert not nx.is_directed_acyclic_graph(link_graph(graph))  # back links close cycles
    assert sum(1 for n in pages if graph.nodes[n]["is_goal"]) >= 4
    urls = [u for _, u in graph.nodes(data="url")]
    assert len(set(urls)) == len(urls)
    assert all(re.match(r"https://www\.[a-z0-9-]+\.[a-z]+/", graph.nodes[n]["url"]) for n in pages)
    searches = [n for n, k in graph.nodes(data="kind") if k == SEARCH]
    assert len(searches) == 10
    for s in searches:
        targets = list(graph.successors(s))
        assert len(targets) == params.ads_per_search
        assert not any(graph.nodes[t]["is_goal"] for t in targets)
    for u, v, kind in graph.edges(data="kind"):
        assert (kind == LINK) == (u not in searches)


# -- reproducibility ------------------------------------------------------------------------------

def _all_bytes(out: Path) -> dict[str, bytes]:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "skew.png")
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in files}


@pytest.mark.parametrize("fmt", ["json", "parquet", "avro"])
def test_same_seed_same_bytes(tmp_path, fmt):
    params = GeneratorParams(format=fmt, redelivery_rate=0.05, late_fraction=0.01, heartbeat=True,
                             **SMALL)
    first = _all_bytes(generate(params, tmp_path / "a", plot=False).out)
    second = _all_bytes(generate(params, tmp_path / "b", plot=False).out)
    assert "truth/attributions.parquet" in first and len(first) >= SMALL["files"] + 3
    assert first == second
    other = _all_bytes(generate(params.replace(seed=2), tmp_path / "c", plot=False).out)
    name = f"events/{part_name(0, fmt)}"
    assert other[name] != first[name]


def test_same_bytes_across_processes_and_hash_seeds(tmp_path):
    env = dict(os.environ)
    outs = []
    for hash_seed in ("0", "4242"):
        out = tmp_path / f"run-{hash_seed}"
        env["PYTHONHASHSEED"] = hash_seed
        subprocess.run([sys.executable, "-m", "generators", "generate", "--out", str(out),
                        "--users", "200", "--format", "parquet", "--redelivery-rate", "0.03",
                        "--disorder", "heavy-tail", "--no-plot", "--quiet"],
                       check=True, cwd=ROOT, env=env, timeout=300)
        outs.append(_all_bytes(out))
    assert outs[0] == outs[1] and len(outs[0]) > 20


# -- disorder -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,max_delay,fmt", [
    (1, "2 minutes", "json"), (2, "30 seconds", "parquet"), (3, "5000 ms", "avro"),
    (4, "9 minutes", "json"), (5, "1 hour", "parquet"), (6, "0", "json"),
])
def test_bounded_disorder_holds(tmp_path, seed, max_delay, fmt):
    params = GeneratorParams(seed=seed, disorder="bounded", max_delay=max_delay, format=fmt,
                             redelivery_rate=0.03, **SMALL)
    run = generate(params, tmp_path, truth=False, plot=False)
    bound = duration_ms(max_delay)
    lags = _lags(run.events_dir)
    assert lags.max() <= bound
    if bound >= 5000:
        assert lags.max() > bound * 0.5  # the disorder is real, not a sorted stream
        assert (lags > 0).sum() >= 20
    else:
        assert lags.max() == 0
    late = late_event_ids_in_dir(run.events_dir, params.watermark_delay_ms)
    assert late == _late_reference(_records_by_file(run.events_dir), params.watermark_delay_ms)
    assert run.manifest["disorder"]["no_late_events"] is (late == [])
    if bound < params.watermark_delay_ms:  # B < D: nothing can be late
        assert late == [] and run.manifest["disorder"]["late_count_by_current_watermark"] == 0


def test_late_fraction_makes_exactly_the_reported_records_late(tmp_path):
    params = GeneratorParams(late_fraction=0.02, redelivery_rate=0.02, users=300, files=12)
    run = generate(params, tmp_path, truth=False, plot=False)
    d = run.manifest["disorder"]
    files = _records_by_file(run.events_dir)
    reference = _late_reference(files, params.watermark_delay_ms)
    assert d["late_event_ids"] == reference == late_event_ids(files, params.watermark_delay_ms)
    assert d["no_late_events"] is False
    # Bounded delays below the watermark delay: only the records made late on purpose are late,
    # and they are late whether a file is judged by the previous or the current watermark.
    assert d["late_count"] == d["late_made_on_purpose"] >= 0.9 * d["late_requested"]
    assert d["late_count_by_current_watermark"] == d["late_count"]
    assert d["late_requested"] == round(0.02 * run.manifest["counts"]["events"])
    copies = Counter(r["event_id"] for f in files for r in f)
    assert all(copies[i] == 1 for i in reference)  # late events are not also redelivered
    per_file = [f["late_records"] for f in run.manifest["files"]]
    assert per_file[:2] == [0, 0] and sum(per_file) == d["late_count"]


def test_per_source_lags_impressions_behind_visits(tmp_path):
    params = GeneratorParams(disorder="per-source", impression_lag="5 minutes",
                             visit_lag="10 seconds", lag_jitter="30 seconds", **SMALL)
    run = generate(params, tmp_path, truth=False, plot=False)
    records = [parse_event(r) for f in _records_by_file(run.events_dir) for r in f]
    clicked_at = {}  # the arrival position of each click, by (user, source, target, ts)
    for position, e in enumerate(records):
        if e.event_type == "impression":
            clicked_at[(e.user_id, e.source_url, e.target_url)] = clicked_at.get(
                (e.user_id, e.source_url, e.target_url), []) + [(e.ts, position)]
    # A landing visit arrives before the click that caused it: the two collection systems.
    before = after = 0
    for position, e in enumerate(records):
        clicks = [c for c in clicked_at.get((e.user_id, e.referer, e.url), ())
                  if e.ts - 600_000 <= c[0] <= e.ts]
        if e.event_type == "visit" and clicks:
            if max(clicks)[1] > position:
                before += 1
            else:
                after += 1
    assert before > 100 and after < 0.05 * before
    assert _lags(run.events_dir).max() <= duration_ms("5 minutes") + duration_ms("30 seconds")
    assert run.manifest["disorder"]["no_late_events"] is True


def test_heavy_tail_late_events_match_the_rule(tmp_path):
    params = GeneratorParams(disorder="heavy-tail", tail_scale="6 hours", tail_alpha=1.0,
                             **SMALL)
    run = generate(params, tmp_path, truth=False, plot=False)
    d = run.manifest["disorder"]
    reference = _late_reference(_records_by_file(run.events_dir), params.watermark_delay_ms)
    assert d["late_made_on_purpose"] == 0
    assert d["late_count"] == len(reference) > 0 and d["late_event_ids"] == reference
    assert d["late_count_by_current_watermark"] > d["late_count"]  # the stricter reading
    assert d["max_arrival_delay_ms"] > params.watermark_delay_ms


def test_late_rule_on_the_chapter_7_files(ch7_dir):
    # Spark judges file k by batch k-1's watermark. Batch 1's is 12:03:45 - D, and file 2 holds
    # the visit v-signup at 12:01:10: late for D = 2m35s exactly (ts <= watermark), not 2m36s.
    assert late_event_ids_in_dir(ch7_dir, parse_duration_ms("155 seconds")) == ["v-signup"]
    assert late_event_ids_in_dir(ch7_dir, parse_duration_ms("156 seconds")) == []
    # Impression 123 (12:01:00, file 1) is judged by batch 0's watermark, 0: never late there.
    # The stricter current-watermark reading (file k by batch k's) makes it late up to 2m45s.
    assert late_event_ids_in_dir(ch7_dir, parse_duration_ms("1 second")) == [
        "i-456", "v-signup", "i-789", "v-thing"]
    assert late_event_ids_in_dir(ch7_dir, parse_duration_ms("165 seconds"), lag_batches=0) == \
        ["i-123"]
    assert late_event_ids_in_dir(ch7_dir, parse_duration_ms("166 seconds"), lag_batches=0) == []


# -- file formats ---------------------------------------------------------------------------------

def test_json_lines_have_the_spec_shape(default_run):
    first = data_files(default_run.events_dir)[0]
    lines = first.read_text().splitlines()
    assert len(lines) > 100
    for line in lines:
        record = json.loads(line)
        assert list(record) == list(EVENT_FIELDS)
        assert line == json.dumps(record)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"])
        if record["event_type"] == "impression":
            assert record["is_goal"] is None and isinstance(record["impression_id"], int)
        else:
            assert isinstance(record["is_goal"], bool) and record["impression_id"] is None
        parse_event(record)


def test_parquet_and_avro_use_the_event_schema(tmp_path):
    pq_run = generate(GeneratorParams(format="parquet", heartbeat=True, **SMALL), tmp_path / "p",
                      truth=False, plot=False)
    for f in data_files(pq_run.events_dir):
        assert pq.read_schema(f).remove_metadata() == arrow_schema(EVENT_SCHEMA)
    avro_run = generate(GeneratorParams(format="avro", heartbeat=True, **SMALL), tmp_path / "a",
                        truth=False, plot=False)
    for f in data_files(avro_run.events_dir):
        with open(f, "rb") as fh:
            reader = fastavro.reader(fh)
            assert reader.writer_schema["name"] == "streamjoin.attribution.Event"
            assert [x["name"] for x in reader.writer_schema["fields"]] == list(EVENT_FIELDS)
    # The same params in another format are the same events.
    as_parquet = read_events(pq_run.events_dir)
    assert as_parquet == read_events(avro_run.events_dir)


@pytest.mark.parametrize("fmt", ["parquet", "avro"])
def test_truth_matches_the_oracle_in_every_format(tmp_path, fmt):
    params = GeneratorParams(format=fmt, redelivery_rate=0.05, late_fraction=0.01,
                             disorder="per-source", heartbeat=True, **SMALL)
    run = generate(params, tmp_path, plot=False)
    expected = attribute_batch(read_events(run.events_dir), params.attribution_config())
    assert read_attribution_rows(run.truth_path) == expected and len(expected) > 20


# -- errors and writing ---------------------------------------------------------------------

@pytest.mark.parametrize("changes,message", [
    (dict(users=0), "--users must be at least 1"),
    (dict(late_fraction=1.5), "--late-fraction must be a probability"),
    (dict(max_delay="soon"), "--max-delay: not a duration"),
    (dict(disorder="chaotic"), "--disorder must be one of bounded, per-source, heavy-tail"),
    (dict(format="csv"), "--format must be one of json, parquet, avro"),
    (dict(start="yesterday"), "--start:"),
    (dict(pages=5, domains=4), "--pages (5) must be at least twice --domains"),
    (dict(users="many"), "--users must be an integer"),
])
def test_bad_params_are_explained(changes, message):
    with pytest.raises(ValueError) as err:
        GeneratorParams(**changes)
    assert message in str(err.value)


def test_existing_output_is_not_overwritten_by_accident(tmp_path):
    params = GeneratorParams(users=20, files=2)
    generate(params, tmp_path, truth=False, plot=False)
    with pytest.raises(OutputExists, match="--overwrite"):
        generate(params, tmp_path, truth=False, plot=False)
    again = generate(params.replace(files=1), tmp_path, truth=False, plot=False, overwrite=True)
    assert len(data_files(again.events_dir)) == 1


def test_atomic_write_hides_the_file_until_it_is_complete(tmp_path):
    final = tmp_path / "part-00000.json"

    def write(tmp: Path) -> None:
        tmp.write_text('{"partial": ')
        assert tmp.parent == final.parent and tmp.name.startswith(".")
        assert not final.exists() and data_files(tmp_path) == []

    atomic_write(final, write)
    assert final.exists() and [p.name for p in tmp_path.iterdir()] == [final.name]


def test_without_redelivery_every_event_arrives_exactly_once():
    dataset = build(GeneratorParams(users=500))
    assert len(dataset.arrival.rows) == len(dataset.events) > 5_000
    assert sorted(dataset.arrival.rows.tolist()) == list(range(len(dataset.events)))


# -- the endless stream (load mode and the Spark source) ----------------------------------------

def test_stream_is_deterministic_per_offset_range_and_bounded():
    params = GeneratorParams(users=200, sessions_per_block=50, max_delay="90 seconds",
                             redelivery_rate=0.02)
    whole, end = EventStream(params).read(Position(), 3_000)
    # A fresh stream (another process, a restarted query) reading in uneven pieces agrees.
    other, pieces, position = EventStream(params), [], Position()
    for size in (1, 499, 700, 1_000, 800):
        chunk, position = other.read(position, size)
        pieces.append(chunk)
    assert position == end and end.events == 3_000 and end.segment > 3
    glued = EventColumns.concat(pieces)
    assert (glued.seq == whole.seq).all() and (glued.ts == whole.ts).all()
    lags = np.maximum.accumulate(whole.ts) - whole.ts
    assert 0 < lags.max() <= duration_ms("90 seconds")
    assert len(np.unique(whole.seq)) < 3_000  # redelivered copies
    other = EventStream(params.replace(seed=2)).read(Position(), 100)[0]
    assert not (other.seq == whole.seq[:100]).all()


def test_stream_reader_offsets_follow_the_read_limits():
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from generators.spark_source import SyntheticEventStreamReader

    reader = SyntheticEventStreamReader({"totalRows": "2500", "sessionsPerBlock": "40",
                                         "rowsPerSecond": "0", "maxRowsPerBatch": "1000"})
    assert reader.getDefaultReadLimit() == ReadMaxRows(1000)
    offset, sizes = reader.initialOffset(), []
    while True:
        nxt = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if nxt == offset:
            break
        sizes.append(sum(hi - lo for p in reader.partitions(offset, nxt) for _, lo, hi in p.pieces))
        offset = nxt
    assert sizes == [1000, 1000, 500] and offset["events"] == 2500
    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable())["events"] == 2500
    with pytest.raises(ValueError, match="rowsPerSecond > 0 or totalRows > 0"):
        SyntheticEventStreamReader({"rowsPerSecond": "0"})
    with pytest.raises(ValueError, match="unknown streamgen option"):
        SyntheticEventStreamReader({"totalRows": "5", "colour": "red"})


# -- the truth on two processes -------------------------------------------------------------------

def test_rows_to_table_is_attribution_io_s_table(default_run, default_events):
    from attribution.spark.files import attributions_to_arrow
    from generators.truth import rows_to_table

    rows = attribute_batch(default_events, default_run.dataset.params.attribution_config())
    assert any(r.organic for r in rows) and any(not r.organic for r in rows)
    assert rows_to_table(rows).equals(attributions_to_arrow(rows))
    assert rows_to_table([]).equals(attributions_to_arrow([]))


def test_users_are_split_into_whole_sorted_ranges_of_similar_size(default_run):
    from generators.truth import read_event_table, split_by_user

    table = read_event_table(default_run.events_dir, "json")
    parts = split_by_user(table, 3)
    assert len(parts) == 3
    users = [p.column("user_id").to_pylist() for p in parts]
    # Heartbeats (no user) are dropped, every other record is in exactly one part.
    assert sum(len(u) for u in users) == table.num_rows - 1
    # Whole users, in ascending ranges of Python's string order (oracle.sort_key's order).
    assert all(max(a) < min(b) for a, b in zip(users, users[1:]))
    biggest_user = max(Counter(table.column("user_id").drop_null().to_pylist()).values())
    assert max(map(len, users)) - min(map(len, users)) <= 2 * biggest_user
    # Each part keeps the arrival order of its records.
    position = {eid: n for n, eid in enumerate(table.column("event_id").to_pylist())}
    for part in parts:
        ids = part.column("event_id").to_pylist()
        order = [position[i] for i in ids]
        assert order == sorted(order) or len(set(ids)) < len(ids)


def test_truth_shares_run_in_the_pool_and_give_the_oracle_s_rows(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from attribution.spark.files import attributions_to_arrow
    from generators.truth import compute_truth

    params = GeneratorParams(users=400, files=5, redelivery_rate=0.05, late_fraction=0.02,
                             heartbeat=True, format="avro", disorder="heavy-tail")
    run = generate(params, tmp_path, truth=False, plot=False)
    expected = attributions_to_arrow(attribute_batch(read_events(run.events_dir),
                                                     params.attribution_config()))

    class CountingPool(ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn, *args, **kwargs):
            CountingPool.submitted += 1
            return super().submit(fn, *args, **kwargs)

    with CountingPool(2) as pool:
        shared = compute_truth(run.events_dir, "avro", params.attribution_config(), pool, 3)
    assert CountingPool.submitted == 2  # two of the three ranges went to the pool
    assert shared.table.num_rows > 50 and shared.table.equals(expected)
    alone = compute_truth(run.events_dir, "avro", params.attribution_config())
    assert alone.table.equals(expected)
    assert shared.multi_candidate == alone.multi_candidate


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_two_processes_write_the_same_bytes_as_one(tmp_path, fmt):
    params = GeneratorParams(format=fmt, redelivery_rate=0.05, late_fraction=0.01,
                             heartbeat=True, **SMALL)
    one = generate(params, tmp_path / "one", processes=1)
    two = generate(params, tmp_path / "two", processes=2)  # a spawned helper: truth and pictures
    assert _all_bytes(one.out) == _all_bytes(two.out)
    assert read_attribution_rows(two.truth_path) == attribute_batch(read_events(two.events_dir),
                                                                params.attribution_config())
    assert two.skew_png.exists() and two.delays_png.exists()
    assert two.truth.num_rows == two.manifest["truth"]["rows"] > 20


# -- the pictures, the manifest's words, the event-time span ---------------------------------------

def _quantiles(lags: np.ndarray) -> dict:
    return {q: float(np.percentile(lags, q)) for q in (50, 90, 99, 99.9, 100)}


def test_bounded_and_heavy_tail_delays_differ_and_are_drawn(tmp_path):
    common = dict(seed=11, users=600, files=8, format="parquet")
    bounded = generate(GeneratorParams(disorder="bounded", max_delay="2 minutes", **common),
                       tmp_path / "bounded", truth=False, processes=1)
    heavy = generate(GeneratorParams(disorder="heavy-tail", tail_scale="10 seconds",
                                     tail_alpha=1.2, **common),
                     tmp_path / "heavy", truth=False, processes=1)
    # Same seed, same events: only the arrival differs.
    assert bounded.manifest["counts"] == heavy.manifest["counts"]
    b, h = _quantiles(_lags(bounded.events_dir)), _quantiles(_lags(heavy.events_dir))
    bound = duration_ms("2 minutes")
    assert b[100] <= bound and b[99] > 0.5 * bound
    # Uniform delays: the tail is a cliff at the bound. Pareto delays: a long tail past it.
    assert b[99.9] / b[99] < 1.5 and b[100] / b[99] < 2
    assert h[99.9] / h[99] > 4 and h[100] > 20 * bound
    assert h[90] < b[90] / 2  # yet most heavy-tail records are less late than bounded ones
    for run, q in ((bounded, b), (heavy, h)):
        d = run.manifest["disorder"]
        assert d["max_arrival_delay_ms"] == q[100]
        by_source = d["arrival_delay_by_source"]
        assert by_source["impression"]["records"] + by_source["visit"]["records"] == \
            run.manifest["counts"]["records"]
        assert max(s["max_ms"] for s in by_source.values()) == q[100]
        for png in (run.skew_png, run.delays_png):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        assert sorted(p.name for p in run.pictures) == ["delays.png", "skew.png"]


def test_zoom_window_is_the_busiest_stretch_of_the_given_width():
    from generators.skew import zoom_window

    # Sparse records an hour apart, then 50 records within a minute, then sparse again.
    hour, minute = 3_600_000, 60_000
    ts = np.concatenate([np.arange(10) * hour, 10 * hour + np.arange(50) * 1_000,
                         11 * hour + np.arange(10) * hour]).astype(np.int64)
    lo, hi = zoom_window(ts, 2 * minute)
    assert (lo, hi) == (10, 60)
    assert zoom_window(ts[:0], minute) == (0, 0)


def test_manifest_and_summary_speak_human_units(default_run):
    from joins.durations import format_duration_ms

    m = default_run.manifest
    d = m["disorder"]
    lines = m["summary"]
    assert f"max arrival delay {format_duration_ms(d['max_arrival_delay_ms'])}" in lines["disorder"]
    assert f"p99 {format_duration_ms(d['p99_arrival_delay_ms'])}" in lines["disorder"]
    assert "impressions" in lines["disorder"] and "visits" in lines["disorder"]
    for line in lines.values():
        assert not re.search(r"\d,\d{3} ms\b", line), line  # no "119,044 ms" for people
    span = m["event_time"]
    assert span["span_ms"] == span["last_ms"] - span["first_ms"] > 0
    assert format_duration_ms(span["span_ms"]) in lines["event_time"]
    assert lines["event_time"].startswith(f"event time {span['first'][:10]} ")
    # Machine-readable durations and times name their unit.
    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k, v
                yield from keys(v)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)
    for key, value in keys({k: v for k, v in m.items() if k not in ("params", "summary")}):
        # A key naming a time or a duration (its last word) carries the unit after it.
        if re.search(r"(^|_)(delay|ts|time|span|first|last)(_ms)?$", key) \
                and isinstance(value, int) and not isinstance(value, bool):
            assert key.endswith("_ms"), key


def test_span_only_places_first_sessions_and_total_span_bounds_every_event(tmp_path):
    start = ts_to_ms(GeneratorParams().start)
    common = dict(users=300, files=4, span="7 days", seed=3)
    free = build(GeneratorParams(**common))
    # Without --total-span, later sessions run on well past --span, as --help says.
    assert free.events.ts.max() > start + duration_ms("60 days")
    firsts = defaultdict(lambda: np.iinfo(np.int64).max)
    for user, t in zip(free.sessions.user.tolist(), free.sessions.start.tolist()):
        firsts[user] = min(firsts[user], t)
    assert max(firsts.values()) <= start + duration_ms("7 days")

    params = GeneratorParams(total_span="30 days", **common)
    run = generate(params, tmp_path, truth=False, plot=False)
    events = read_events(run.events_dir)
    assert max(e.ts for e in events) < start + duration_ms("30 days")
    assert min(e.ts for e in events) >= start
    assert len({e.user_id for e in events}) == 300  # every user keeps its first session
    assert run.manifest["event_time"]["last_ms"] < start + duration_ms("30 days")
    assert len(events) < len(free.events)


@pytest.mark.parametrize("changes,message", [
    (dict(total_span="7 days"), "--total-span (7 days) must be longer than --span (60 days)"),
    (dict(total_span="60 days"), "--total-span (60 days) must be longer than --span"),
    (dict(total_span="forever"), "--total-span: not a duration"),
])
def test_bad_total_span_is_explained(changes, message):
    with pytest.raises(ValueError) as err:
        GeneratorParams(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)
