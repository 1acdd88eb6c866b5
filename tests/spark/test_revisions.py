"""Section 8 on Spark: the chapter 7 files made late (watermark delay 1 minute), through the job
on every streaming layout that revises, give the changelogs derived by hand in
tests/unit/test_core_revisions.py; a checkpoint keeps the revising options it was started with;
and conflicting copies with early results fold to the oracle's rows. (The same files without an
allowed lateness, whose records are dropped and written as late: test_late_records.)

Each run answers every property of its configuration, each property a subtest: the default
layout's run with an allowed lateness is also the checkpoint its restarts are refused on, and
one stream carries the conflicting copies in both arrival orders, each order for its own users.
"""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from attribution.spark.changelog import fold_changelog
from attribution.spark.checkpoint import LAYOUT_FILE
from attribution.spark.output import read_attribution_rows, read_attributions
from commandline.exits import ExitCode
from jobs.attribution_job import parse_args, run
from shared_runs import (
    COPY_ORDERS,
    ch7_made_late,
    order_of,
    stage_conflicting_copies_in_both_orders,
)
from support import ROOT
from support.commands import command_environment, error_line
from support.outputs import PARQUET_OUTPUT

LAYOUTS = {"buckets": [], "per-user": ["--state-buckets", "0"],
           "transformWithState": ["--backend", "transformWithState"]}
BOOK_ROWS = {("g-signup", 123), ("g-receipt", 456)}
LATENESS = ["--allowed-lateness", "5 minutes"]


def _assert_lateness_revises_the_signup_goal(subtests, report, changelog, net, late) -> None:
    """The chapter 7 files made late, with 5 minutes allowed: the signup goal fires organic on
    time, then impression 123 comes within the lateness and revises it; nothing is dropped."""
    with subtests.test(msg="the changelog: signup retracted and revised LATE, receipt on time"):
        assert changelog == Counter([("g-signup", None, 1, 0, "ON_TIME"),
                                     ("g-signup", None, -1, 0, "ON_TIME"),
                                     ("g-signup", 123, 1, 1, "LATE"),
                                     ("g-receipt", 456, 1, 0, "ON_TIME")])
    with subtests.test(msg="the net table is the book's rows"):
        assert net == BOOK_ROWS
    with subtests.test(msg="no late record is written, none counted as dropped"):
        assert late == [] and report.late_rows == 0
    with subtests.test(msg="four records are late but within the lateness, so used"):
        assert report.extra["late accepted"] == 4
    with subtests.test(msg="goals and attributed goals are counted with their signs"):
        # Counted with their signs, the goals are the net table's, as are the attributed ones.
        assert (report.goals, report.attributed) == (2, 2)
    with subtests.test(msg="the report counts one revision and one retraction"):
        assert (report.extra["revisions"], report.extra["retractions"]) == (1, 1)


# The default layout's run with 5 minutes allowed is also the checkpoint its restarts are refused
# on (below). The per-user layout's run takes its checkpoint and outputs as file:// URIs (read
# through Hadoop's file system, as a cluster's paths are); the crash tests run with lateness on
# URIs too.
@pytest.mark.parametrize("layout,uri", [("per-user", True), ("transformWithState", False)],
                         ids=["per-user", "transformWithState"])
def test_allowed_lateness_revises_the_signup_goal(spark, tmp_path, ch7_dir, subtests, layout,
                                                  uri):
    """Each layout that revises, other than the default one, gives the hand-derived changelog of
    the chapter 7 files made late with 5 minutes allowed."""
    report, changelog, net, late = ch7_made_late(spark, tmp_path, ch7_dir, *LATENESS,
                                                 *LAYOUTS[layout], uri=uri)
    _assert_lateness_revises_the_signup_goal(subtests, report, changelog, net, late)


