"""The regional node's HTTP app: OpenAI-compatible endpoints over one engine."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from aiohttp import web

from nearshore.httpkit import (
    Handler,
    metrics_response,
    name_the_server,
    openai_errors,
    read_json,
    request_id_of,
    request_ids,
)
from nearshore.protocol import sse
from nearshore.protocol.answers import ChatAnswer, TextAnswer
from nearshore.protocol.errors import INVALID_API_KEY, MODEL_NOT_FOUND, UNSUPPORTED_PARAMETER, ApiError
from nearshore.protocol.headers import EDGE_SECRET
from nearshore.protocol.response_events import ResponseEvents, ResponseFrame, whole_response
from nearshore.protocol.responses import chat_request, input_items, responses_request_decoder
from nearshore.protocol.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    FinishReason,
    ModelCard,
    ModelList,
    Usage,
    chat_request_decoder,
    completion_request_decoder,
    json_encoder,
)
from nearshore.tls import peer_certificate_name
from regional.chat_reply import ChatReply
from regional.choices import choice_requests, collect_all, stream, total_usage
from regional.config import RegionConfig, ServerConfig
from regional.embeddings import EMBEDDINGS, EmbeddingsService, add_embeddings
from regional.engine import Engine, Logprobs
from regional.load_report import LoadReporter, load_header
from regional.logprob_wire import CompletionLogprobsWriter
from regional.request_log import GENERATION, request_log
from regional.service import Generation, RegionService, Timings
from regional.share_key import share_key_of

SERVICE = web.AppKey("service", RegionService)
LOAD_REPORTER = web.AppKey("load_reporter", LoadReporter)
# The CN of the edge certificate a request came with (mutual TLS).
EDGE_NAME = web.RequestKey("edge", str)
STARTED_AT = int(time.time())

# Probes and scrapes come from the operator's monitoring, not from edges.
OPEN_PATHS = frozenset({"/health", "/health/ready", "/metrics"})


def create_app(
    config: RegionConfig,
    engine: Engine,
    service: RegionService,
    embeddings: EmbeddingsService | None = None,
) -> web.Application:
    middlewares = [request_ids, openai_errors]
    if config.logging.format == "json":  # outside the error middleware: it logs the status sent
        middlewares.insert(1, request_log(config.name))
    if guard := edges_only(config.server):
        middlewares.append(guard)  # inside openai_errors, so a refusal leaves OpenAI-shaped
    app = web.Application(middlewares=middlewares, client_max_size=config.server.max_body_bytes)
    app[SERVICE] = service
    app[LOAD_REPORTER] = reporter = LoadReporter(engine)
    app.on_response_prepare.append(load_header(reporter))
    app.on_response_prepare.append(name_the_server)
    app.cleanup_ctx.append(_engine_lifetime(engine))
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
    if embeddings is not None:
        add_embeddings(app, embeddings)
    app.router.add_get("/health", health)
    app.router.add_get("/health/ready", readiness)
    app.router.add_get("/metrics", metrics)
    return app


def _engine_lifetime(engine: Engine):
    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.close()

    return lifetime


Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def edges_only(server: ServerConfig) -> Middleware | None:
    """A middleware that serves only edges, or None when the node is open (no client_ca, no secret).

    An edge proves itself with a client certificate that verified against ``client_ca`` (any
    certificate that CA signed is an edge) and/or the shared secret header; every configured proof is
    required. Anything else gets 401 on every path but the open ones.
    """
    if not (server.client_ca or server.shared_secret):
        return None
    secret = server.shared_secret.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        if server.client_ca:
            edge = peer_certificate_name(request.transport)
            if edge is None:
                raise ApiError(
                    INVALID_API_KEY,
                    "Only Nearshore edges may call this node: "
                    "present a client certificate signed by the cluster CA.",
                )
            request[EDGE_NAME] = edge
        if secret:
            given = request.headers.get(EDGE_SECRET, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, secret):
                raise ApiError(
                    INVALID_API_KEY,
                    f"Only Nearshore edges may call this node: missing or incorrect {EDGE_SECRET}.",
                )
        return await handler(request)

    return guard


# --- endpoints ---------------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await answer_chat(request, await read_json(request, chat_request_decoder))


async def responses(request: web.Request) -> web.StreamResponse:
    """The Responses API over the chat path. A region keeps no responses (an edge does): the answer says
    ``store: false``, and a request that continues a stored one is refused."""
    body = await read_json(request, responses_request_decoder)
    if body.previous_response_id is not None:
        message = "a region keeps no responses; continue a stored response through an edge, which keeps them"
        raise ApiError(UNSUPPORTED_PARAMETER, f"previous_response_id is not supported here: {message}.")
    chat = chat_request(body, [], input_items(body))
    frame = ResponseFrame(body, body.model, store=False)
    if body.stream:
        return await answer_chat(request, chat, recode=ResponseEvents(frame).recode)
    return await answer_chat(
        request, chat, whole=lambda answer: json_encoder.encode(whole_response(frame, answer))
    )


async def answer_chat(
    request: web.Request,
    body: ChatCompletionRequest,
    recode: Callable[[bytes], bytes] | None = None,
    whole: Callable[[bytes], bytes] | None = None,
) -> web.StreamResponse:
    """A chat request's answer; ``recode`` (a stream) and ``whole`` (a unary answer) say it in another API."""
    timings = Timings()
    service = request.app[SERVICE]
    prepared = await service.prepare_chat(body, request_id_of(request), timings)
    prepared.share_key = share_key_of(request)
    service.check_room(body.n)
    generations = [service.run(p, timings) for p in choice_requests(prepared, body.n)]
    request[GENERATION] = generations[0]
    answer = ChatAnswer.for_request(prepared.request_id, _answer_model(service, body))
    names = service.token_names if prepared.logprobs is not None else None
    replies = [
        ChatReply(answer.choice(i), body.wants_usage_chunk(), names, prepared.tool_names)
        for i in range(len(generations))
    ]
    if body.stream:
        return await stream(request, list(zip(generations, replies, strict=True)), recode)
    results = await collect_all(generations)
    usage = total_usage(generations)
    wholes = [
        reply.whole(text, finish, usage, scored)
        for reply, (text, finish, scored) in zip(replies, results, strict=True)
    ]
    if whole is not None:
        return _json(msgspec.Raw(whole(json_encoder.encode(merged(wholes)))), timings)
    return _json(merged(wholes), timings)


