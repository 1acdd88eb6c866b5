"""One generated stream that carries the streaming job's scenarios as separate users, and what
the rules say a run over it must do, micro-batch by micro-batch (no Spark here).

``rich_stream`` writes ``FILES`` JSON-lines files in arrival order. Their users, by group (the
text before ``:`` in a user id, ``group_of``):

* ``multi-touch``: ``support.datasets.multi_touch_events``' generated sessions, where many goals
  have two or more ad clicks upstream, with campaigns and values;
* ``random``: a second generated dataset (another site and seed), random bounded disorder with
  redelivered copies, and its generator's truth;
* ``ch7``: the chapter 7 files' events (user ``ch7:UserX``), the goals a micro-batch before the
  impressions they are credited to;
* ``late``: the chapter 7 events again (user ``late:UserX``), where impressions 456 and 789 and
  the visits leading from them arrive after the watermark has passed them;
* ``copies-smaller-first`` and ``copies-smaller-last``: ``support.datasets.conflicting_copies``, one
  copy of each record before the restart and the other copy after it, the smaller copies first in
  one group and last in the other (the same event ids in both: records are a user's);
* ``shrink``: alice and bob, whose state garbage collection must drop while carol, who comes
  later, is still held.

The two generated datasets are merged in the order of their running maximum event time, so that
no record arrives further behind the latest event time seen than it did in its own dataset (the
disorder bound, 2 minutes), and cut into files; the hand-made groups are shifted in time to the
micro-batches they are read in. A final heartbeat lies past every user's lookback: the last
micro-batch fires every goal and empties the state.

The job reads the files ``FILES_PER_TRIGGER`` at a time (``JOB_OPTIONS``, plus a layout's
``LAYOUTS`` options): the first ``RUN_1_FILES`` in one run, the rest in a second run on the same
checkpoint. ``BATCH_PLAN`` lists the micro-batches that
gives, timer-only ones included; ``simulate`` drives one ``UserAttribution`` per user through
them the way each backend does (Spark's late-row rule, ``generators.disorder``; timers due once
the watermark reaches a user's next wake-up), for the figures of each micro-batch.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from attribution.config import MODELS, AttributionConfig, parse_duration_ms
from attribution.core import UserAttribution
from attribution.events import Event, parse_event
from attribution.oracle import sort_key
from attribution.rows import Attribution
from attribution.spark.files import read_event_records, read_events, write_events
from support.datasets import CH7_DIR, conflicting_copies, multi_touch_events

# The run's settings: every model; a lookback short enough that users leave the state within the
# generated two months; the half-life the multi-touch sessions (a day apart) make meaningful.
LOOKBACK = "7 days"
HALF_LIFE = "2 days"
WATERMARK_DELAY = "10 minutes"
CONFIG = AttributionConfig(models=MODELS, lookback_ms=parse_duration_ms(LOOKBACK),
                           half_life_ms=parse_duration_ms(HALF_LIFE))
DELAY_MS = parse_duration_ms(WATERMARK_DELAY)
# Each stream backend with its default state layout, then the other layout.
LAYOUTS = {"applyInPandasWithState": ("--backend", "applyInPandasWithState"),
           "applyInPandasWithState-per-user": ("--backend", "applyInPandasWithState",
                                               "--state-buckets", "0"),
           "transformWithState": ("--backend", "transformWithState"),
           "transformWithState-declared": ("--backend", "transformWithState",
                                           "--tws-state", "declared")}
FILES = 8
FILES_PER_TRIGGER = 2
RUN_1_FILES = 4
JOB_OPTIONS = ("--models", "all", "--half-life", HALF_LIFE, "--lookback", LOOKBACK,
               "--watermark-delay", WATERMARK_DELAY,
               "--max-files-per-trigger", str(FILES_PER_TRIGGER))
# The micro-batches of the two runs, as the files each reads: every run ends with a timer-only
# micro-batch at the watermark its last files set.
BATCH_PLAN: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3), (), (4, 5), (6, 7), ())
RUN_BATCHES = (3, 3)

MINUTE = 60_000
# The chapter 7 events are times of 1970-01-01; the story starts at noon.
CH7_NOON_MS = 12 * 3600 * 1000


def group_of(user_id: str) -> str:
    """The scenario a user belongs to: the text before ``:`` in its id."""
    return user_id.split(":", 1)[0]


@dataclass
class RichStream:
    """The files ``rich_stream`` wrote and what is known of them before any run.

    :ivar paths: the event files, in arrival (name) order.
    :ivar files: each file's records, as written.
    :ivar random_truth: the ``random`` users' ``last_touch`` rows in the generator's truth
        file, under their ids here.
    :ivar random_manifest: that dataset's manifest.
    :ivar copies_base_ms: the time minute 0 of ``support.datasets.conflicting_copies`` was moved to.
    :ivar intended_late: ``(user_id, event_id)`` of the records placed behind the watermark.
    """

    paths: list[Path]
    files: list[list[Event]]
    random_truth: list[Attribution]
    random_manifest: dict
    copies_base_ms: int
    intended_late: set = field(default_factory=set)

    def batches(self, plan: Sequence[Sequence[int]] = BATCH_PLAN) -> list[list[Event]]:
        """The records of each micro-batch of ``plan`` (a tuple of file numbers each)."""
        return [[e for k in files for e in self.files[k]] for files in plan]

    def records(self) -> list[Event]:
        """Every record, in arrival order."""
        return [e for records in self.files for e in records]


def _read(path: Path, user_prefix: str) -> list[Event]:
    """A generated file's visits and impressions, each user renamed into its group."""
    return [e._replace(user_id=f"{user_prefix}:{e.user_id}")
            for e in map(parse_event, read_event_records(path)) if e.event_type != "heartbeat"]


