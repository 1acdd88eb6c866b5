"""The behaviour model: users and sessions turned into columnar event arrays, vectorised.

A session is paid (one or more clicks on the same ad, then the landing visit) or organic (an
entry visit with no impression). Both continue with a random walk over the site's links, which
sometimes reaches goals and sometimes walks on past them. A user's later paid session is often
a retargeting click: the display ad of a page an earlier ad brought the user to, so its walk
goes on from a page seen before and a goal is reached through several distinct ads. Click spam
repeats the click, within a UTC day or across midnight; some sessions also show an ad nobody
clicks; reloads repeat a URL; some steps share a millisecond with the previous event. An
impression carries its ad's campaign; a goal carries a lognormal conversion value, or none.

Everything is computed for all sessions at once with numpy (one loop iteration per walk step,
not per event), so a large dataset costs a few array passes. Strings never appear here: URLs
and users are integer indexes into the site's and the user pool's lists.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from attribution.config import MS_PER_DAY, MS_PER_MINUTE, MS_PER_SECOND

from .params import GeneratorParams
from .site import SiteArrays

VISIT, IMPRESSION = 0, 1
NULL = -1
# An ignored ad is shown within this long after the landing visit.
_IGNORED_AD_WINDOW = 10 * MS_PER_MINUTE


@dataclass
class Sessions:
    """One row per session: who, when it starts, whether it is paid, and the latest start a
    midnight-straddling click-spam session may be moved to."""

    user: np.ndarray
    start: np.ndarray
    paid: np.ndarray
    latest_start: np.ndarray

    def __len__(self) -> int:
        return len(self.user)


@dataclass
class EventColumns:
    """Events as parallel arrays. ``seq`` numbers events (it becomes the event_id);
    ``NULL`` (-1) marks a null index; ``is_goal`` only means something for visits. ``campaign``
    indexes ``SiteArrays.campaigns`` (impressions only); ``value`` is a goal's conversion value,
    NaN for none."""

    seq: np.ndarray
    user: np.ndarray
    kind: np.ndarray
    ts: np.ndarray
    url: np.ndarray
    referer: np.ndarray
    is_goal: np.ndarray
    source: np.ndarray
    target: np.ndarray
    impression_id: np.ndarray
    session: np.ndarray
    campaign: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return len(self.seq)

    def take(self, rows: np.ndarray) -> "EventColumns":
        """The events at the given positions, every column alike.

        :param rows: integer positions or a boolean mask, as numpy indexing takes.
        """
        return EventColumns(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    @staticmethod
    def concat(parts: list["EventColumns"]) -> "EventColumns":
        """The events of several parts, one after the other.

        :param parts: the parts to join, in order.
        """
        return EventColumns(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                               for f in fields(EventColumns)})


def batch_sessions(params: GeneratorParams, rng: np.random.Generator) -> Sessions:
    """Sessions of ``params.users`` users, spread over days and weeks.

    Each user has 1 + Poisson(mean - 1) sessions; the first starts uniformly in ``span``, the
    rest follow after exponential gaps, and a ``dormant_gap_prob`` share of gaps exceeds the
    lookback, so some sessions fall beyond the attribution horizon of earlier ones. With a
    ``total_span``, sessions starting at or after its end are dropped (every user keeps the
    first, which starts within ``span``) and none is moved past it (``latest_start``); the
    caller cuts the events at the end.

    :param params: the generator's settings.
    :param rng: the random source (seeded from ``params.seed``, so a seed gives one result).
    :returns: the sessions, grouped by user and in time order within a user.
    """
    n = params.users
    counts = 1 + rng.poisson(params.sessions_per_user - 1.0, n)
    total = int(counts.sum())
    user = np.repeat(np.arange(n, dtype=np.int64), counts)
    first = params.start_ms + rng.integers(0, params.ms("span") + 1, n)
    gaps = np.round(rng.exponential(max(params.ms("session_gap"), 1), total)).astype(np.int64)
    dormant = rng.random(total) < params.dormant_gap_prob
    lookback = params.lookback_ms
    gaps[dormant] = lookback + rng.integers(MS_PER_DAY, MS_PER_DAY + max(lookback // 3, 1),
                                            int(dormant.sum()))
    heads = np.cumsum(counts) - counts
    gaps[heads] = 0
    elapsed = np.cumsum(gaps)
    start = first[user] + elapsed - np.repeat(elapsed[heads], counts)
    paid = rng.random(total) < params.paid_session_prob
    end = params.end_ms
    if end is None:
        return Sessions(user, start, paid, np.full(total, np.iinfo(np.int64).max, dtype=np.int64))
    kept = start < end
    return Sessions(user[kept], start[kept], paid[kept],
                    np.full(int(kept.sum()), end - 1, dtype=np.int64))


def block_sessions(params: GeneratorParams, rng: np.random.Generator, block_start: int,
                   block_span: int) -> Sessions:
    """Sessions starting within one stream block ``[block_start, block_start + block_span)``,
    by users drawn from the pool, so users come back block after block.

    :param params: the generator's settings.
    :param rng: the random source.
    :param block_start: the block's first millisecond (epoch ms).
    :param block_span: the block's length in ms.
    :returns: ``params.sessions_per_block`` sessions, grouped by user and in time order.
    """
    n = params.sessions_per_block
    user = rng.integers(0, params.users, n)
    start = block_start + rng.integers(0, block_span, n)
    order = np.lexsort((start, user))
    paid = rng.random(n) < params.paid_session_prob
    return Sessions(user[order], start[order], paid,
                    np.full(n, block_start + block_span - 1, dtype=np.int64))


def _positions_within(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c-1 for every group of a repeat(counts) layout."""
    heads = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(heads, counts)


