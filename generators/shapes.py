"""Hand-built event shapes that stress the referer graph, with answers known by construction.

Shared by the tests and the benchmarks (``benchmarks.core``, ``benchmarks.hot_key``):

* ``chain_events``: one click, then one long referer chain of visits with a goal every so often;
* ``repeat_events``: visits over a few pages with random referers (URL cycles, repeat visits);
* ``hot_key_events``: one user with many sessions over the same pages, so that every earlier
  landing page refers into every later session and the time-respecting graph has a path from
  every impression to every later goal. A walk that does not stop early, or that re-walks history
  per goal, is quadratic here. The spec's answer stays simple and is stated independently of the
  core by ``hot_key_expected_rows``: a paid session's goal is credited to its own click (every
  earlier click was consumed by its own goal) with the trail ``/landing, /p1, ..., /p7``; an
  organic session's goal is organic.

A hot-key session is an ad click (a search URL unique to the session) or, every
``organic_every``-th session, an organic entry; then a landing page, seven pages and a goal::

    impression (search?q=k -> /landing)   paid sessions
    impression (news -> /never-visited)   organic sessions, shape "ignored-ads" only
    /landing  <- search?q=k (paid) or http://social.example/ (organic)
    /p1 <- /landing, /p2 <- /p1, ..., /p7 <- /p6
    /goal <- /p7                                  (a goal)
"""
from __future__ import annotations

import random

from attribution.events import Event
from joins.durations import MS_PER_MINUTE, MS_PER_SECOND

CHAIN_USER = "bench-user"
SEARCH = "http://search.example/?q=bench"
REPEAT_PAGES = 20


def _visit(n: int, url: str, referer: str, is_goal: bool = False) -> Event:
    return Event(f"v{n:07d}", CHAIN_USER, "visit", (n + 1) * MS_PER_SECOND, url=url,
                 referer=referer, is_goal=is_goal)


def click_event(n: int, target: str, ts_offset: int = 0) -> Event:
    """The chain user's ad click number ``n``.

    :param n: the click's number: its impression id, and its time in seconds after the epoch.
    :param target: the landing URL.
    :param ts_offset: milliseconds added to its time.
    """
    return Event(f"i{n:07d}", CHAIN_USER, "impression", n * MS_PER_SECOND + ts_offset,
                 impression_id=n, source_url=SEARCH, target_url=target)


def chain_events(visits: int, goal_every: int) -> list[Event]:
    """A click and one referer chain of visited pages.

    :param visits: how many visits the chain has.
    :param goal_every: every this-many-th page is a goal.
    """
    events = [click_event(0, "/p0")]
    referer = SEARCH
    for n in range(visits):
        url = f"/p{n}"
        events.append(_visit(n, url, referer, is_goal=(n + 1) % goal_every == 0))
        referer = url
    return events


def repeat_events(visits: int, goal_every: int, seed: int) -> list[Event]:
    """Visits over a few pages with random referers: URL cycles and many repeat visits.

    An ad click precedes every 50th visit.

    :param visits: how many visits.
    :param goal_every: every this-many-th visit is a goal.
    :param seed: seeds the random choice of pages and referers.
    """
    rng = random.Random(seed)
    pages = [f"/page{k}" for k in range(REPEAT_PAGES)]
    events = []
    for n in range(visits):
        url = rng.choice(pages)
        if n % 50 == 0:
            events.append(click_event(n, url, ts_offset=500))  # just before visit n (at n+1 s)
            referer = SEARCH
        else:
            referer = rng.choice(pages)
        events.append(_visit(n, url, referer, is_goal=n % goal_every == goal_every - 1))
    return events


HOT_USER = "hot-user"
PAGES = tuple(f"/p{n}" for n in range(1, 8))
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
SOCIAL = "http://social.example/"
NEWS = "http://news.example/"


def _search(k: int) -> str:
    return f"http://search.example/?q=session-{k}"


def is_paid(k: int, organic_every: int) -> bool:
    """Whether hot-key session ``k`` starts with an ad click.

    :param k: the session's number, from 0.
    :param organic_every: every this-many-th session is organic (0: none).
    """
    return organic_every <= 0 or k % organic_every != organic_every - 1


SHAPES = ("clicks-only", "ignored-ads")


def hot_key_events(sessions: int, organic_every: int = 10,
                   shape: str = "ignored-ads") -> list[Event]:
    """One hot user's events, in time order: ``sessions`` sessions of 10 events, one a minute,
    all over the same pages (see the module docstring).

    :param sessions: how many sessions.
    :param organic_every: every this-many-th session is organic (0: none).
    :param shape: ``"clicks-only"`` or ``"ignored-ads"`` (organic sessions also get an ad that
        leads nowhere, so an unconsumed impression always exists).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    events = []
    for k in range(sessions):
        t0 = START_MS + k * MS_PER_MINUTE
        paid = is_paid(k, organic_every)
        if paid or shape == "ignored-ads":
            events.append(Event(f"s{k:06d}-ad", HOT_USER, "impression", t0, impression_id=k,
                                source_url=_search(k) if paid else NEWS,
                                target_url="/landing" if paid else "/never-visited"))
        referer = _search(k) if paid else SOCIAL
        path = ("/landing", *PAGES, "/goal")
        for step, url in enumerate(path, start=1):
            events.append(Event(f"s{k:06d}-v{step}", HOT_USER, "visit",
                                t0 + step * 5 * MS_PER_SECOND,
                                url=url, referer=referer, is_goal=url == "/goal"))
            referer = url
    return events


def hot_key_expected_rows(sessions: int, organic_every: int = 10) -> list[tuple]:
    """The spec's answer for ``hot_key_events``, derived by hand (see the module docstring).

    :param sessions: how many sessions.
    :param organic_every: every this-many-th session is organic (0: none).
    :returns: ``(goal_event_id, impression_id, trail)`` per goal, in goal order.
    """
    trail = ("/landing", *PAGES)
    return [(f"s{k:06d}-v9", k, trail) if is_paid(k, organic_every) else (f"s{k:06d}-v9", None, ())
            for k in range(sessions)]
