"""The one percentile (harness/stats.py): what every benchmark, scenario and load report quotes."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from harness.stats import percentile


@pytest.mark.parametrize("p", [0, 1, 50, 90, 95, 99, 100])
def test_matches_numpy_default_interpolation(p: float):
    values = np.random.default_rng(7).exponential(0.2, 257)
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_its_median_is_the_statistics_median():
    values = [0.5, 0.1, 0.4, 0.2]
    assert percentile(values, 50) == statistics.median(values) == pytest.approx(0.3)


def test_one_value_and_none():
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))
