"""The site model: a networkx graph of pages and the search pages that advertise them.

Each advertiser domain is a set of pages ordered from its home page down; forward links follow
that order (a DAG), and a few back links point up again, so referer chains revisit URLs and form
cycles in URL space. Some deeper pages are goals. Search pages show ads whose targets are landing
pages. Every page that is not a goal also has one display ad, shown on a publisher page (one of
the external referers) to users who saw the page before (retargeting). Every ad, search or
display, belongs to one campaign of the advertiser (domain) it lands on. Names (domains, paths,
search queries, campaigns, user ids) come from a seeded Faker, drawn once into small pools;
everything per event later is integer indexing into those pools.

The graph is also flattened into numpy arrays (``SiteArrays``) for the vectorised walks.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
from faker import Faker

from .params import GeneratorParams

PAGE, SEARCH = "page", "search"
LINK, AD = "link", "ad"
_GOAL_SUFFIXES = ("thank-you", "receipt", "join-mailing-list", "order-confirmed", "welcome",
                  "download-complete")
_SEARCH_HOSTS = 4
# A separate stream of the seed for names, so adding a structural knob never renames pages.
_NAMES_TAG = 0x5173
# Campaigns and display ads draw from streams of their own, so that their knobs never change
# the pages, the links or the search ads.
_CAMPAIGN_NAMES_TAG = 0xCA11
_CAMPAIGN_STREAM = 12


@dataclass(frozen=True)
class SiteArrays:
    """The site as arrays: node ``i`` has URL ``urls[i]``; pages are ``0..n_pages-1``."""

    urls: list[str]              # pages, then search pages, then external referers
    n_pages: int
    n_search: int
    is_goal: np.ndarray          # bool per page
    link_ptr: np.ndarray         # CSR over page -> page links
    link_idx: np.ndarray
    ad_source: np.ndarray        # one entry per search ad: the search page's node id
    ad_target: np.ndarray        # ... its landing page
    ad_campaign: np.ndarray      # ... and its campaign, an index into ``campaigns``
    display_source: np.ndarray   # per page: the URL index of its display ad's publisher page
    display_campaign: np.ndarray  # ... and that ad's campaign (both NULL (-1) for goals)
    campaigns: list[str]
    entry_pages: np.ndarray      # home pages, favoured as organic entry points
    external: np.ndarray         # URL indexes of external referers

    @property
    def out_degree(self) -> np.ndarray:
        """Each page's number of outgoing links."""
        return np.diff(self.link_ptr)


def _faker(seed: int, tag: int = _NAMES_TAG) -> Faker:
    fake = Faker("en_US")
    fake.seed_instance(seed * 65_537 + tag)
    return fake


def _unique(draw, count: int, limit: int = 50) -> list[str]:
    """``count`` distinct values from ``draw()``; a list, so the order is the draw order."""
    out: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < count:
        value = draw()
        attempts += 1
        if value not in seen:
            seen.add(value)
            out.append(value)
        elif attempts > limit * count:
            # Faker's pools are finite; disambiguate instead of looping forever.
            value = f"{value}{len(out)}"
            seen.add(value)
            out.append(value)
    return out


