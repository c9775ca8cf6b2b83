"""The edge's one log line per request (JSON logs, opt-in: ``[logging] format = "json"``).

Written when the request has ended, whatever the outcome: ids (the edge's request id, the client's, the
W3C trace id and the edge's span id, which the region logs as its parent), who asked (tenant and key id,
never the key), what (model, kind), the outcome (HTTP status, error code, cache status, region), the
tokens billed, and time to first token and in total.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from edge.journey import Journey
from nearshore import jsonlog

log = logging.getLogger(jsonlog.REQUESTS)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def journey_fields(journey: Journey, ended_at: float) -> dict[str, Any]:
    key, body, billed = journey.key, journey.body, journey.billed
    outcome, forwarded = journey.outcome, journey.forwarded
    fields: dict[str, Any] = {
        "process": "edge",
        "request_id": journey.request_id,
        "client_request_id": journey.client_request_id or None,
        "trace_id": journey.trace.trace_id if journey.trace else None,
        "span_id": journey.span_id or None,
        "tenant": key.tenant if key else None,
        "key_id": key.key_id if key else None,
        "kind": journey.kind,
        "model": body.model if body is not None else None,
        "status": outcome.http_status,
        "outcome": outcome.status,
        "error_code": outcome.error_code or None,
        "cache": journey.cache.status,
        "region": forwarded.region or None,
        "prompt_tokens": billed.prompt_tokens if billed else None,
        "cached_tokens": billed.prompt_tokens_details.cached_tokens if billed else None,
        "completion_tokens": billed.completion_tokens if billed else None,
        "ttft_ms": None,
        "total_ms": _ms(ended_at - journey.started),
    }
    stream = forwarded.stream
    if stream is not None and stream.first_write_at:
        fields["ttft_ms"] = _ms(stream.first_write_at - journey.started)
    elif outcome.status == "ok" and forwarded.opened is not None and stream is None:
        fields["ttft_ms"] = fields["total_ms"]  # a unary answer's first byte is its whole answer
    if journey.continued.from_region:
        fields["continued_from"] = journey.continued.from_region
    return fields


def log_journey(journey: Journey) -> None:
    """The request's closing line; a failure to build it never fails the request."""
    try:
        jsonlog.request_line(log, journey_fields(journey, time.perf_counter()))
    except Exception:
        log.exception("request %s: could not write its log line", journey.request_id)
