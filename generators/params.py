"""Every knob of the synthetic event generator, with its default, in one dataclass.

``GeneratorParams`` is the single source of truth for the generator's parameters: the library
API (``generators.dataset.generate``), the CLI (whose ``--help`` is built from the field
metadata below), the load mode and the Spark source all read it. Durations are human strings
(``"2 minutes"``, ``"30s"``; text needs a unit, a bare ``"0"`` aside; an ``int`` from code is
milliseconds), parsed by ``joins.durations``, so that manifests stay readable; the ``*_ms``
helpers convert them. Lookback, dedup window and watermark delay default to
``attribution.config``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from attribution.config import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_LOOKBACK,
    DEFAULT_WATERMARK_DELAY,
    parse_duration_ms,
)
from attribution.events import InvalidEvent, ts_to_ms
from attribution.spark.formats import FORMATS
from commandline.options import option

DISORDER_MODELS = ("bounded", "per-source", "heavy-tail")
GROUPS = ("dataset", "site", "behaviour", "value", "disorder", "stream")
# The value of an open-ended duration knob (``total_span``) that sets no bound.
UNLIMITED = "unlimited"


def duration_ms(text: Any, what: str = "duration") -> int:
    """Milliseconds of a non-negative duration (``joins.durations`` rules); ``ValueError`` if not.

    :param text: the duration, as text (``"5 minutes"``) or a number of milliseconds.
    :param what: the parameter's name, for the error message.
    """
    return parse_duration_ms(text, what)


def _knob(default: Any, help: str, group: str, kind: str = "", choices: tuple = (),
          open_ended: bool = False, **bounds: float) -> Any:
    """A dataclass field carrying its CLI help, group, kind (``duration``/``probability``/...)
    and numeric bounds, so one declaration drives defaults, validation and ``--help``
    (``commandline.options``, as for the jobs' options). An ``open_ended`` duration also
    accepts ``UNLIMITED``."""
    return option(default, help, group, kind=kind, choices=choices, open_ended=open_ended,
                  **bounds)


@dataclass(frozen=True)
class GeneratorParams:
    """The generator's parameters. Same params and seed, same bytes."""

    # -- the dataset --------------------------------------------------------------------------
    users: int = _knob(2_000, "number of users (batch) or size of the user pool (stream)",
                       "dataset", minimum=1)
    seed: int = _knob(1, "random seed; the same seed and parameters give byte-identical files",
                      "dataset", minimum=0)
    format: str = _knob("json", "event file format: JSON lines, Parquet (microsecond timestamps) "
                        "or Avro", "dataset", choices=FORMATS)
    files: int = _knob(20, "number of arrival-ordered event files part-00000...", "dataset",
                       minimum=1)
    heartbeat: bool = _knob(False, "append a trailing file with one heartbeat at the last event "
                            "time + watermark delay + 1 ms, so a streaming job flushes every goal",
                            "dataset")
    start: str = _knob("2024-01-01T00:00:00Z", "earliest session start (ISO-8601, UTC)",
                       "dataset", kind="timestamp")
    span: str = _knob("60 days", "when users start: each user's first session starts at a "
                      "uniform time within this span after --start. It does not bound the "
                      "events: later sessions follow --session-gap apart (--dormant-gap-prob of "
                      "the gaps longer than --lookback), so with the defaults events run on for "
                      "months past it; --total-span bounds them", "dataset", kind="duration")
    total_span: str = _knob(UNLIMITED, "bound on all event time: no event at or after --start + "
                            "this; sessions that would start later are dropped and a session "
                            "running past it is cut there. Must be longer than --span. "
                            f"'{UNLIMITED}': later sessions run on", "dataset", kind="duration",
                            open_ended=True)
    lookback: str = _knob(DEFAULT_LOOKBACK, "attribution lookback used for the truth file and for "
                          "the length of dormant gaps", "dataset", kind="duration")
    dedup_window: str = _knob(DEFAULT_DEDUP_WINDOW, "impression dedup window used for the truth "
                              "file", "dataset", kind="duration")

    # -- the site model -------------------------------------------------------------------------
    pages: int = _knob(400, "content pages across all advertiser sites", "site", minimum=2)
    domains: int = _knob(12, "advertiser sites (domains); pages are split among them", "site",
                         minimum=1)
    search_pages: int = _knob(60, "search/source pages that show ads", "site", minimum=1)
    ads_per_search: int = _knob(3, "ads shown by each search page", "site", minimum=1)
    links_per_page: int = _knob(3, "forward links per page (the page DAG)", "site", minimum=1)
    back_link_prob: float = _knob(0.2, "probability that a page also links back to an earlier "
                                  "page, which closes referer cycles in URL space", "site",
                                  kind="probability")
    goal_fraction: float = _knob(0.12, "fraction of pages that are goals (conversions)", "site",
                                 kind="probability")
    external_referers: int = _knob(30, "external referring URLs (social, news) of organic "
                                   "sessions", "site", minimum=1)
    campaigns_per_domain: int = _knob(3, "ad campaigns per advertiser (domain), named by Faker; "
                                      "each ad (search or display) belongs to one campaign of "
                                      "the advertiser it lands on, so every impression of an ad "
                                      "carries the same campaign", "site", minimum=1)

    # -- the behaviour model ----------------------------------------------------------------------
    sessions_per_user: float = _knob(4.0, "mean sessions per user (1 + Poisson)", "behaviour",
                                     minimum=1.0)
    session_gap: str = _knob("6 days", "mean gap between a user's sessions (exponential)",
                             "behaviour", kind="duration")
    dormant_gap_prob: float = _knob(0.08, "probability that a gap is longer than the lookback "
                                    "(a user returning after the attribution horizon)",
                                    "behaviour", kind="probability")
    paid_session_prob: float = _knob(0.5, "probability that a session starts with an ad click "
                                     "(else it is organic: no impression)", "behaviour",
                                     kind="probability")
    continue_prob: float = _knob(0.8, "probability of one more page in a walk", "behaviour",
                                 kind="probability")
    goal_continue_prob: float = _knob(0.5, "probability of walking on after a goal, making the "
                                      "goal a hop on the way to later goals", "behaviour",
                                      kind="probability")
    max_walk: int = _knob(12, "most pages after the landing page in one session", "behaviour",
                          minimum=0)
    dwell: str = _knob("45 seconds", "mean time on a page (exponential)", "behaviour",
                       kind="duration")
    click_delay: str = _knob("4 seconds", "mean time from an ad click to the landing visit",
                             "behaviour", kind="duration")
    click_spam_prob: float = _knob(0.15, "probability that a paid session clicks its ad several "
                                   "times (click spam)", "behaviour", kind="probability")
    spam_max_repeats: int = _knob(3, "most extra clicks in a click-spam session", "behaviour",
                                  minimum=1)
    spam_gap: str = _knob("3 minutes", "mean gap between repeated clicks", "behaviour",
                          kind="duration")
    spam_midnight_prob: float = _knob(0.25, "probability that a click-spam session straddles UTC "
                                      "midnight (repeats in two dedup buckets)", "behaviour",
                                      kind="probability")
    ignored_impression_prob: float = _knob(0.3, "probability that a session also shows an ad "
                                           "that is never clicked (an impression leading "
                                           "nowhere)", "behaviour", kind="probability")
    reload_prob: float = _knob(0.05, "probability that a step reloads the current page (a repeat "
                               "visit to the same URL)", "behaviour", kind="probability")
    tie_prob: float = _knob(0.03, "probability that a step has the same millisecond as the "
                            "previous event (timestamp ties)", "behaviour", kind="probability")
    direct_entry_prob: float = _knob(0.5, "probability that an organic session has no referer "
                                     "(else an external referer)", "behaviour",
                                     kind="probability")
    retarget_prob: float = _knob(0.5, "probability that a user's paid session after the first "
                                 "is a retargeting click: the display ad, on a publisher page "
                                 "(an external referer), of the page the user's latest search "
                                 "ad landed on. The walk goes on from a page seen before, so a "
                                 "later goal is reached through several distinct ads",
                                 "behaviour", kind="probability")

    # -- goal values ------------------------------------------------------------------------------
    goal_value_median: float = _knob(40.0, "median conversion value of a goal. Values are "
                                     "lognormal (exp of a normal with this median and "
                                     "--goal-value-sigma), rounded to cents", "value",
                                     minimum=0.01)
    goal_value_sigma: float = _knob(1.0, "spread of goal values: the standard deviation of their "
                                    "natural logarithm. 0 gives every valued goal the median; 1 "
                                    "puts the middle half between about half and twice it",
                                    "value", minimum=0.0, maximum=10.0)
    goal_value_null_prob: float = _knob(0.1, "fraction of goals without a value (null: a "
                                        "conversion whose value is unknown)", "value",
                                        kind="probability")

    # -- the disorder model -----------------------------------------------------------------------
    disorder: str = _knob("bounded", "arrival model: 'bounded' (each event arrives at most "
                          "--max-delay behind the maximum event time seen), 'per-source' "
                          "(separate collection lags for impressions and visits) or "
                          "'heavy-tail' (Pareto delays)", "disorder", choices=DISORDER_MODELS)
    max_delay: str = _knob("2 minutes", "bounded: the bound B on arrival delay", "disorder",
                           kind="duration")
    impression_lag: str = _knob("5 minutes", "per-source: base collection lag of impressions",
                                "disorder", kind="duration")
    visit_lag: str = _knob("20 seconds", "per-source: base collection lag of visits", "disorder",
                           kind="duration")
    lag_jitter: str = _knob("1 minute", "per-source: uniform jitter added to either lag",
                            "disorder", kind="duration")
    tail_scale: str = _knob("10 seconds", "heavy-tail: scale of the Pareto delay", "disorder",
                            kind="duration")
    tail_alpha: float = _knob(1.2, "heavy-tail: Pareto shape; smaller means heavier tail",
                              "disorder", minimum=0.1)
    late_fraction: float = _knob(0.0, "fraction of events made late on purpose for "
                                 "--watermark-delay (each lands in a file whose watermark has "
                                 "passed it)", "disorder", kind="probability")
    redelivery_rate: float = _knob(0.0, "fraction of events delivered twice (a duplicate record "
                                   "with the same event_id)", "disorder", kind="probability")
    watermark_delay: str = _knob(DEFAULT_WATERMARK_DELAY, "watermark delay D for which late "
                                 "events are made and reported in the manifest", "disorder",
                                 kind="duration")

    # -- the endless stream (load mode and Spark source) -------------------------------------------
    block_span: str = _knob("1 hour", "stream: event time covered by one generated block",
                            "stream", kind="duration")
    sessions_per_block: int = _knob(400, "stream: sessions starting within one block", "stream",
                                    minimum=1)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            meta = f.metadata
            option = "--" + f.name.replace("_", "-")
            expected = type(f.default)
            if expected is bool and not isinstance(value, bool):
                raise ValueError(f"{option} must be true or false, got {value!r}")
            if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{option} must be an integer, got {value!r}")
            if expected is str and not isinstance(value, str) and meta["kind"] != "duration":
                raise ValueError(f"{option} must be a string, got {value!r}")
            if meta["kind"] == "duration":
                if not (meta["open_ended"] and value == UNLIMITED):
                    duration_ms(value, option)
            elif meta["kind"] == "timestamp":
                try:
                    ts_to_ms(value)
                except InvalidEvent as err:
                    raise ValueError(f"{option}: {err}; use e.g. 2024-01-01T00:00:00Z") from None
            elif meta["kind"] == "probability":
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not 0.0 <= value <= 1.0:
                    raise ValueError(f"{option} must be a probability in [0, 1], got {value!r}")
            if meta["choices"] and value not in meta["choices"]:
                raise ValueError(f"{option} must be one of {', '.join(meta['choices'])}; "
                                 f"got {value!r}")
            if "minimum" in meta:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{option} must be a number, got {value!r}")
                if value < meta["minimum"]:
                    raise ValueError(f"{option} must be at least {meta['minimum']}, got {value!r}")
                if value > meta.get("maximum", value):
                    raise ValueError(f"{option} must be at most {meta['maximum']}, got {value!r}")
        if self.pages < 2 * self.domains:
            raise ValueError(f"--pages ({self.pages}) must be at least twice --domains "
                             f"({self.domains}): every site needs a home page and one more page")
        if self.dedup_window_ms <= 0:
            raise ValueError("--dedup-window must be positive")
        if self.block_span_ms <= 0:
            raise ValueError("--block-span must be positive")
        total = self.total_span_ms
        if total is not None and total <= self.ms("span"):
            raise ValueError(f"--total-span ({self.total_span}) must be longer than --span "
                             f"({self.span}), within which first sessions start; lower --span too")

    # -- derived values ----------------------------------------------------------------------------
    def ms(self, name: str) -> int:
        """A duration parameter in milliseconds.

        :param name: the field's name.
        """
        return duration_ms(getattr(self, name), name)

    @property
    def start_ms(self) -> int:
        return ts_to_ms(self.start)

    @property
    def total_span_ms(self) -> Optional[int]:
        """The bound on event time after ``start``, or ``None`` when unlimited."""
        return None if self.total_span == UNLIMITED else self.ms("total_span")

    @property
    def end_ms(self) -> Optional[int]:
        """No event at or after this time (``None``: no bound)."""
        total = self.total_span_ms
        return None if total is None else self.start_ms + total

    @property
    def lookback_ms(self) -> int:
        return self.ms("lookback")

    @property
    def dedup_window_ms(self) -> int:
        return self.ms("dedup_window")

    @property
    def watermark_delay_ms(self) -> int:
        return self.ms("watermark_delay")

    @property
    def block_span_ms(self) -> int:
        return self.ms("block_span")

    def attribution_config(self):
        """The attribution rules' config the truth is computed with: every model, with the
        default half-life."""
        from attribution.config import MODELS, AttributionConfig

        return AttributionConfig(lookback_ms=self.lookback_ms, dedup_window_ms=self.dedup_window_ms,
                                 models=MODELS)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "GeneratorParams":
        """A copy with some fields changed.

        :param changes: the new values, by field name.
        """
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_options(cls, options: dict) -> "GeneratorParams":
        """Build params from string options (e.g. Spark reader options), matching names without
        regard to case, dashes or underscores; unknown names are left to the caller.

        :param options: the options, name to text value.
        """
        by_key = {f.name.replace("_", "").lower(): f for f in dataclasses.fields(cls)}
        values: dict = {}
        for key, raw in options.items():
            f = by_key.get(str(key).replace("_", "").replace("-", "").lower())
            if f is None:
                continue
            values[f.name] = _coerce(f, raw)
        return cls(**values)


def _coerce(f: dataclasses.Field, raw: Any) -> Any:
    """Convert a string option to the field's type, with a clear error."""
    option = "--" + f.name.replace("_", "-")
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    kind = type(f.default)
    try:
        if kind is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise ValueError(f"{option}: expected a {kind.__name__}, got {raw!r}") from None
    return text


# Formats a Kafka record's value can take: one event per record, no Parquet.
TOPIC_FORMATS = ("json", "avro")


@dataclass(frozen=True)
class KafkaTarget:
    """Where the generator produces when it writes to Kafka instead of only to files: not part
    of the data (the same seed gives the same records wherever they go), so kept out of
    ``GeneratorParams``, its manifest and a load run's resume check. No
    ``kafka_bootstrap_servers``: no Kafka."""

    kafka_bootstrap_servers: Optional[str] = _knob(None, "produce the events to Kafka at "
                                         "HOST:PORT[,...] "
                                         "too (generate: after writing the files; stream: "
                                         "instead of event files, --out keeping the stream's "
                                         "state). Records are keyed by user_id; their values "
                                         "are one event each, JSON or Avro binary as --format",
                                         "kafka", metavar="HOST:PORT")
    topic: Optional[str] = _knob(None, "the topic (required with --kafka-bootstrap-servers); "
                       "created if missing", "kafka", metavar="TOPIC")
    kafka_partitions: int = _knob(3, "partitions of a topic this command creates (an existing "
                                  "topic is used as it is)", "kafka", minimum=1)

    def __post_init__(self) -> None:
        if self.kafka_bootstrap_servers and not self.topic:
            raise ValueError("--kafka-bootstrap-servers needs --topic T")
        if self.topic and not self.kafka_bootstrap_servers:
            raise ValueError("--topic needs --kafka-bootstrap-servers HOST:PORT")
        if self.kafka_partitions < 1:
            raise ValueError(f"--kafka-partitions must be at least 1, got {self.kafka_partitions}")

    @property
    def enabled(self) -> bool:
        return bool(self.kafka_bootstrap_servers)


def param_fields(group: str | None = None, cls: type = GeneratorParams) -> list[dataclasses.Field]:
    """The parameter fields, optionally only one group's, in declaration order.

    :param group: one of ``GROUPS`` (``None``: every field).
    :param cls: ``GeneratorParams``, or ``KafkaTarget`` for the ``kafka`` group.
    """
    return [f for f in dataclasses.fields(cls)
            if group is None or f.metadata["group"] == group]