def _merged(*sequences: list[Event]) -> list[Event]:
    """Records of several arrival orders as one: by each record's running maximum event time in
    its own order, so that no record lies further behind the records before it than it did."""
    keyed = []
    for n, sequence in enumerate(sequences):
        top = None
        for position, e in enumerate(sequence):
            top = e.ts if top is None else max(top, e.ts)
            keyed.append((top, n, position, e))
    return [e for *_, e in sorted(keyed, key=lambda k: k[:3])]


def _shifted(events, by_ms: int, user: Optional[str]) -> list[Event]:
    return [e._replace(ts=e.ts + by_ms, user_id=user if e.user_id is not None else None)
            for e in events]


def _ch7_parts() -> list[list[Event]]:
    return [[parse_event(r) for r in read_event_records(f)]
            for f in sorted(CH7_DIR.glob("part-*.json"))]


def rich_stream(dest: Path) -> RichStream:
    """Generate the datasets, place the scenarios and write the files under ``dest / "src"``.

    :param dest: a new directory.
    """
    from generators.dataset import generate
    from generators.params import GeneratorParams
    from generators.truth import read_truth

    touch_dir = multi_touch_events(dest / "multi-touch")
    touch = [e for f in sorted(touch_dir.glob("part-*.json")) for e in _read(f, "multi-touch")]
    params = GeneratorParams(users=40, seed=11, files=7, heartbeat=True, disorder="bounded",
                             max_delay="2 minutes", redelivery_rate=0.05,
                             watermark_delay=WATERMARK_DELAY, lookback=LOOKBACK,
                             total_span="64 days")
    generated = generate(params, dest / "random", plot=False)
    random = [e for f in generated.event_files for e in _read(f, "random")]
    truth = [r._replace(user_id=f"random:{r.user_id}") for r in read_truth(generated.truth_path)]
    manifest = json.loads((generated.out / "manifest.json").read_text())

    merged = _merged(touch, random)
    cut = [round(k * len(merged) / FILES) for k in range(FILES + 1)]
    files = [merged[a:b] for a, b in zip(cut, cut[1:])]
    # The latest generated event time of each run's first micro-batch's files (G0) and of the
    # first run (G1): the hand-made groups sit just around them, so that they neither move the
    # watermark by more than a few minutes nor arrive behind it.
    g0 = max(e.ts for k in BATCH_PLAN[0] for e in files[k])
    g1 = max(e.ts for k in (*BATCH_PLAN[0], *BATCH_PLAN[1]) for e in files[k])

    ch7 = _ch7_parts()
    # ch7: the goals in micro-batch 0, the impressions they are credited to in micro-batch 1.
    on = _shifted([e for part in ch7 for e in part], g0 - 2 * MINUTE - CH7_NOON_MS, "ch7:UserX")
    by_part = [len(part) for part in ch7]
    ends = [sum(by_part[:k + 1]) for k in range(len(by_part))]
    files[1] += on[:ends[0]]
    files[2] += on[ends[0]:ends[3]]
    files[3] += on[ends[3]:]  # parts 4 to 6, its heartbeat last
    # late: the same story an hour behind micro-batch 0; parts 2 and 3 arrive after the restart,
    # when the watermark of the first run (past G1) has long passed them.
    late = [_shifted(part, g0 - 60 * MINUTE - CH7_NOON_MS, "late:UserX") for part in ch7[:6]]
    files[0] += late[0] + late[1] + late[4] + late[5]
    files[4] += late[2] + late[3]
    intended_late = {(e.user_id, e.event_id) for e in late[2] + late[3]}

    # The conflicting copies: minute 0 two minutes before G1, the group's first copies before
    # the restart and the others after it.
    smaller, larger, common = conflicting_copies()
    copies_base = g1 - 2 * MINUTE
    shift = copies_base - min(e.ts for e in smaller + larger + common)
    for group, (first, second) in (("copies-smaller-first", (smaller, larger)),
                                   ("copies-smaller-last", (larger, smaller))):
        def moved(events):
            return [e._replace(ts=e.ts + shift, user_id=f"{group}:{e.user_id}") for e in events]
        files[3] += moved(common + first)
        files[4] += moved(second)

    # shrink: alice and bob nine days before G0 (their lookback has passed by micro-batch 1);
    # carol just before G1, still within hers when the first run ends.
    nine_days = 9 * 24 * 60 * MINUTE
    at = g0 - nine_days
    files[0] += [
        Event("a-imp", "shrink:alice", "impression", at, impression_id=1, source_url="s",
              target_url="t"),
        Event("a-visit", "shrink:alice", "visit", at + MINUTE, url="t", referer="s"),
        Event("a-goal", "shrink:alice", "visit", at + 2 * MINUTE, url="buy", referer="t",
              is_goal=True),
        Event("b-visit", "shrink:bob", "visit", at + MINUTE, url="home")]
    files[3] += [Event("c-visit", "shrink:carol", "visit", g1 - 3 * MINUTE, url="home")]

    # Past every user's lookback and dedup bucket: the last timer-only micro-batch empties
    # the state.
    latest = max(e.ts for records in files for e in records)
    files[-1] += [Event("hb-end", None, "heartbeat",
                        latest + DELAY_MS + CONFIG.lookback_ms + CONFIG.dedup_window_ms + 1)]

    src = dest / "src"
    src.mkdir()
    paths = []
    for k, records in enumerate(files):
        paths.append(src / f"part-{k:05d}.json")
        write_events(records, paths[-1], "json")
    # What a reader of the files gets is what every expectation is computed from.
    return RichStream(paths, [read_events(p) for p in paths], sorted(truth, key=sort_key),
                      manifest, copies_base, intended_late)