async def completions(request: web.Request) -> web.StreamResponse:
    timings = Timings()
    body: CompletionRequest = await read_json(request, completion_request_decoder)
    service = request.app[SERVICE]
    prepared = await service.prepare_completion(body, request_id_of(request), timings)
    prepared.share_key = share_key_of(request)
    service.check_room(body.n)
    generations = [service.run(p, timings) for p in choice_requests(prepared, body.n)]
    request[GENERATION] = generations[0]
    answer = TextAnswer.for_request(prepared.request_id, _answer_model(service, body))

    def writer() -> CompletionLogprobsWriter | None:  # one per choice: its text_offset runs on
        return CompletionLogprobsWriter(service.token_names) if prepared.logprobs is not None else None

    if body.stream:
        runs = [
            (g, _CompletionChunks(answer.choice(i), body.wants_usage_chunk(), prepared.prompt_text, writer()))
            for i, g in enumerate(generations)
        ]
        return await stream(request, runs)
    results = await collect_all(generations)
    usage = total_usage(generations)
    wholes = []
    for i, (generation, (text, finish, scored)) in enumerate(zip(generations, results, strict=True)):
        w = writer()
        logprobs = w.render([*(generation.prompt_logprobs or []), *scored]) if w else None
        wholes.append(answer.choice(i).whole(prepared.prompt_text + text, finish, usage, logprobs))
    return _json(merged(wholes), timings)


