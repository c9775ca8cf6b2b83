"""The router's scan bounds (geo/scan_bounds.py) are the same numbers and the same order whether numpy or
plain Python computes them: random catalogues, clients with and without a place, fresh and stale
observations, and bounds that tie within a millisecond (where the catalogue's order must decide)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geo import scan_bounds
from geo.orders import Order


def order_of(rng: np.random.Generator, catalogue: int, routable: int) -> Order:
    index = np.sort(rng.choice(catalogue, routable, replace=False)).astype(np.intp)
    rtt = rng.choice([20.0, 20.4, 20.6, 85.5, 120.0, 240.2], routable) + rng.integers(0, 3, routable)
    return Order(0, math.inf, [object()] * routable, rtt.astype(np.float64), index, {}, {})  # type: ignore[list-item]


def both(monkeypatch: pytest.MonkeyPatch, *args):
    monkeypatch.setattr(scan_bounds, "FEW", 10**6)
    few = scan_bounds.bounds(*args)
    monkeypatch.setattr(scan_bounds, "FEW", -1)
    many = scan_bounds.bounds(*args)
    return few, many


@pytest.mark.parametrize("seed", range(40))
def test_python_and_numpy_give_the_same_bounds_and_order(monkeypatch: pytest.MonkeyPatch, seed: int):
    rng = np.random.default_rng(seed)
    catalogue = int(rng.integers(1, 30))
    order = order_of(rng, catalogue, int(rng.integers(1, catalogue + 1)))
    located = bool(seed % 2)
    client_ms = rng.choice([-5.0, 0.0, 0.5, 12.25, 60.0], catalogue) if located else None
    observed_ms = rng.choice([0.0, 3.0, 40.0, 40.5, 250.0], catalogue).astype(np.float64)
    observed_at = rng.uniform(0.0, 100.0, catalogue)
    (near_a, bound_a, ranked_a), (near_b, bound_b, ranked_b) = both(
        monkeypatch, order, client_ms, observed_ms, observed_at, 10.0, 100.0, 30.0
    )
    assert list(near_a) == np.asarray(near_b).tolist()
    assert list(bound_a) == np.asarray(bound_b).tolist()
    assert ranked_a == ranked_b
    measured = np.where(rng.random(catalogue) < 0.3, math.inf, observed_ms)
    monkeypatch.setattr(scan_bounds, "FEW", 10**6)
    least_few = scan_bounds.least_measured(order, measured)
    monkeypatch.setattr(scan_bounds, "FEW", -1)
    assert least_few == scan_bounds.least_measured(order, measured)


def test_ties_within_a_millisecond_keep_the_catalogues_order(monkeypatch: pytest.MonkeyPatch):
    rtt = np.array([30.4, 30.2, 29.6, 10.0], dtype=np.float64)  # the first three round to 30
    order = Order(0, math.inf, [object()] * 4, rtt, np.arange(4, dtype=np.intp), {}, {})  # type: ignore[list-item]
    zeros = np.zeros(4)
    for _, _, ranked in both(monkeypatch, order, None, zeros, zeros, 0.0, 1.0, 30.0):
        assert ranked == [3, 0, 1, 2]
