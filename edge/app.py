"""The edge proxy's HTTP app: authenticate, validate, limit, forward, relay, meter.

One request's journey (DESIGN.md, steps 1, 4 and 7): API key -> schema -> model, budget and RPM/TPM
reservation (:mod:`edge.admission`) -> forward over a warm connection, failover before the first byte, relay
(:mod:`edge.forward`) -> one exit that settles the reservation and writes the ledger row
(:mod:`edge.journey`), and only then the answer's last bytes (a stream's ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import Literal

import msgspec
from aiohttp import web

from edge.admission import admit, authenticate, check_request, read_body
from edge.forward import Call, StreamReply, UnaryReply, forward_stream, forward_unary
from edge.journey import Journey, close_journey
from edge.limits import rate_limit_headers
from edge.state import EDGE, EdgeState
from nearshore.httpkit import (
    CLIENT_REQUEST_ID_KEY,
    metrics_response,
    minted_request_ids,
    openai_errors,
    request_id_of,
)
from nearshore.protocol.errors import INTERNAL, NOT_FOUND, ApiError
from nearshore.protocol.headers import CLIENT_REQUEST_ID, REQUEST_ID
from nearshore.protocol.schemas import (
    CompletionRequest,
    ModelCard,
    ModelList,
    StreamOptions,
    chat_request_decoder,
    completion_request_decoder,
    json_encoder,
)

log = logging.getLogger("nearshore.edge")

__all__ = ["EDGE", "EdgeState", "create_app", "create_metrics_app"]


def create_app(state: EdgeState) -> web.Application:
    app = web.Application(
        middlewares=[minted_request_ids, openai_errors], client_max_size=state.config.server.max_body_bytes
    )
    app[EDGE] = state
    app.cleanup_ctx.append(_lifetime)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", guarded_metrics)
    return app


def create_metrics_app(state: EdgeState) -> web.Application:
    """The operator's listener (loopback by default): /metrics and /health, no key needed."""
    app = web.Application()
    app[EDGE] = state
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    state = app[EDGE]
    await state.pool.start()
    yield
    await state.pool.close()
    if state.background:
        await asyncio.gather(*state.background, return_exceptions=True)
    await state.limiter.close()
    await state.ledger.close()


# --- endpoints ---------------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "completions")


async def list_models(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    key = authenticate(request, state)
    cards = [ModelCard(id=m, created=0) for m in state.config.models if key.allows(m)]
    return web.Response(body=json_encoder.encode(ModelList(cards)), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    limiter_up = state.limiter.backend_up()
    regions = {r.name: "up" if r.up else "down" for r in state.pool.regions}
    return web.json_response(
        {
            "status": "ok",
            "limits_backend": state.config.limits.backend,
            "limits": "up" if limiter_up else f"down ({state.config.limits.fail_mode})",
            "regions": regions,
        }
    )


async def guarded_metrics(request: web.Request) -> web.Response:
    """/metrics on the public listener: only with the configured token (else it does not exist here)."""
    token = request.app[EDGE].config.metrics.token
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not token or not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(NOT_FOUND, "Not found.")
    return await metrics(request)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    state.metrics.limiter_up.set(1 if state.limiter.backend_up() else 0)
    for region in state.pool.regions:
        state.metrics.region_up.labels(region.name).set(1 if region.up else 0)
    return metrics_response(state.metrics.render())


# --- the proxy ---------------------------------------------------------------------------------------


async def _proxy(request: web.Request, kind: Literal["chat", "completions"]) -> web.StreamResponse:
    started = time.perf_counter()
    state = request.app[EDGE]
    key = authenticate(request, state)
    decoder = chat_request_decoder if kind == "chat" else completion_request_decoder
    body = await read_body(request, state, decoder)
    check_request(state, key, body)
    admission = await admit(state, key, body)
    journey = Journey(
        kind,
        request_id_of(request),
        request[CLIENT_REQUEST_ID_KEY],
        key,
        body.model,
        started,
        admission,
    )
    # Ids go on every answer, also on a stream whose head is sent before the middleware sees it.
    client_headers = {**rate_limit_headers(admission.decision), REQUEST_ID: journey.request_id}
    if journey.client_request_id:
        client_headers[CLIENT_REQUEST_ID] = journey.client_request_id
    keep_usage = body.wants_usage_chunk()
    if body.stream:  # the edge always asks for usage; the client gets the chunk only if it asked too
        body = msgspec.structs.replace(body, stream_options=StreamOptions(include_usage=True))
    call = Call(
        path="/v1/chat/completions" if kind == "chat" else "/v1/completions",
        body=json_encoder.encode(body),  # what was validated is what leaves, re-encoded
        headers={"Content-Type": "application/json", REQUEST_ID: journey.request_id, **state.pool.headers},
        client_headers=client_headers,
        echo=isinstance(body, CompletionRequest) and body.echo,
    )
    reply: UnaryReply | StreamReply
    try:
        if body.stream:
            reply = await forward_stream(request, state, journey, call, keep_usage)
        else:
            reply = await forward_unary(request, state, journey, call)
    except asyncio.CancelledError:
        # The client left. Its row is written although this task is being cancelled.
        if not journey.recorded:
            journey.left()
        state.in_background(close_journey(state, journey))
        raise
    except ApiError as exc:
        if not journey.recorded:
            journey.failed(exc)
        await close_journey(state, journey)
        raise
    except Exception:
        if not journey.recorded:
            journey.failed(ApiError(INTERNAL, "internal error"))
        await close_journey(state, journey)
        raise
    # The one exit: the ledger row is committed before the answer's end, so a client that saw it was billed.
    audited = await close_journey(state, journey)
    return await reply.finish(audited)
