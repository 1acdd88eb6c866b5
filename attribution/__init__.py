"""Conversion attribution (Streaming Systems ch. 7) as an engine-free core plus Spark backends.

The pure-Python pieces import no Spark:

* ``AttributionConfig``: the rule parameters (lookback, dedup window, models, half-life);
* ``Event`` / ``parse_event``: the validated input record;
* ``UserAttribution``: the per-user state machine (add, fire, gc, next_timer, to/from bytes);
* ``attribute_batch``: the batch oracle, ground truth for every other path.
"""
from .config import AttributionConfig
from .core import WATERMARK_INFINITY, AddResult, Attribution, UserAttribution
from .events import Event, InvalidEvent, parse_event, validate
from .oracle import attribute_batch

__all__ = ["AttributionConfig", "AddResult", "Attribution", "Event", "InvalidEvent",
           "UserAttribution", "WATERMARK_INFINITY", "attribute_batch", "parse_event", "validate"]
