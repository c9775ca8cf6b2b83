"""Where a request's client is, and the router's order of replicas for it (geo/): what the route stage
decides on, and what a continuation or a fallback asks again.

The client's address is the socket peer, or, behind a trusted proxy, X-Forwarded-For read from the right;
the GeoIP lookup is memory-mapped and cached. The router's decision is pure and in memory (microseconds).
"""

from __future__ import annotations

import time

from edge.journey import Journey
from geo.affinity import prefix_chain
from geo.locate import Location, Locator
from geo.route import Route, Where
from nearshore.protocol.schemas import ChatCompletionRequest, EmbeddingRequest


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
