"""The route stage: where the client is, and which replicas serve its request in which order (geo/).

The client's address is the socket peer, or, behind a trusted proxy, X-Forwarded-For read from the right;
the GeoIP lookup is memory-mapped and cached. The router's decision is pure and in memory (microseconds);
what it decides on is kept current by probes and responses off the request path. A request that no
replica may serve (every allowed one down, or a residency policy that allows none) gets a 503 here that
says why and names the policy, never a silent detour. Local regions (the degraded tier) are ranked as the
cut stage's policy says; a request whose model's remote replicas are all out goes on to the forward stage,
which answers it from the cache or the local tier, or refuses it (edge/degraded.py).
"""

from __future__ import annotations

import logging
import time

from edge.journey import Journey, Reply, Routed
from geo.affinity import prefix_chain
from geo.locate import Location, Locator
from geo.route import NoRoute, Route, Where
from nearshore.protocol.errors import NO_REGION_AVAILABLE, RESIDENCY_UNAVAILABLE, ApiError
from nearshore.protocol.headers import DEBUG, FALLBACK, ROUTE
from nearshore.protocol.schemas import ChatCompletionRequest, EmbeddingRequest

log = logging.getLogger("nearshore.edge.route")


def where_of(location: Location) -> Where:
    return Where(
        location.latitude,
        location.longitude,
        location.country,
        location.continent,
        location.source == "geoip",
    )


def client_where(journey: Journey, locator: Locator | None) -> Where:
    if locator is None:  # no GeoIP: every client is where the edge is
        edge = journey.state.pool.router.edge
        return Where(edge.latitude, edge.longitude, edge.country, edge.continent)
    request = journey.request
    forwarded = request.headers.getall("X-Forwarded-For", None)
    address = locator.client_address(request.remote, ", ".join(forwarded) if forwarded else None)
    return where_of(locator.locate(address))


def prompt_text(journey: Journey, limit: int) -> str:
    """The prompt's leading text as the region will render it (roles and contents in order), at most
    ``limit`` characters: what prefix affinity keys on."""
    body = journey.body
    if isinstance(body, ChatCompletionRequest):
        parts: list[str] = []
        size = 0
        for m in body.messages:
            text = m.text()
            parts.append(m.role)
            parts.append(text)
            size += len(m.role) + len(text)
            if size >= limit:
                break
        return "\n".join(parts)[:limit]
    if isinstance(body, EmbeddingRequest):
        return ""  # an embedding has no prompt to keep in a KV cache
    assert body is not None
    return body.prompt_text()[:limit]


def route_for(journey: Journey, model: str) -> Route:
    """The router's order for ``model`` (the request's, or a fallback's); :class:`NoRoute` when none."""
    state, admission, key = journey.state, journey.admission, journey.key
    assert admission is not None and key is not None
    router = state.pool.router
    where = client_where(journey, state.locator)
    routing = router.config.routing
    text = prompt_text(journey, routing.affinity_block_chars * 64)
    prefix = prefix_chain(text, routing.affinity_block_chars, routing.affinity_min_chars)
    now, share_local = time.monotonic(), journey.cut.share_local
    return router.route(model, where, key.tenant, admission.prompt_estimate, prefix, now, share_local)


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
            journey.routed = Routed(unrouted=str(exc), cut=exc.cut, route_s=time.perf_counter() - started)
            return None
        kind = RESIDENCY_UNAVAILABLE if exc.policies else NO_REGION_AVAILABLE
        raise ApiError(kind, str(exc), retry_after_s=5) from None
    state.metrics.routed.labels(route.ranked[0].id).inc()
    journey.routed = Routed(route, cut=route.cut, route_s=time.perf_counter() - started)
    if _explains(journey):
        explained = route.explain()
        journey.call = call.with_client_header(ROUTE, explained)
        log.info("request %s routed: %s", journey.request_id, explained)
    return None
