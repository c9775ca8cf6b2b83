"""The edge proxy's HTTP app: authenticate, validate, limit, forward, relay, meter.

One request's journey (DESIGN.md, steps 1, 4 and 7): API key -> schema -> model and budget -> RPM/TPM
reservation -> forward over a warm connection (failover before the first byte) -> relay -> settle the
reservation, write the ledger row, and only then send the final ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import msgspec
from aiohttp import web

from edge.billing import PriceTable
from edge.config import EdgeConfig
from edge.keys import ApiKey, KeyStore
from edge.ledger import Ledger, UsageRecord
from edge.limits import Decision, LimiterUnavailable, LimitSpec, RateLimiter, rate_limit_headers
from edge.metrics import EdgeMetrics
from edge.relay import Opened, SseRelay, StreamOutcome, StreamWatchdog, open_upstream, usage_of
from edge.token_count import TokenCounter
from edge.upstream import UpstreamPool
from nearshore.httpkit import openai_errors, read_json, request_id_of, request_ids
from nearshore.protocol import sse
from nearshore.protocol.errors import (
    INVALID_API_KEY,
    INVALID_REQUEST,
    MODEL_NOT_FOUND,
    PERMISSION_DENIED,
    QUOTA_EXCEEDED,
    RATE_LIMITED,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PARAMETER,
    UPSTREAM_UNAVAILABLE,
    ApiError,
)
from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    StreamOptions,
    Usage,
    chat_request_decoder,
    completion_request_decoder,
    json_encoder,
)

log = logging.getLogger("nearshore.edge")
REGION_HEADER = "x-nearshore-region"


@dataclass(eq=False)
class EdgeState:
    config: EdgeConfig
    keys: KeyStore
    limiter: RateLimiter
    ledger: Ledger
    prices: PriceTable
    counter: TokenCounter
    pool: UpstreamPool
    metrics: EdgeMetrics = field(default_factory=EdgeMetrics)
    spent_usd: dict[str, float] = field(default_factory=dict)
    background: set[asyncio.Task] = field(default_factory=set)

    def in_background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


EDGE = web.AppKey("edge", EdgeState)


def create_app(state: EdgeState) -> web.Application:
    app = web.Application(
        middlewares=[request_ids, openai_errors], client_max_size=state.config.server.max_body_bytes
    )
    app[EDGE] = state
    app.cleanup_ctx.append(_lifetime)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
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
    key = _authenticate(request, state)
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


async def metrics(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    state.metrics.limiter_up.set(1 if state.limiter.backend_up() else 0)
    for region in state.pool.regions:
        state.metrics.region_up.labels(region.name).set(1 if region.up else 0)
    return web.Response(
        body=state.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


# --- admission ---------------------------------------------------------------------------------------


def _authenticate(request: web.Request, state: EdgeState) -> ApiKey:
    presented = request.headers.get("x-api-key", "")
    auth = request.headers.get("Authorization", "")
    if auth:
        scheme, _, token = auth.partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    result = state.keys.authenticate(presented)
    if result.key is None or result.reason != "ok":
        messages = {
            "missing": "You didn't provide an API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
            "revoked": "This API key has been revoked.",
        }
        raise ApiError(INVALID_API_KEY, messages.get(result.reason, "Incorrect API key provided."))
    return result.key


async def _read_body(request: web.Request, state: EdgeState, decoder: msgspec.json.Decoder):
    try:
        async with asyncio.timeout(state.config.server.body_timeout_s):
            return await read_json(request, decoder)
    except TimeoutError:
        raise ApiError(REQUEST_TIMEOUT, "The request body did not arrive in time.") from None


async def _check_budget(state: EdgeState, key: ApiKey) -> None:
    if key.budget_usd is None:
        return
    if key.key_id not in state.spent_usd:
        state.spent_usd[key.key_id] = await asyncio.to_thread(state.ledger.spent_usd, key.key_id)
    spent = state.spent_usd[key.key_id]
    if spent >= key.budget_usd:
        raise ApiError(
            QUOTA_EXCEEDED,
            f"This key has used its budget (${spent:.4f} of ${key.budget_usd:.4f}).",
        )


def _check_model(state: EdgeState, key: ApiKey, model: str) -> None:
    if model not in state.config.models:
        raise ApiError(MODEL_NOT_FOUND, f"The model `{model}` does not exist.", param="model")
    if not key.allows(model):
        raise ApiError(PERMISSION_DENIED, f"This API key may not use the model `{model}`.", param="model")


async def _reserve(state: EdgeState, key: ApiKey, tokens: int) -> Decision:
    try:
        decision = await state.limiter.admit(key.key_id, LimitSpec(key.rpm, key.tpm), tokens)
    except LimiterUnavailable:
        raise ApiError(
            UPSTREAM_UNAVAILABLE, "Rate limits cannot be checked right now; retry shortly.", retry_after_s=1
        ) from None
    if not decision.allowed:
        limit = decision.refused_by or "requests"
        state.metrics.rate_limited.labels(limit).inc()
        window = decision.requests if limit == "requests" else decision.tokens
        raise ApiError(
            RATE_LIMITED,
            f"Rate limit reached for {limit} per minute: limit {window.limit}, this request needs "
            f"{1 if limit == 'requests' else tokens}. Retry after {decision.retry_after_s:.1f}s.",
            retry_after_s=decision.retry_after_s,
            headers=rate_limit_headers(decision),
        )
    return decision


# --- the proxy ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Journey:
    """What the edge knows about one request as it moves along."""

    kind: Literal["chat", "completions"]
    request_id: str
    key: ApiKey
    model: str
    started: float
    reservation: str | None = None
    region: str = ""
    prompt_estimate: int = 0
    billed: bool = False  # its one ledger row is written (or on its way)


async def _proxy(request: web.Request, kind: Literal["chat", "completions"]) -> web.StreamResponse:
    started = time.perf_counter()
    state = request.app[EDGE]
    key = _authenticate(request, state)
    decoder = chat_request_decoder if kind == "chat" else completion_request_decoder
    body: ChatCompletionRequest | CompletionRequest = await _read_body(request, state, decoder)
    _check_model(state, key, body.model)
    if body.n != 1:
        raise ApiError(
            UNSUPPORTED_PARAMETER, "Only n=1 is supported: send one request per choice.", param="n"
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            INVALID_REQUEST, "stream_options is only allowed with stream=true.", param="stream_options"
        )
    await _check_budget(state, key)
    if isinstance(body, ChatCompletionRequest):
        prompt_tokens = state.counter.count_chat(body.messages)
    else:
        prompt_tokens = state.counter.count_text(body.prompt_text())
    reserve = prompt_tokens + (body.token_limit() or state.config.default_max_tokens)
    decision = await _reserve(state, key, reserve)
    journey = Journey(
        kind,
        request_id_of(request),
        key,
        body.model,
        started,
        decision.reservation,
        prompt_estimate=prompt_tokens,
    )
    limit_headers = rate_limit_headers(decision)
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    headers = {"Content-Type": "application/json", "x-request-id": journey.request_id, **state.pool.headers}
    if body.stream:
        upstream_body = msgspec.structs.replace(body, stream_options=StreamOptions(include_usage=True))
        return await _stream(
            request,
            state,
            journey,
            path,
            json_encoder.encode(upstream_body),
            headers,
            limit_headers,
            keep_usage=body.wants_usage_chunk(),
        )
    return await _unary(request, state, journey, path, await request.read(), headers, limit_headers)


async def _unary(
    request: web.Request,
    state: EdgeState,
    journey: Journey,
    path: str,
    body: bytes,
    headers: dict[str, str],
    limit_headers: dict[str, str],
) -> web.Response:
    forwarded = time.perf_counter()
    state.metrics.overhead.observe(forwarded - journey.started)
    try:
        opened = await open_upstream(state.pool, path, body, headers, state.metrics)
        journey.region = opened.region.name
        async with opened.response as upstream:
            payload = await upstream.read()
            status = upstream.status
    except ApiError:
        await _finish(state, journey, None, 0, "error", 503)
        raise
    except asyncio.CancelledError:
        # The client left before the answer: the region's request is cancelled with us; the row says so.
        state.in_background(_finish(state, journey, None, 0, "aborted", 499))
        raise
    usage = usage_of(payload) if status == 200 else None
    await _finish(state, journey, usage, 0, "ok" if status == 200 else "error", status)
    response_headers = {
        **limit_headers,
        REGION_HEADER: opened.region.name,
        "Server-Timing": opened.timing.header(forwarded - journey.started),
    }
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return web.Response(
        status=status, body=payload, content_type="application/json", headers=response_headers
    )


async def _stream(
    request: web.Request,
    state: EdgeState,
    journey: Journey,
    path: str,
    body: bytes,
    headers: dict[str, str],
    limit_headers: dict[str, str],
    keep_usage: bool,
) -> web.StreamResponse:
    server = state.config.server
    client = web.StreamResponse(headers={**sse.HEADERS, **limit_headers, "x-request-id": journey.request_id})
    relay = SseRelay(client, keep_usage)
    prepare_lock = asyncio.Lock()

    async def commit() -> None:
        async with prepare_lock:
            if not client.prepared:
                await client.prepare(request)

    forwarded = time.perf_counter()
    state.metrics.overhead.observe(forwarded - journey.started)

    def cut_off() -> None:
        if request.transport is not None:
            request.transport.close()

    watchdog = StreamWatchdog(
        relay, state.config.upstream.heartbeat_s, server.write_timeout_s, commit, cut_off
    )
    watchdog.start()
    outcome = relay.outcome
    opened: Opened | None = None
    status = "aborted"
    try:
        try:
            opened = await open_upstream(state.pool, path, body, headers, state.metrics)
        except ApiError as exc:
            status = "error"
            if not client.prepared:
                raise
            await relay.write(b"data: " + exc.to_json() + b"\n\n")
            return await _end_stream(state, journey, client, relay, outcome, status, 503)
        journey.region = opened.region.name
        async with opened.response as upstream:
            if upstream.status != 200:
                # The region refused the request itself (a 4xx): pass its answer on unchanged.
                payload = await upstream.read()
                status = "error"
                if not client.prepared:
                    await _finish(state, journey, None, 0, status, upstream.status)
                    return web.Response(
                        status=upstream.status,
                        body=payload,
                        content_type="application/json",
                        headers={**limit_headers, REGION_HEADER: journey.region},
                    )
                await relay.write(b"data: " + payload + b"\n\n")
                return await _end_stream(state, journey, client, relay, outcome, status, upstream.status)
            async with prepare_lock:
                if not client.prepared:
                    client.headers[REGION_HEADER] = journey.region
                    client.headers["Server-Timing"] = opened.timing.header(forwarded - journey.started)
                    await client.prepare(request)
            outcome = await relay.relay(upstream)
        if relay.first_write_at:
            state.metrics.ttft.observe(relay.first_write_at - journey.started)
        if outcome.upstream_error and not outcome.done:
            status = "error"
            error = ApiError(UPSTREAM_UNAVAILABLE, f"The region failed mid-stream: {outcome.upstream_error}")
            await relay.write(b"data: " + error.to_json() + b"\n\n")
        else:
            status = "error" if outcome.upstream_error else "ok"
        return await _end_stream(state, journey, client, relay, outcome, status, 200)
    except asyncio.CancelledError:
        # The client left: leaving this block closed the upstream request, so the region aborts the
        # sequence. Bill what was relayed, once, although this task is being cancelled.
        state.in_background(
            _finish(state, journey, relay.outcome.usage, relay.outcome.token_events, "aborted", 499)
        )
        if opened is not None:
            state.in_background(state.pool.replenish(opened.region))
        raise
    except (ConnectionError, TimeoutError):
        # The client stopped reading (write timeout) or its socket broke: cut it off, bill what it got.
        await _finish(state, journey, relay.outcome.usage, relay.outcome.token_events, "aborted", 499)
        if request.transport is not None:
            request.transport.close()
        if opened is not None:
            state.in_background(state.pool.replenish(opened.region))
        return client
    finally:
        await watchdog.stop()


async def _end_stream(
    state: EdgeState,
    journey: Journey,
    client: web.StreamResponse,
    relay: SseRelay,
    outcome: StreamOutcome,
    status: str,
    http_status: int,
) -> web.StreamResponse:
    # The ledger row is committed before [DONE]: a client that saw the end has been billed.
    await _finish(state, journey, outcome.usage, outcome.token_events, status, http_status)
    await relay.write(sse.DONE)
    await client.write_eof()
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return client


async def _finish(
    state: EdgeState,
    journey: Journey,
    usage: Usage | None,
    relayed_tokens: int,
    status: str,
    http_status: int,
) -> None:
    """Settle the TPM reservation to what was really used and write the request's one ledger row."""
    if journey.billed:
        return  # e.g. the client left while the row was being committed: never bill twice
    journey.billed = True
    if usage is None:
        # No usage from the region (it failed or the client left): bill the prompt estimate if any
        # token was produced, plus the tokens relayed so far.
        prompt = journey.prompt_estimate if relayed_tokens else 0
        usage = Usage.of(prompt, relayed_tokens)
    cached = usage.prompt_tokens_details.cached_tokens
    cost = state.prices.cost(journey.model, usage.prompt_tokens, cached, usage.completion_tokens)
    if journey.reservation is not None:
        state.in_background(_settle(state, journey, usage.total_tokens))
    record = UsageRecord(
        request_id=journey.request_id,
        ts=time.time(),
        key_id=journey.key.key_id,
        tenant=journey.key.tenant,
        model=journey.model,
        region=journey.region,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=cached,
        completion_tokens=usage.completion_tokens,
        cache_status="bypass",
        cost_usd=cost,
        status=status,
        http_status=http_status,
    )
    try:
        await state.ledger.record(record)
    except Exception:
        state.metrics.ledger_errors.inc()
        log.exception("usage record %s could not be written", journey.request_id)
    m = state.metrics
    m.requests.labels(status, journey.region or "none").inc()
    m.prompt_tokens.labels(journey.model).inc(usage.prompt_tokens)
    m.cached_tokens.labels(journey.model).inc(cached)
    m.generation_tokens.labels(journey.model).inc(usage.completion_tokens)
    m.cost.labels(journey.model, journey.key.tenant).inc(cost)
    if journey.key.key_id in state.spent_usd:
        state.spent_usd[journey.key.key_id] += cost


async def _settle(state: EdgeState, journey: Journey, tokens: int) -> None:
    try:
        await state.limiter.settle(journey.key.key_id, journey.reservation or "", tokens)
    except Exception:  # a failed refund only makes the limit stricter for a minute
        log.warning("could not settle the reservation of %s", journey.request_id, exc_info=True)