def late_records(batches: Sequence[Sequence[Event]], delay_ms: int,
                 lag_batches: int = 1) -> list[Event]:
    """The records Spark drops as late: those of micro-batch ``b`` at or below the watermark of
    micro-batch ``b - lag_batches`` (Spark's rule is 1: ``generators.disorder``; 0 is the
    stricter reading), heartbeats aside, which never reach the stateful stage.

    :param batches: each micro-batch's records, timer-only ones included (empty).
    :param delay_ms: the watermark delay.
    :param lag_batches: 1 or 0.
    """
    marks = watermarks(batches, delay_ms)
    dropped = []
    for b, records in enumerate(batches):
        judged = marks[b - lag_batches] if b >= lag_batches else 0
        dropped += [e for e in records if e.event_type != "heartbeat" and e.ts <= judged]
    return dropped


def watermarks(batches: Sequence[Sequence[Event]], delay_ms: int) -> list[int]:
    """Spark's watermark of each micro-batch: the latest event time of the micro-batches before
    it, less the delay (0 until one had records)."""
    marks, seen = [], None
    for records in batches:
        marks.append(0 if seen is None else max(0, seen - delay_ms))
        if records:
            top = max(e.ts for e in records)
            seen = top if seen is None else max(seen, top)
    return marks


def watermark_text(ms: int) -> str:
    """A watermark as Spark's progress reports it."""
    moment = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass
