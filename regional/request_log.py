"""The regional node's one log line per request (JSON logs, opt-in: ``[logging] format = "json"``).

A middleware outside the error middleware, so it sees the status the caller got. It carries the edge's
request id (``x-request-id``, which the node adopts) and the W3C trace id with the edge's span as parent,
so the edge's and the region's lines of one request join on either id.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from nearshore import jsonlog
from nearshore.httpkit import REQUEST_ID_KEY, Handler, request_id_of
from nearshore.protocol import trace
from regional.service import Generation

log = logging.getLogger(jsonlog.REQUESTS)
# The handler leaves its generation here, for the closing line's tokens and times.
GENERATION = web.RequestKey("generation", Generation)
CLIENT_LEFT = 499


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def request_fields(
    request: web.Request, region: str, status: int, started: float, ended: float
) -> dict[str, Any]:
    given = request.headers.get(trace.TRACEPARENT, "")
    parent = trace.parse_traceparent(given) if given else None
    fields: dict[str, Any] = {
        "process": "region",
        "region": region,
        "request_id": request_id_of(request),
        "trace_id": parent.trace_id if parent else None,
        "parent_id": parent.parent_id if parent else None,
        "path": request.path,
        "status": status,
        "model": None,
        "finish_reason": None,
        "cache": None,
        "prompt_tokens": None,
        "cached_tokens": None,
        "completion_tokens": None,
        "queue_ms": None,
        "ttft_ms": None,
        "total_ms": _ms(ended - started),
    }
    if parent is not None and (state := request.headers.get(trace.TRACESTATE)):
        fields["tracestate"] = state[: trace.MAX_TRACESTATE_CHARS]
    generation = request.get(GENERATION)
    if generation is not None:
        t = generation.timings
        fields.update(
            model=generation.prepared.model,
            finish_reason=generation.finish_reason,
            cache="prefix" if generation.cached_tokens else "miss",
            prompt_tokens=len(generation.prepared.prompt_tokens),
            cached_tokens=generation.cached_tokens,
            completion_tokens=generation.completion_tokens,
            queue_ms=_ms(t.queue_s),
            ttft_ms=_ms(t.first_token_at - t.arrived) if t.first_token_at else None,
        )
    return fields


def request_log(region: str):
    """The middleware: one line per API request (probes and scrapes are not requests)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        started = time.perf_counter()
        status = CLIENT_LEFT  # until the handler returns (a client that leaves cancels it)
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            try:
                fields = request_fields(request, region, status, started, time.perf_counter())
                jsonlog.request_line(log, fields)
            except Exception:  # the line must never fail the request
                log.exception("request %s: could not write its log line", request.get(REQUEST_ID_KEY))

    return middleware
