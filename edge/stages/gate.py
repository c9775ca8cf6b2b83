"""The pool gate stage: a request takes its key's share of its pool (the pool class of the replicas the route
chose; :mod:`edge.key_share`), then a slot in the pool, before it is forwarded, waiting in tier order when the
pool is full (:mod:`edge.pool_gate`). Both are given back at the journey's exit, whatever ended it."""

from __future__ import annotations

from edge.journey import Gated, Journey, Reply
from edge.key_share import KeyShares
from nearshore.protocol.errors import CONCURRENCY_LIMITED, ApiError


def pool_of(journey: Journey) -> str:
    """The chosen replicas' pool; without a route stage, the pool of the first replica serving the model."""
    route = journey.routed.route
    if route is not None and route.ranked:
        return route.ranked[0].spec.pool
    model = journey.body.model if journey.body is not None else ""
    serving = [r for r in journey.state.pool.router.replicas if model in r.models]
    return serving[0].spec.pool if serving else "large"


async def gate_stage(journey: Journey) -> Reply | None:
    state, key = journey.state, journey.key
    assert key is not None
    gate = state.gates.get(pool_of(journey))
    if gate is None:
        return None
    share_s = await _take_share(journey, gate.shares) if gate.shares is not None else 0.0
    if gate.max_inflight <= 0:
        journey.gated = Gated(share_s)
        return None
    waited_s = await gate.acquire(key.tier)
    journey.gated = Gated(share_s + waited_s)
    state.metrics.pool_queue.labels(gate.name).observe(waited_s)

    async def release() -> None:
        gate.release()

    journey.cleanups.append(release)
    return None


async def _take_share(journey: Journey, shares: KeyShares) -> float:
    """The key's share for this request's tokens (prompt estimate + max_tokens), given back at the exit;
    how long it waited for it."""
    state, key, admission = journey.state, journey.key, journey.admission
    assert key is not None and admission is not None
    tokens = admission.prompt_estimate + admission.completion_tokens
    try:
        waited_s = await shares.acquire(key, tokens)
    except ApiError as exc:
        if exc.kind is CONCURRENCY_LIMITED:
            state.metrics.rate_limited.labels("key_share").inc()
        raise
    state.metrics.key_share_wait.labels(shares.pool).observe(waited_s)

    async def release() -> None:
        shares.release(key.key_id, tokens)

    journey.cleanups.append(release)
    return waited_s
