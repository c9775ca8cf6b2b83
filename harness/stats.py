"""The one percentile every figure uses: the benchmarks', the scenarios' and the load generator's.

Linear interpolation between the nearest ranks (numpy's default, and what ``statistics.median`` gives at
50), so a p95 in one report means what it means in another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile, linearly interpolated between the nearest ranks; NaN when empty."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
