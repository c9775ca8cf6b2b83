"""Header names edges, regions and the harness share on the wire."""

from __future__ import annotations

# The id a server gives each request (the edge mints its own; a region echoes the edge's).
REQUEST_ID = "x-request-id"
# The id a client chose for its own tracing: kept beside the server's id, never in its place.
CLIENT_REQUEST_ID = "x-client-request-id"
# Which region served the answer (set by the edge).
REGION = "x-nearshore-region"
# The shared secret an edge proves itself with to a region (instead of, or beside, mutual TLS).
EDGE_SECRET = "x-nearshore-edge-secret"
SERVER_TIMING = "Server-Timing"
# Prometheus' text exposition format.
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A region's load on every response (nearshore/protocol/load.py), read by the edge's router.
LOAD = "x-nearshore-load"
# Why the edge chose the region it did (on request: the edge's `geo.explain` setting or ROUTE_DEBUG).
ROUTE = "x-nearshore-route"
# A key allowed to (its `debug` flag) asks for the route explanation with `x-nearshore-debug: route`.
DEBUG = "x-nearshore-debug"
# `x-nearshore-continue: off`: a stream whose region dies mid-answer ends with an error event instead of
# being continued by another region.
CONTINUE = "x-nearshore-continue"
# The model a size alias (e.g. `auto`) chose, and why (set by the edge).
MODEL = "x-nearshore-model"
# A client's hint for a size alias: `small` or `large`.
SIZE_HINT = "x-nearshore-size"
# Whether the edge's response cache answered: HIT (exact), SEMANTIC or MISS; and the similarity of a hit.
CACHE = "x-nearshore-cache"
CACHE_SIMILARITY = "x-nearshore-cache-similarity"
# A client's own fallback chain, `x-nearshore-fallback: model-a,model-b` (tiers in fallbacks.header_tiers).
FALLBACK = "x-nearshore-fallback"
# Whose share of a region a request uses: an opaque per-API-key id the edge sets (a hash, never the key or its
# id), so that the region's scheduler admits and prefills round-robin across keys.
SHARE_KEY = "x-nearshore-share-key"
# Why an answer is not what the edge would normally give: `cable-cut` (every remote region serving the model
# is unreachable; the cache or a local region answered, or the request was refused). Set by the edge.
DEGRADED = "x-nearshore-degraded"
