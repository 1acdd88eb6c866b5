"""The path search's fallback: a budgeted backward search, then a rebuild of the best map.

Random property tests rarely exhaust the default budget, so these run the brute-force
comparisons with tiny budgets, forcing every firing through the rebuild path as well.
"""
from __future__ import annotations

import pytest

from attribution import paths
from attribution.config import AttributionConfig
from attribution.oracle import attribute_batch

from test_core_property import _larger_event_set, reference_attribution


@pytest.mark.parametrize("budget", [0, 1, 5, 50])
@pytest.mark.parametrize("seed", range(6))
def test_tiny_search_budgets_give_the_reference_answer(monkeypatch, seed, budget):
    monkeypatch.setattr(paths, "SEARCH_BUDGET", budget)
    events = _larger_event_set(seed)
    config = AttributionConfig(lookback_ms=60, dedup_window_ms=25)
    assert attribute_batch(events, config) == reference_attribution(events, config)
