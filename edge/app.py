"""The edge proxy's HTTP surface: routes, the health and metrics endpoints, and one journey per request.

What happens to a request lives in the journey's stages (:mod:`edge.stages`) and its one exit
(:mod:`edge.pipeline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web

from edge import responses_api
from edge.admission import authenticate
from edge.cors import Cors
from edge.health import operator_health, public_health
from edge.inflight import drain
from edge.journey import Journey, Kind
from edge.keys import ApiKey
from edge.keys_admin import add_admin_routes
from edge.pipeline import Pipeline, run_journey
from edge.request_log import log_journey
from edge.stages import default_pipeline
from edge.state import EDGE, EdgeState
from nearshore import http_log
from nearshore.httpkit import (
    CLIENT_REQUEST_ID_KEY,
    metrics_response,
    minted_request_ids,
    name_the_server,
    openai_errors,
    request_id_of,
)
from nearshore.log_writer import dropped_lines
from nearshore.protocol import trace
from nearshore.protocol.errors import MODEL_NOT_FOUND, NOT_FOUND, ApiError
from nearshore.protocol.schemas import ModelCard, ModelList, json_encoder

log = logging.getLogger("nearshore.edge")

__all__ = ["EDGE", "PIPELINE", "EdgeState", "create_app", "create_metrics_app"]
PIPELINE = web.AppKey("pipeline", Pipeline)
API_PREFIXES = ("/v1", "")
STARTED_AT = int(time.time())  # a model card's ``created``, as the region gives it


def create_app(state: EdgeState, pipeline: Pipeline | None = None) -> web.Application:
    """The edge's app; ``pipeline`` replaces the default stages (a test adds one, say)."""
    app = web.Application(
        middlewares=[minted_request_ids, openai_errors], client_max_size=state.config.server.max_body_bytes
    )
    app[EDGE] = state
    app[PIPELINE] = pipeline or default_pipeline()
    app.cleanup_ctx.append(_lifetime)
    app.on_shutdown.append(_drain)
    app.on_response_prepare.append(name_the_server)
    # Each API path with and without /v1: a client whose base URL leaves it out (as LiteLLM's proxy takes).
    for prefix in API_PREFIXES:
        app.router.add_post(prefix + "/chat/completions", chat_completions)
        app.router.add_post(prefix + "/completions", completions)
        app.router.add_post(prefix + "/embeddings", embeddings)
        app.router.add_post(prefix + "/responses", responses)
        responses_api.add_routes(app, prefix)
        app.router.add_get(prefix + "/models", list_models)
        app.router.add_get(prefix + "/models/{model:.+}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", guarded_metrics)
    if state.config.server.cors_origins:
        Cors(state.config.server.cors_origins).install(app)
    return app


def create_metrics_app(state: EdgeState) -> web.Application:
    """The operator's listener (loopback by default): /metrics and /health with the details, no key needed;
    the key API (edge/keys_admin.py) when an admin token is configured."""
    app = web.Application(middlewares=[openai_errors])
    app[EDGE] = state
    app.on_response_prepare.append(name_the_server)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health_details)
    add_admin_routes(app, state.keys, state.admin_token)
    return app


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    state = app[EDGE]
    http_log.install()  # a malformed request: one line, not a traceback (once per process)
    await state.pool.start()
    yield
    await state.pool.close()
    if state.background:
        await asyncio.gather(*state.background, return_exceptions=True)
    await state.limiter.close()
    await state.ledger.close()
    state.responses.close()
    state.counter.close()


async def _drain(app: web.Application) -> None:
    """On shutdown (no new connections any more): the requests in flight get server.shutdown_timeout_s to
    finish, then the edge ends those still running, each with an error event (edge/inflight.py)."""
    state = app[EDGE]
    await drain(state.inflight, state.config.server.shutdown_timeout_s)


# --- endpoints ---------------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _proxy(request, "embeddings")


async def responses(request: web.Request) -> web.StreamResponse:
    """The Responses API, answered by the chat journey (edge/responses_turn.py)."""
    return await _proxy(request, "chat", api="responses")