@pytest.mark.parametrize("layout", ["buckets", "transformWithState"])
def test_early_results_revise_goals_until_the_watermark_passes_them(spark, tmp_path, ch7_dir,
                                                                    layout):
    report, changelog, net, _ = ch7_made_late(spark, tmp_path, ch7_dir, *LATENESS,
                                              "--early-results", *LAYOUTS[layout])
    assert changelog == Counter([
        ("g-signup", None, 1, 0, "EARLY"), ("g-receipt", None, 1, 0, "EARLY"),
        ("g-signup", None, -1, 0, "EARLY"), ("g-signup", None, 1, 1, "ON_TIME"),
        ("g-signup", None, -1, 1, "ON_TIME"), ("g-signup", 123, 1, 2, "LATE"),
        ("g-receipt", None, -1, 0, "EARLY"), ("g-receipt", 456, 1, 1, "EARLY"),
        ("g-receipt", 456, -1, 1, "EARLY"), ("g-receipt", 456, 1, 2, "ON_TIME")])
    assert net == BOOK_ROWS
    assert (report.goals, report.attributed) == (2, 2)
    assert (report.extra["revisions"], report.extra["retractions"]) == (4, 4)


# The per-user layout's copies with early results run in the second tier (make test-slow): its
# revisions go through Spark in make test above and in test_revisions_generated.
@pytest.mark.parametrize("layout", [
    "buckets", pytest.param("per-user", marks=pytest.mark.slow), "transformWithState"])
def test_conflicting_copies_revise_early_rows_to_the_smallest_copy(spark, tmp_path, subtests,
                                                                   layout):
    """With early results the larger copies, if they come first, are emitted early; the smaller
    ones revise their rows (or retract them: the smaller copy of goal g4 is no goal), so the
    folded changelog is the oracle's rows either way round. One stream holds both orders, each
    for its own users (``shared_runs.stage_conflicting_copies_in_both_orders``)."""
    from attribution.oracle import attribute_batch
    from support.datasets import CONFLICTING_COPIES_ROWS, conflicting_copies, conflicting_copies_row

    smaller, _, common = conflicting_copies()
    with subtests.test(msg="the oracle over the smaller copies gives the expected rows"):
        assert [conflicting_copies_row(r) for r in attribute_batch(smaller + common)] == \
            CONFLICTING_COPIES_ROWS

    events = stage_conflicting_copies_in_both_orders(tmp_path / "events")
    args = parse_args(["--events", str(events), "--output", str(tmp_path / "out"),
                       "--checkpoint", str(tmp_path / "cp"), "--quiet", *PARQUET_OUTPUT,
                       "--watermark-delay", "10 minutes", "--max-files-per-trigger", "1",
                       *LATENESS, "--early-results", *LAYOUTS[layout]])
    run(spark, args)
    changelog: dict = {order: [] for order in COPY_ORDERS}
    for row in read_attribution_rows(tmp_path / "out"):
        order, own = order_of(row)
        changelog[order].append(own)
    folded: Counter = Counter(order_of(r)[0]
                              for r in fold_changelog(read_attributions(str(tmp_path / "out")))
                              .itertuples())
    for order in COPY_ORDERS:
        net: Counter = Counter()
        for r in changelog[order]:
            net[r._replace(sign=1, revision=0, emit_timing="ON_TIME")] += r.sign
        table = sorted(conflicting_copies_row(r) for r, n in net.items() if n)
        with subtests.test(msg="every row nets to 0 or 1", order=order):
            assert set(net.values()) <= {0, 1}
        with subtests.test(msg="the net table is the oracle's rows", order=order):
            assert table == CONFLICTING_COPIES_ROWS
        with subtests.test(msg="the changelog folds to as many rows", order=order):
            assert folded[order] == len(table)
        # The larger copies' rows (goal g4, g1 worth 7) are emitted early and retracted only
        # when the larger copies come first.
        larger_rows = Counter((r.goal_event_id, r.sign) for r in changelog[order]
                              if r.goal_event_id == "g4" or r.goal_value == 7.0)
        with subtests.test(msg="the larger copies' rows, emitted early, are retracted",
                           order=order):
            assert larger_rows == (Counter() if order == "smaller-first" else Counter(
                {("g4", 1): 1, ("g4", -1): 1, ("g1", 1): 1, ("g1", -1): 1}))


# A checkpoint's first run, and restarts that change its revising options one at a time: each
# restart's options, and what the refusal must say the checkpoint was started with and this run
# asks for: the options that differ, as options (a lateness of 0 and no early results, the
# defaults, are recorded as no entry at all).
RESTARTS = {
    "allowed lateness": (LATENESS, [
        (["--allowed-lateness", "10 minutes"],
         "--allowed-lateness '5 min'", "--allowed-lateness '10 min'"),
        ([], "--allowed-lateness '5 min'", "--allowed-lateness '0 ms'"),
        (["--allowed-lateness", "5 minutes", "--early-results"],
         "no early results", "--early-results"),
    ]),
    "early results": (["--early-results"], [
        ([], "--early-results", "no early results"),
        (["--early-results", "--allowed-lateness", "1 minute"],
         "--allowed-lateness '0 ms'", "--allowed-lateness '1 min'"),
    ]),
}


