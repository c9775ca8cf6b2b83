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
