"""The router's scan bounds (geo/route.py): each routable replica's least possible score for one client, its
round trip and client term (``near``) plus its observed queue while that is fresh, and the replicas in the
order of their bounds.

Computed in numpy for a large catalogue, and in plain Python for the few replicas an edge usually has, where
numpy's cost per call (a microsecond or more per operation, on arrays of a handful) was most of the route
stage's time. Both give the same numbers: the same float64 operations in the same order, and the same
stable sort of the bounds rounded half to even (numpy's and Python's rounding agree).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from geo.orders import Order

FEW = 16  # at most this many replicas: plain Python


def bounds(
    order: Order,
    client_ms: np.ndarray | None,
    observed_ms: np.ndarray,
    observed_at: np.ndarray,
    baseline_ms: float,
    now: float,
    explore_after_s: float,
) -> tuple[Sequence[float], Sequence[float], list[int]]:
    """``(near, bound, ranked)`` of the order's replicas (by their place in ``order.replicas``); the arrays
    are the router's, by each replica's place in the whole catalogue; ``client_ms`` None: a client with no
    place (no client term)."""
    if len(order.replicas) > FEW:
        near = order.rtt_ms + client_ms[order.index] if client_ms is not None else order.rtt_ms
        near = np.maximum(near, 0.0)
        observed = np.maximum(observed_ms[order.index] - baseline_ms, 0.0)
        fresh = now - observed_at[order.index] < explore_after_s
        bound = near + np.where(fresh, observed, 0.0)
        return near, bound, np.argsort(np.round(bound), kind="stable").tolist()
    near_list: list[float] = []
    bound_list: list[float] = []
    for rtt, i in zip(order.rtt_list, order.index_list, strict=True):
        near_ms = rtt + float(client_ms[i]) if client_ms is not None else rtt
        near_ms = max(near_ms, 0.0)
        queue_ms = 0.0
        if now - float(observed_at[i]) < explore_after_s:
            queue_ms = max(float(observed_ms[i]) - baseline_ms, 0.0)
        near_list.append(near_ms)
        bound_list.append(near_ms + queue_ms)
    ranked = sorted(range(len(bound_list)), key=lambda j: _rounded(bound_list[j]))
    return near_list, bound_list, ranked


def least_measured(order: Order, measured_ms: np.ndarray) -> float:
    """The least measured queue among the order's replicas (infinite when none is measured)."""
    if len(order.replicas) > FEW:
        return float(measured_ms[order.index].min()) if len(order.index) else math.inf
    return min((float(measured_ms[i]) for i in order.index_list), default=math.inf)


def _rounded(value: float) -> float:
    return float(round(value)) if math.isfinite(value) else value