def _assert_restarts_refused(subtests, spark, tmp_path, ch7_dir, started: str,
                             changelog: Counter) -> None:
    """The restarts of ``RESTARTS[started]`` on the checkpoint of ``ch7_made_late``'s run in
    ``tmp_path`` with its first options (whose changelog was ``changelog``): each is refused
    before Spark starts, with one line naming what differs, and leaves the checkpoint as it was;
    the original options then still resume it, to the same changelog."""
    first, restarts = RESTARTS[started]
    checkpoint = tmp_path / "cp"
    layout = (checkpoint / LAYOUT_FILE).read_text()
    commits = sorted(p.name for p in (checkpoint / "commits").iterdir())
    common = ["--events", tmp_path / "in", "--output", tmp_path / "out", "--checkpoint",
              checkpoint, "--watermark-delay", "1 minute", "--max-files-per-trigger", "1",
              "--trigger", "available-now"]
    for options, was, asked in restarts:
        result = subprocess.run(
            [sys.executable, ROOT / "jobs" / "attribution_job.py", *map(str, common), *options],
            cwd=tmp_path, capture_output=True, text=True, env=command_environment(),
            timeout=300)
        with subtests.test(msg="the restart is refused before Spark starts, in one line",
                           options=options):
            line = error_line(result.stderr)
            assert result.returncode == ExitCode.CHECKPOINT, (options, result.stderr)
            assert "starting Spark" not in result.stderr, options
            started_with, _, this_run = line.partition("; this run asks for ")
            assert started_with.startswith(
                f"error: checkpoint {checkpoint} was started with "), line
            assert started_with.endswith(f"was started with {was}"), (options, line)
            assert this_run.startswith(f"{asked}. "), (options, line)
            assert this_run.endswith("Use the original options, or a new --checkpoint (and "
                                     "--output)."), line
        with subtests.test(msg="the refused restart leaves the layout file", options=options):
            assert (checkpoint / LAYOUT_FILE).read_text() == layout
    with subtests.test(msg="the refused restarts commit no micro-batch"):
        assert sorted(p.name for p in (checkpoint / "commits").iterdir()) == commits
    # The original options still resume it: nothing new to read, the same changelog.
    _, again, _, _ = ch7_made_late(spark, tmp_path, ch7_dir, *first)
    with subtests.test(msg="the original options resume it, to the same changelog"):
        assert again == changelog and sum(changelog.values()) > 0


def test_allowed_lateness_revises_the_signup_goal_and_its_checkpoint_refuses_other_revising_options(
        spark, tmp_path, ch7_dir, subtests):
    """The default layout (buckets) gives the hand-derived changelog of the chapter 7 files made
    late with 5 minutes allowed. Revisions keep other state (emitted rows, open goals) under
    another Spark watermark: on the same checkpoint, a restart that changes --allowed-lateness
    or adds --early-results is refused before Spark starts, with one line asking for the
    original options or a new checkpoint, and leaves the checkpoint and output as they were."""
    first, _ = RESTARTS["allowed lateness"]  # the other layouts' run, on the default one
    report, changelog, net, late = ch7_made_late(spark, tmp_path, ch7_dir, *first)
    _assert_lateness_revises_the_signup_goal(subtests, report, changelog, net, late)
    _assert_restarts_refused(subtests, spark, tmp_path, ch7_dir, "allowed lateness", changelog)


def test_a_checkpoint_started_with_early_results_refuses_a_restart_without_them_or_with_a_lateness(
        spark, tmp_path, ch7_dir, subtests):
    """A checkpoint started with --early-results (default layout, no lateness) refuses, before
    Spark starts, a restart without them and one that adds an --allowed-lateness, and leaves the
    checkpoint and output as they were."""
    first, _ = RESTARTS["early results"]
    _, changelog, _, _ = ch7_made_late(spark, tmp_path, ch7_dir, *first)
    _assert_restarts_refused(subtests, spark, tmp_path, ch7_dir, "early results", changelog)