def _exp_ms(rng: np.random.Generator, mean_ms: int, n: int) -> np.ndarray:
    if mean_ms <= 0:
        return np.zeros(n, dtype=np.int64)
    return np.round(rng.exponential(mean_ms, n)).astype(np.int64)


def sessions_to_events(params: GeneratorParams, site: SiteArrays, sessions: Sessions,
                       rng: np.random.Generator, first_seq: int = 0) -> EventColumns:
    """Play every session and return its events (not sorted by time: arrival order is the
    disorder model's business).

    ``seq`` runs from ``first_seq``; an impression's ``impression_id`` is its ``seq``, so both
    are unique across a dataset or a stream.

    :param params: the generator's settings.
    :param site: the site's pages, links, ads and campaigns as arrays.
    :param sessions: the sessions to play (``batch_sessions`` or ``block_sessions``).
    :param rng: the random source.
    :param first_seq: the ``seq`` of the first event returned.
    """
    S = len(sessions)
    n_ads = len(site.ad_source)
    paid = sessions.paid
    ad = rng.integers(0, n_ads, S)
    # The ad each session clicks: a search ad, or, for a retargeting click, the display ad of the
    # page the anchor's search ad landed on (so the walk goes on from a page seen before).
    again, anchor = _retargeted(params, sessions, rng)
    again_landing = site.ad_target[ad[anchor[again]]]
    source, target, campaign = site.ad_source[ad], site.ad_target[ad], site.ad_campaign[ad]
    source[again] = site.display_source[again_landing]
    target[again] = again_landing
    campaign[again] = site.display_campaign[again_landing]
    spam = paid & (rng.random(S) < params.click_spam_prob)
    extra = np.where(spam, rng.integers(1, params.spam_max_repeats + 1, S), 0)
    n_clicks = np.where(paid, 1 + extra, 0).astype(np.int64)

    # Click spam across midnight: move the first click just before the next UTC midnight and
    # the second one past it, so the repeats fall into two dedup buckets.
    spam_gap = max(params.ms("spam_gap"), MS_PER_SECOND)
    t0 = sessions.start.copy()
    before = rng.integers(MS_PER_SECOND, spam_gap + 1, S)
    next_midnight = (t0 // MS_PER_DAY + 1) * MS_PER_DAY
    midnight = (spam & (rng.random(S) < params.spam_midnight_prob)
                & (next_midnight - before <= sessions.latest_start))
    t0 = np.where(midnight, next_midnight - before, t0)

    click_session = np.repeat(np.arange(S, dtype=np.int64), n_clicks)
    click_step = _positions_within(n_clicks)
    gaps = MS_PER_SECOND + _exp_ms(rng, spam_gap, len(click_session))
    crossing = midnight[click_session] & (click_step == 1)
    gaps[crossing] = before[click_session[crossing]] + rng.integers(
        MS_PER_SECOND, spam_gap + 1, int(crossing.sum()))
    gaps[click_step == 0] = 0
    elapsed = np.cumsum(gaps)
    heads = np.cumsum(n_clicks) - n_clicks
    click_ts = t0[click_session] + elapsed - np.repeat(elapsed[heads[n_clicks > 0]],
                                                       n_clicks[n_clicks > 0])
    last_click = np.zeros(S, dtype=np.int64)
    last_click[paid] = click_ts[(heads + n_clicks - 1)[paid]]
    clicks = _impressions(click_session, click_ts, source[click_session], target[click_session],
                          campaign[click_session], sessions)

    # The first visit: the ad's landing page (referer = the page that showed the ad: a search
    # page, or a publisher's for a display ad) or an organic entry.
    delay = _exp_ms(rng, params.ms("click_delay"), S)
    delay[rng.random(S) < params.tie_prob] = 0
    land_ts = np.where(paid, last_click + delay, t0)
    from_home = rng.random(S) < 0.5
    entry = np.where(from_home, site.entry_pages[rng.integers(0, len(site.entry_pages), S)],
                     rng.integers(0, site.n_pages, S))
    direct = rng.random(S) < params.direct_entry_prob
    organic_ref = np.where(direct, NULL, site.external[rng.integers(0, len(site.external), S)])
    node = np.where(paid, target, entry)
    ref = np.where(paid, source, organic_ref)
    t = land_ts.copy()

    v_session, v_ts, v_node, v_ref = [np.arange(S, dtype=np.int64)], [t.copy()], [node.copy()], \
        [ref.copy()]
    alive = np.arange(S, dtype=np.int64)
    degree = site.out_degree
    dwell = params.ms("dwell")
    for _ in range(params.max_walk):
        here = node[alive]
        keep = rng.random(len(alive)) < np.where(site.is_goal[here], params.goal_continue_prob,
                                                 params.continue_prob)
        alive, here = alive[keep], here[keep]
        reload = rng.random(len(alive)) < params.reload_prob
        movable = reload | (degree[here] > 0)  # a dead end ends the walk
        alive, here, reload = alive[movable], here[movable], reload[movable]
        if not len(alive):
            break
        deg = degree[here]
        pick = site.link_ptr[here] + np.minimum((rng.random(len(alive)) * deg).astype(np.int64),
                                                np.maximum(deg - 1, 0))
        linked = site.link_idx[np.minimum(pick, len(site.link_idx) - 1)]
        nxt = np.where(reload, here, linked)
        # A reload keeps the page's referer; a link click is referred by the current page.
        new_ref = np.where(reload, ref[alive], here)
        dt = _exp_ms(rng, dwell, len(alive))
        dt[rng.random(len(alive)) < params.tie_prob] = 0
        t[alive] += dt
        node[alive] = nxt
        ref[alive] = new_ref
        v_session.append(alive)
        v_ts.append(t[alive])
        v_node.append(nxt)
        v_ref.append(new_ref)
    vs = np.concatenate(v_session)
    vn = np.concatenate(v_node)
    n_v = len(vs)
    visits = EventColumns(
        seq=np.zeros(n_v, dtype=np.int64), user=sessions.user[vs],
        kind=np.full(n_v, VISIT, dtype=np.int8), ts=np.concatenate(v_ts), url=vn,
        referer=np.concatenate(v_ref), is_goal=site.is_goal[vn],
        source=np.full(n_v, NULL, dtype=np.int64), target=np.full(n_v, NULL, dtype=np.int64),
        impression_id=np.full(n_v, NULL, dtype=np.int64), session=vs,
        campaign=np.full(n_v, NULL, dtype=np.int64), value=np.full(n_v, np.nan))

    # Ads shown but never clicked: another ad of the catalogue, shortly after landing.
    shown = np.nonzero(rng.random(S) < params.ignored_impression_prob)[0]
    other = rng.integers(0, n_ads, len(shown))
    if n_ads > 1:
        other = np.where(paid[shown] & (other == ad[shown]), (other + 1) % n_ads, other)
    ignored = _impressions(shown, land_ts[shown] + rng.integers(0, _IGNORED_AD_WINDOW, len(shown)),
                           site.ad_source[other], site.ad_target[other], site.ad_campaign[other],
                           sessions)
    goals = np.nonzero(visits.is_goal)[0]
    visits.value[goals] = goal_values(params, rng, len(goals))

    # Numbering follows this layout: clicks (each session's in click order), ignored ads, then
    # visits step by step. So when two events of a session share a millisecond, the earlier
    # step has the smaller event_id, and (ts, event_id) order stays causal without a sort.
    events = EventColumns.concat([clicks, ignored, visits])
    events.seq = first_seq + np.arange(len(events), dtype=np.int64)
    is_imp = events.kind == IMPRESSION
    events.impression_id = np.where(is_imp, events.seq, NULL)
    return events


def _retargeted(params: GeneratorParams, sessions: Sessions,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Which sessions are retargeting clicks, and each one's *anchor*: the same user's latest
    paid session before it that was not a retargeting click (sessions are grouped by user, in
    time order). A paid session that follows a paid session of the same user is one with
    ``retarget_prob``; so a user's first paid session never is, and always anchors."""
    S = len(sessions)
    step = np.arange(S, dtype=np.int64)
    chance = rng.random(S)  # drawn whatever the knobs, so later draws never shift
    latest_paid = np.maximum.accumulate(np.where(sessions.paid, step, -1))
    previous = np.concatenate([[-1], latest_paid[:-1]]).astype(np.int64)
    follows = (previous >= 0) & (sessions.user[np.maximum(previous, 0)] == sessions.user)
    again = sessions.paid & follows & (chance < params.retarget_prob)
    anchor = np.maximum.accumulate(np.where(sessions.paid & ~again, step, -1))
    return again, anchor


def goal_values(params: GeneratorParams, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` goals' conversion values: lognormal with median ``goal_value_median`` and log
    standard deviation ``goal_value_sigma``, rounded to cents; a ``goal_value_null_prob`` share
    is NaN (no value).

    :param params: the generator's settings.
    :param rng: the random source.
    :param n: how many values to draw.
    """
    normal, unknown = rng.standard_normal(n), rng.random(n)
    values = np.round(params.goal_value_median * np.exp(params.goal_value_sigma * normal), 2)
    values[unknown < params.goal_value_null_prob] = np.nan
    return values


def _impressions(session: np.ndarray, ts: np.ndarray, source: np.ndarray, target: np.ndarray,
                 campaign: np.ndarray, sessions: Sessions) -> EventColumns:
    n = len(session)
    return EventColumns(
        seq=np.zeros(n, dtype=np.int64), user=sessions.user[session],
        kind=np.full(n, IMPRESSION, dtype=np.int8), ts=ts.astype(np.int64),
        url=np.full(n, NULL, dtype=np.int64), referer=np.full(n, NULL, dtype=np.int64),
        is_goal=np.zeros(n, dtype=bool), source=source.astype(np.int64),
        target=target.astype(np.int64), impression_id=np.full(n, NULL, dtype=np.int64),
        session=session.astype(np.int64), campaign=campaign.astype(np.int64),
        value=np.full(n, np.nan))
