"""The pool gate stage: a request takes a slot in its pool (the pool class of the replicas the route
chose) before it is forwarded, waiting in tier order when the pool is full (:mod:`edge.pool_gate`)."""

from __future__ import annotations

from collections.abc import Sequence

from edge.config import PoolsConfig
from edge.journey import Journey, Reply
from edge.pool_gate import PoolGate
from geo.route import Replica

POOL_CLASSES = ("large", "small", "embedding")


def make_gates(config: PoolsConfig, replicas: Sequence[Replica]) -> dict[str, PoolGate]:
    gates = {}
    for pool in POOL_CLASSES:
        limits = getattr(config, pool)
        capacity = sum(r.spec.capacity for r in replicas if r.spec.pool == pool)
        gates[pool] = PoolGate(
            pool, limits.max_inflight or capacity, limits.max_queue, limits.max_wait_s, config.tier_order
        )
    return gates


def pool_of(journey: Journey) -> str:
    """The chosen replicas' pool; without a route stage, the pool of the first replica serving the model."""
    if journey.route is not None and journey.route.ranked:
        return journey.route.ranked[0].spec.pool
    model = journey.body.model if journey.body is not None else ""
    serving = [r for r in journey.state.pool.router.replicas if model in r.models]
    return serving[0].spec.pool if serving else "large"


async def gate_stage(journey: Journey) -> Reply | None:
    state, key = journey.state, journey.key
    assert key is not None
    gate = state.gates.get(pool_of(journey))
    if gate is None or gate.max_inflight <= 0:
        return None
    journey.queue_s = await gate.acquire(key.tier)
    state.metrics.pool_queue.labels(gate.name).observe(journey.queue_s)

    async def release() -> None:
        gate.release()

    journey.cleanups.append(release)
    return None