def build_site(params: GeneratorParams) -> nx.DiGraph:
    """Build the site graph. Nodes are ints in insertion order with attributes ``url``,
    ``kind`` (page/search), ``domain`` and ``is_goal``; edges carry ``kind`` (link/ad).
    Campaigns: see ``_add_campaigns``.

    :param params: the generator's parameters (seed, pages, domains, links, ads, goals).
    """
    rng = np.random.Generator(np.random.PCG64([params.seed, 11]))
    fake = _faker(params.seed)
    domains = _unique(fake.domain_name, params.domains)
    graph = nx.DiGraph()

    # Pages: split as evenly as possible; page 0 of each domain is its home page.
    sizes = np.full(params.domains, params.pages // params.domains)
    sizes[: params.pages % params.domains] += 1
    node = 0
    domain_pages: list[np.ndarray] = []
    for d, (domain, size) in enumerate(zip(domains, sizes)):
        size = int(size)
        paths = _unique(lambda: fake.uri_path(deep=int(rng.integers(1, 4))), size - 1)
        depth = np.arange(size) / max(size - 1, 1)
        # Goals sit deeper in the site; the deepest page is always one, so every site converts.
        goal = rng.random(size) < np.minimum(1.0, 2.0 * params.goal_fraction * depth)
        goal[0] = False
        goal[-1] = True
        ids = np.arange(node, node + size)
        for i in range(size):
            if i == 0:
                url = f"https://www.{domain}/"
            elif goal[i]:
                suffix = _GOAL_SUFFIXES[i % len(_GOAL_SUFFIXES)]
                url = f"https://www.{domain}/{paths[i - 1]}/{suffix}"
            else:
                url = f"https://www.{domain}/{paths[i - 1]}"
            graph.add_node(int(ids[i]), url=url, kind=PAGE, domain=d, is_goal=bool(goal[i]))
        # A spanning parent link keeps every page reachable from home; extra forward links
        # make the DAG bushy; back links (to an earlier page) close cycles in URL space.
        for i in range(1, size):
            graph.add_edge(int(ids[rng.integers(0, i)]), int(ids[i]), kind=LINK)
        for i in range(size - 1):
            for j in rng.integers(i + 1, size, params.links_per_page):
                graph.add_edge(int(ids[i]), int(ids[j]), kind=LINK)
        for i in range(1, size):
            if rng.random() < params.back_link_prob:
                graph.add_edge(int(ids[i]), int(ids[rng.integers(0, i)]), kind=LINK)
        domain_pages.append(ids)
        node += size

    # Search pages: a few search engines, many queries; each shows ads for landing pages.
    hosts = _unique(fake.domain_word, _SEARCH_HOSTS)
    queries = _unique(lambda: "+".join(fake.words(int(rng.integers(1, 4)))), params.search_pages)
    landing = np.array([n for n, a in graph.nodes(data=True) if not a["is_goal"]])
    for q, query in enumerate(queries):
        host = hosts[q % len(hosts)]
        graph.add_node(node, url=f"https://search.{host}.com/search?q={query}", kind=SEARCH,
                       domain=-1, is_goal=False)
        targets = rng.choice(landing, size=min(params.ads_per_search, len(landing)), replace=False)
        for t in targets:
            graph.add_edge(node, int(t), kind=AD)
        node += 1
    graph.graph["external_referers"] = _unique(
        lambda: f"https://{fake.domain_name()}/{fake.uri_path(deep=1)}", params.external_referers)
    _add_campaigns(graph, params)
    return graph


def _add_campaigns(graph: nx.DiGraph, params: GeneratorParams) -> None:
    """Name ``campaigns_per_domain`` campaigns per advertiser (the graph's ``campaigns``, one
    advertiser after another), put each search ad in one campaign of the advertiser it lands on
    (``campaign`` on the ad edge), and give every page that is not a goal its display ad: a
    publisher page (``display_source``, an index into ``external_referers``) and a campaign
    (``display_campaign``), node attributes. All drawn at random."""
    rng = np.random.Generator(np.random.PCG64([params.seed, _CAMPAIGN_STREAM]))
    per_domain = params.campaigns_per_domain
    names = _unique(_faker(params.seed, _CAMPAIGN_NAMES_TAG).catch_phrase,
                    params.domains * per_domain)
    graph.graph["campaigns"] = names

    def campaign_of(page: int) -> str:
        return names[graph.nodes[page]["domain"] * per_domain + int(rng.integers(0, per_domain))]

    for source, target, kind in graph.edges(data="kind"):
        if kind == AD:
            graph.edges[source, target]["campaign"] = campaign_of(target)
    publishers = len(graph.graph["external_referers"])
    for page, attributes in graph.nodes(data=True):
        if attributes["kind"] == PAGE and not attributes["is_goal"]:
            attributes["display_source"] = int(rng.integers(0, publishers))
            attributes["display_campaign"] = campaign_of(page)


def link_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """The page-to-page link subgraph (what a visitor can walk).

    :param graph: the site graph from ``build_site``.
    """
    return graph.edge_subgraph([(u, v) for u, v, k in graph.edges(data="kind") if k == LINK])


def forward_links(graph: nx.DiGraph) -> nx.DiGraph:
    """The links that point deeper into a site; this subgraph is a DAG by construction.

    :param graph: the site graph from ``build_site``.
    """
    return graph.edge_subgraph([(u, v) for u, v, k in graph.edges(data="kind")
                                if k == LINK and v > u])


def to_arrays(graph: nx.DiGraph) -> SiteArrays:
    """Flatten the graph to CSR arrays, keeping networkx's insertion order (deterministic).

    :param graph: the site graph from ``build_site``.
    :raises ValueError: the nodes are not numbered 0..n-1, pages first.
    """
    nodes = list(graph.nodes)
    if nodes != list(range(len(nodes))):
        raise ValueError("site graph nodes must be 0..n-1 in insertion order")
    pages = [n for n in nodes if graph.nodes[n]["kind"] == PAGE]
    n_pages = len(pages)
    searches = [n for n in nodes if graph.nodes[n]["kind"] == SEARCH]
    if pages != list(range(n_pages)):
        raise ValueError("site graph must list pages before search pages")
    urls = [graph.nodes[n]["url"] for n in nodes] + list(graph.graph["external_referers"])
    degrees, targets = [], []
    for n in pages:
        succ = [v for v in graph.successors(n) if graph.edges[n, v]["kind"] == LINK]
        degrees.append(len(succ))
        targets.extend(succ)
    link_ptr = np.zeros(n_pages + 1, dtype=np.int64)
    np.cumsum(degrees, out=link_ptr[1:])
    ads = [(s, t) for s in searches for t in graph.successors(s)]
    homes = [n for n in pages if n == 0 or graph.nodes[n - 1]["domain"] != graph.nodes[n]["domain"]]
    campaigns = list(graph.graph["campaigns"])
    campaign_index = {name: k for k, name in enumerate(campaigns)}
    display = [graph.nodes[n] for n in pages]
    return SiteArrays(
        urls=urls, n_pages=n_pages, n_search=len(searches),
        is_goal=np.array([graph.nodes[n]["is_goal"] for n in pages], dtype=bool),
        link_ptr=link_ptr, link_idx=np.array(targets, dtype=np.int64),
        ad_source=np.array([s for s, _ in ads], dtype=np.int64),
        ad_target=np.array([t for _, t in ads], dtype=np.int64),
        ad_campaign=np.array([campaign_index[graph.edges[s, t]["campaign"]] for s, t in ads],
                             dtype=np.int64),
        display_source=np.array([len(nodes) + a["display_source"] if "display_source" in a
                                 else -1 for a in display], dtype=np.int64),
        display_campaign=np.array([campaign_index[a["display_campaign"]]
                                   if "display_campaign" in a else -1 for a in display],
                                  dtype=np.int64),
        campaigns=campaigns,
        entry_pages=np.array(homes, dtype=np.int64),
        external=np.arange(len(nodes), len(urls), dtype=np.int64))


def user_ids(seed: int, count: int, pool: int = 1_000) -> list[str]:
    """``count`` distinct, real-looking user ids: a Faker user name and the user's number.

    Faker is called for at most ``pool`` names; users share them by index, and the number
    keeps ids distinct (the dash keeps ``ann1``+``2`` apart from ``ann``+``12``).

    :param seed: the generator's seed (the same seed gives the same ids).
    :param count: how many ids.
    :param pool: the most names drawn from Faker.
    """
    fake = _faker(seed + 1)
    stems = [fake.user_name() for _ in range(min(count, pool))]
    width = max(5, len(str(count - 1)))
    return [f"{stems[i % len(stems)]}-{i:0{width}d}" for i in range(count)]