class BatchFigures:
    """What the rules say one micro-batch does.

    :ivar input: records read (heartbeats and late ones included).
    :ivar late: records dropped as late.
    :ivar watermark: the micro-batch's watermark (epoch ms; 0: none yet).
    :ivar goals: the goals it fires.
    :ivar attributed: per model, the goals it credits to an impression.
    :ivar users: the users held in state after it.
    :ivar rows: the rows it emits.
    """

    input: int
    late: int
    watermark: int
    goals: int
    attributed: dict
    users: frozenset
    rows: list


def simulate(batches: Sequence[Sequence[Event]], config: AttributionConfig,
             delay_ms: int) -> list[BatchFigures]:
    """Each micro-batch's figures, from one ``UserAttribution`` per user driven as the backends
    drive it: a micro-batch's on-time records are added, then every user that got records or
    whose next wake-up the watermark has reached advances to the watermark; an empty state is
    dropped.

    :param batches: each micro-batch's records, timer-only ones included (empty).
    :param config: the run's rules.
    :param delay_ms: the watermark delay.
    """
    marks = watermarks(batches, delay_ms)
    dropped = {id(e) for e in late_records(batches, delay_ms)}
    states: dict[str, UserAttribution] = {}
    figures = []
    for records, watermark in zip(batches, marks):
        arrived: dict[str, list[Event]] = defaultdict(list)
        for e in records:
            if e.event_type != "heartbeat" and id(e) not in dropped:
                arrived[e.user_id].append(e)
        # Held states are never empty, so each has a next wake-up.
        due = {u for u, s in states.items() if s.next_wakeup() <= watermark}
        rows = []
        for user in sorted(set(arrived) | due):
            state = states.setdefault(user, UserAttribution(user, config))
            state.add(arrived.get(user, ()))
            rows += state.advance(watermark)
            if state.is_empty:
                del states[user]
        goals = {(r.user_id, r.goal_event_id) for r in rows}
        attributed = {m: len({(r.user_id, r.goal_event_id) for r in rows
                              if r.model == m and not r.organic}) for m in config.models}
        late = sum(id(e) in dropped for e in records)
        figures.append(BatchFigures(len(records), late, watermark, len(goals), attributed,
                                    frozenset(states), sorted(rows, key=sort_key)))
    return figures


def users_in_checkpoint(spark, checkpoint: Path, layout: str) -> set[str]:
    """The users a checkpoint's state holds after its last committed micro-batch, read with
    Spark's state data source.

    :param spark: the session.
    :param checkpoint: the query's checkpoint.
    :param layout: a name of ``LAYOUTS``.
    """
    from attribution.spark.apply_in_pandas import decode_bucket, state_blob

    # The RocksDB provider reports to a coordinator that exists once the query manager does.
    spark.streams  # noqa: B018
    reader = spark.read.format("statestore")
    if layout.startswith("transformWithState"):
        # The compact layout's one value per user, the declared layout's wake-up per user.
        variable = "wakeup" if layout.endswith("-declared") else "user"
        frame = reader.option("stateVarName", variable).load(str(checkpoint))
        return {r.user_id for r in frame.select("key.user_id").collect()}
    frame = reader.load(str(checkpoint))
    if layout.endswith("-per-user"):
        return {r.user_id for r in frame.select("key.user_id").collect()}
    return {user for r in frame.select("value.groupState.state").collect()
            for user in decode_bucket(state_blob(r.state))[0]}