async def list_models(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    key = authenticate(request, state)
    cards = [
        ModelCard(id=m, created=STARTED_AT)
        for m in (*state.config.models, *state.aliases)
        if _lists(state, key, m)
    ]
    return web.Response(body=json_encoder.encode(ModelList(cards)), content_type="application/json")


async def retrieve_model(request: web.Request) -> web.Response:
    """One model's card (the OpenAI client's ``models.retrieve``): a model the list shows this key, else
    404 as OpenAI answers a model it does not have."""
    state = request.app[EDGE]
    key = authenticate(request, state)
    name = request.match_info["model"]
    if not _lists(state, key, name):
        raise ApiError(MODEL_NOT_FOUND, f"The model `{name}` does not exist.", param="model")
    return web.Response(
        body=json_encoder.encode(ModelCard(id=name, created=STARTED_AT)), content_type="application/json"
    )


def _lists(state: EdgeState, key: ApiKey, model: str) -> bool:
    """Whether /v1/models shows ``model`` to ``key``: a model the key may use, or an alias (whose pick the
    key's models bound, edge/stages/rightsize.py)."""
    return model in state.aliases or (model in state.config.models and key.allows(model))


async def health(request: web.Request) -> web.Response:
    """Public: ok, or degraded and why in one word; 503 while the edge refuses requests (edge/health.py)."""
    body, status = public_health(request.app[EDGE])
    return web.json_response(body, status=status)


async def health_details(request: web.Request) -> web.Response:
    """The operator's listener: every detail, always 200 (it is the liveness probe's)."""
    return web.json_response(operator_health(request.app[EDGE]))


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
    state.metrics.limiter_resets.set(state.limiter.store_resets())
    state.metrics.log_lines_dropped.set(dropped_lines())
    state.metrics.keys_store_up.set(0 if state.keys.out_of_reach() else 1)
    state.metrics.keys_active.set(state.keys.active_keys())
    state.metrics.ledger_fleet_behind.set(state.fleet_ledger.behind if state.fleet_ledger else 0)
    state.metrics.ledger_waiting.set(state.ledger.spooled_rows)
    state.metrics.ledger_accepting.set(1 if state.ledger.accepting() else 0)
    if state.cache is not None:
        m_ = state.metrics
        m_.cache_up.set(0 if state.cache.failure else 1)
        for operation, count in state.cache.failure_counts.items():
            m_.cache_failures.labels(operation).set(count)
        m_.cache_over_share.set(state.cache.shares.refused)
        if state.cache.audit is not None:
            rate = state.cache.audit.rate()
            for bound, value in (("measured", rate.measured), ("lower", rate.lower), ("upper", rate.upper)):
                m_.cache_false_hit_rate.labels(bound).set(value)
            m_.cache_partitions_off.set(state.cache.audit.partitions_off)
            opened, closed = state.cache.audit.judged.counts(state.cache.check.threshold)
            m_.cache_judge_partitions.labels("opened").set(opened)
            m_.cache_judge_partitions.labels("closed").set(closed)
        with contextlib.suppress(Exception):  # a broken cache folder must not break /metrics
            m_.cache_entries.set(len(state.cache.store.entries))
            store = state.cache.store
            m_.cache_bytes.set(store.entries.volume() + store.index_bytes)
            m_.cache_partitions.set(store.partitions)
            m_.cache_open_maps.set(store.open_maps)
    now = time.monotonic()
    for upstream in state.pool.upstreams:
        replica, name, m = upstream.replica, upstream.name, state.metrics
        m.region_up.labels(name).set(1 if replica.health.routable(now) else 0)
        m.region_cooling.labels(name).set(upstream.cooling_left(now))
        m.region_rtt.labels(name).set(replica.latency.rtt_ms / 1000)
        m.region_inflight.labels(name).set(replica.inflight)
    return metrics_response(await state.metrics.render_off_loop())


# --- the proxy ---------------------------------------------------------------------------------------


async def _proxy(request: web.Request, kind: Kind, api: str = "") -> web.StreamResponse:
    state = request.app[EDGE]
    journey = Journey(
        request,
        state,
        kind,
        time.perf_counter(),
        request_id_of(request),
        request[CLIENT_REQUEST_ID_KEY],
        trace=trace.incoming(request.headers),  # a malformed traceparent starts a new trace
        span_id=trace.new_span_id(),
        api=api,
    )
    if state.config.logging.format != "json":
        return await run_journey(request.app[PIPELINE], journey)
    try:
        return await run_journey(request.app[PIPELINE], journey)
    finally:
        log_journey(journey)  # after the answer's last byte, whatever the outcome