async def list_models(request: web.Request) -> web.Response:
    cards = [ModelCard(id=name, created=STARTED_AT) for name in sorted(_served(request.app))]
    return web.Response(body=json_encoder.encode(ModelList(cards)), content_type="application/json")


async def retrieve_model(request: web.Request) -> web.Response:
    """One model's card (the OpenAI client's ``models.retrieve``)."""
    name = request.match_info["model"]
    if name not in _served(request.app):
        raise ApiError(MODEL_NOT_FOUND, f"The model `{name}` does not exist.", param="model")
    card = ModelCard(id=name, created=STARTED_AT)
    return web.Response(body=json_encoder.encode(card), content_type="application/json")


def _served(app: web.Application) -> set[str]:
    names = set(app[SERVICE].model_names)
    if embeddings := app.get(EMBEDDINGS):
        names |= embeddings.model_names
    return names


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves; says whether the model is in memory. 503 once the engine
    has failed for good (the process is about to exit), with the reason."""
    stats = request.app[SERVICE].engine.stats()
    payload = {
        "status": "ok",
        "model": stats.state,
        "engine": stats.engine,
        "running": stats.running,
        "waiting": stats.waiting,
    }
    payload["load"] = msgspec.to_builtins(request.app[LOAD_REPORTER].current()[0])
    if embeddings := request.app.get(EMBEDDINGS):
        payload["embeddings"] = embeddings.health()  # its failure is not the node's: chat still serves
    if stats.failure:
        payload.update(status="failed", reason=stats.failure)
    return web.json_response(payload, status=503 if stats.failure else 200)


async def readiness(request: web.Request) -> web.Response:
    """Readiness: 200 once requests can be served without waiting for a load, else 503 (with the reason
    when the engine has failed)."""
    stats = request.app[SERVICE].engine.stats()
    ready = stats.state in ("ready", "unloaded")  # an idle-unloaded model reloads on demand
    payload: dict[str, object] = {"ready": ready, "model": stats.state}
    if stats.failure:
        payload["reason"] = stats.failure
    return web.json_response(payload, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics.render()
    return metrics_response(body)


# --- answers -----------------------------------------------------------------------------------------


def _answer_model(service: RegionService, body: ChatCompletionRequest | CompletionRequest) -> str:
    """The model an answer names: a whole one, the name the client asked by (an alias, perhaps); a stream's
    chunks, the node's own name."""
    return service.config.model.name if body.stream else body.model


def merged(wholes: list[ChatCompletion] | list[Completion]) -> ChatCompletion | Completion:
    """One answer of every choice's (each built with the total usage)."""
    first = wholes[0]
    for other in wholes[1:]:
        first.choices.extend(other.choices)  # type: ignore[arg-type]
    return first


def _json(answer: object, timings: Timings) -> web.Response:
    return web.Response(
        body=json_encoder.encode(answer),
        content_type="application/json",
        headers={"Server-Timing": timings.server_timing()},
    )


class _CompletionChunks:
    """A text completion stream's events: the echoed prompt first (when asked), log-probabilities in
    the legacy shape, their ``text_offset`` running on across chunks."""

    def __init__(
        self, answer: TextAnswer, include_usage: bool, echo: str, writer: CompletionLogprobsWriter | None
    ) -> None:
        self.answer, self.include_usage, self.echo, self.writer = answer, include_usage, echo, writer

    def first(self, generation: Generation) -> bytes:
        # The echoed prompt, with its tokens' log-probabilities (known once the prompt has run).
        return self.text(self.echo, generation.prompt_logprobs or []) if self.echo else b""

    def text(self, text: str, scored: list[Logprobs]) -> bytes:
        logprobs = self.writer.render(scored) if self.writer is not None else None
        return sse.event(self.answer.content(text, logprobs))

    def end(self, finish: FinishReason) -> bytes:
        return sse.event(self.answer.finish(finish))

    def usage(self, usage: Usage) -> bytes:
        return sse.event(self.answer.usage(usage))
