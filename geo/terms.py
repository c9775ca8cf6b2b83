"""A replica's queue and load terms in the router's score, and the balance rule prefix affinity obeys.

The queue is what the edge observed real requests wait there beyond the round trip and their prompt's
expected prefill (geo/latency.py's Observed), or what the replica's load implies, whichever is larger: a load
report refines the estimate, it never makes a replica measured slow look fast. Observations count from a
baseline, the least any replica in the scope was observed at: every node has some service time of its own
(a CPU model's queue and first step), and a replica not measured yet is taken to be as good as the best
measured (or ``baseline_first_token_ms``, if that is less), not better than all of them: else measured
replicas would lose their traffic to unmeasured ones on their service time alone, and traffic would flap.
"""

from __future__ import annotations

from geo.catalog import RoutingSettings
from geo.decision import Replica

LOAD_PENALTY_MS = 20.0


def queue_and_load(r: Replica, default_service_ms: float, baseline_ms: float = 0.0) -> tuple[float, float]:
    """The queue term (observed beyond ``baseline_ms``, or implied by the load, the larger) and the load
    term, in ms."""
    queue_ms, load_ms = reported_queue_and_load(r, default_service_ms)
    observed = r.latency.observed
    observed_ms = observed.value - baseline_ms if observed.samples else 0.0
    return (observed_ms if observed_ms > queue_ms else queue_ms), load_ms


def reported_queue_and_load(r: Replica, default_service_ms: float) -> tuple[float, float]:
    """What the replica's load implies: requests beyond its capacity (the smaller of the catalog's and the
    one it reports) times its service time per slot, and its utilisation times LOAD_PENALTY_MS."""
    load, capacity, busy = r.load, r.spec.capacity, r.inflight
    if load is not None:
        if 0 < load.capacity < capacity:
            capacity = load.capacity
        if load.running + load.waiting > busy:
            busy = load.running + load.waiting
    if capacity < 1:  # a spec made in code, unvalidated
        capacity = 1
    service = r.latency.service
    service_ms = service.value if service.samples else default_service_ms
    over = busy + 1 - capacity
    queue_ms = over / capacity * service_ms if over > 0 else 0.0
    return queue_ms, (busy if busy < capacity else capacity) / capacity * LOAD_PENALTY_MS


def balanced(replicas: list[Replica], routing: RoutingSettings, holder_id: str) -> bool:
    """SGLang's cache-aware rule: follow the cache while loads are balanced; when they are far apart
    (``max - min > balance_abs`` and ``max > balance_rel * min``, in requests in flight, over the replicas
    that could win), route by load alone."""
    if not any(r.id == holder_id for r in replicas):
        return True  # the holder cannot serve now: no affinity to weigh
    loads = [
        r.inflight if r.load is None else max(r.load.running + r.load.waiting, r.inflight) for r in replicas
    ]
    high, low = max(loads), min(loads)
    return not (high - low > routing.balance_abs and high > routing.balance_rel * low)
