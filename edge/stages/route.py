"""The route stage: which replicas serve the request, in which order (:mod:`edge.client_route`, geo/).

What the router decides on is kept current by probes and responses off the request path. A request that no
replica may serve (every allowed one down, or a residency policy that allows none) gets a 503 here that
says why and names the policy, never a silent detour. Local regions (the degraded tier) are ranked as the
cut stage's policy says; a request whose model's remote replicas are all out (the cut stage's record) goes
on to the forward stage, which answers it from the cache or the local tier, or refuses it
(edge/degraded.py).
"""

from __future__ import annotations

import logging
import time

from edge.client_route import route_for
from edge.journey import Journey, Reply, Routed
from geo.route import NoRoute
from nearshore.protocol.errors import NO_REGION_AVAILABLE, RESIDENCY_UNAVAILABLE, ApiError
from nearshore.protocol.headers import DEBUG, FALLBACK, ROUTE

log = logging.getLogger("nearshore.edge.route")


async def route_stage(journey: Journey) -> Reply | None:
    state, body, call = journey.state, journey.body, journey.call
    assert body is not None and call is not None
    started = time.perf_counter()
    try:
        route = route_for(journey, body.model)
    except NoRoute as exc:
        # The fallbacks may serve it, or in a cut the cache and the degraded tier (edge/degraded.py): the
        # forward stage tries them.
        if _may_fall_back(journey) or exc.cut:
            journey.routed = Routed(unrouted=str(exc), route_s=time.perf_counter() - started)
            return None
        kind = RESIDENCY_UNAVAILABLE if exc.policies else NO_REGION_AVAILABLE
        raise ApiError(kind, str(exc), retry_after_s=5) from None
    state.metrics.routed.labels(route.ranked[0].id).inc()
    journey.routed = Routed(route, route_s=time.perf_counter() - started)
    if _explains(journey):
        explained = route.explain()
        journey.call = call.with_client_header(ROUTE, explained)
        log.info("request %s routed: %s", journey.request_id, explained)
    return None


def _may_fall_back(journey: Journey) -> bool:
    assert journey.body is not None
    chains = journey.state.config.fallbacks.models
    other = journey.sizing.other_size
    return FALLBACK in journey.request.headers or bool(chains.get(journey.body.model) or other)


def _explains(journey: Journey) -> bool:
    """Whether the response says why it went where it did: region names, RTTs and policy names are the
    operator's to show (``geo.explain``), or a key's whose record allows it; anyone else's ask is ignored."""
    if journey.state.pool.router.config.explain:
        return True
    key = journey.key
    return key is not None and key.debug and "route" in journey.request.headers.get(DEBUG, "")
