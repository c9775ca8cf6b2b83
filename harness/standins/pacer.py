"""A stand-in region that streams tokens at a fixed pace: ``nearshore pacer``.

It speaks the regional node's API (OpenAI chat and completions, SSE, usage) without a model, so a
benchmark or a test measures the proxy in front of it, not decoding. Its pace is exact and it costs
little CPU: every chunk is encoded once at start. Each stream keeps its own clock from its arrival
(``--clock stream``, the default), or every stream's tokens leave on one shared step clock (``--clock
step``), as a region's batched decoder emits them: one token for each running sequence per step, whenever
each sequence joined. It can also misbehave on purpose: answer with an
error status, or drop the connection after a number of tokens. With a load state (``--load-state loading``)
it reports its load as a region does (``x-nearshore-load`` on every response, ``load`` in /health), so a
test can show the edge a replica that is still loading its model.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from aiohttp import web

from nearshore.protocol import sse
from nearshore.protocol.answers import Answer, answer_for
from nearshore.protocol.errors import MODEL_NOT_FOUND, ApiError
from nearshore.protocol.headers import LOAD
from nearshore.protocol.load import LoadReport, LoadState, format_load
from nearshore.protocol.schemas import Usage, json_encoder

WORD = " token"
PROMPT_TOKENS = 10  # every prompt, as the pacer counts it


class PacerSettings:
    def __init__(
        self,
        tokens: int,
        interval_s: float,
        fail_status: int,
        break_after: int,
        name: str,
        eof_delay_s: float = 0,
        load_state: LoadState | None = None,
        step_clock: bool = False,
    ) -> None:
        self.tokens = tokens
        self.interval_s = interval_s
        self.step_clock = step_clock  # tokens leave on one clock shared by every stream (a batched decoder's)
        self.fail_status = fail_status
        self.break_after = break_after
        # The end of the HTTP response trails [DONE] by this long, as it can when a network splits them.
        self.eof_delay_s = eof_delay_s
        self.name = name
        # Reported as a region reports its load; None: no report (an older region, or not a region).
        self.load = LoadReport(state=load_state) if load_state else None
        self.load_header = format_load(self.load) if self.load else ""
        # Requests answered to the end, and those whose client left first (an edge that cancelled them).
        self.answered = 0
        self.abandoned = 0
        # /v1/embeddings requests refused (a pacer serves no embedding model): who sent it questions
        self.embeddings_refused = 0


PACER = web.AppKey("pacer", PacerSettings)


def create_app(settings: PacerSettings) -> web.Application:
    app = web.Application()
    app[PACER] = settings
    app.router.add_post("/v1/chat/completions", _answer)
    app.router.add_post("/v1/completions", _answer)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/embeddings", _no_embeddings)
    if settings.load is not None:
        app.on_response_prepare.append(_add_load)
    return app


async def _add_load(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[LOAD] = request.app[PACER].load_header


async def _health(request: web.Request) -> web.Response:
    settings = request.app[PACER]
    payload: dict[str, object] = {
        "status": "ok",
        "model": "ready",
        "pacer": settings.name,
        "answered": settings.answered,
        "abandoned": settings.abandoned,
        "embeddings_refused": settings.embeddings_refused,
    }
    if settings.load is not None:
        payload.update(model=settings.load.state, load=msgspec.to_builtins(settings.load))
    return web.json_response(payload)


async def _no_embeddings(request: web.Request) -> web.Response:
    request.app[PACER].embeddings_refused += 1
    error = ApiError(MODEL_NOT_FOUND, "This pacer serves no embedding model.", param="model")
    return web.Response(body=error.to_json(), status=error.status, content_type="application/json")


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "gemma-3-270m", "object": "model"}]})


async def _answer(request: web.Request) -> web.StreamResponse:
    settings = request.app[PACER]
    try:
        response = await _answer_paced(request, settings)
    except asyncio.CancelledError:
        settings.abandoned += 1  # the client (an edge) went away: as a region, stop working on it
        raise
    settings.answered += 1
    return response


async def _answer_paced(request: web.Request, settings: PacerSettings) -> web.StreamResponse:
    body = await request.json()
    if settings.fail_status:
        return web.json_response(
            {
                "error": {
                    "message": f"pacer {settings.name} fails on purpose",
                    "type": "server_error",
                    "param": None,
                    "code": "overloaded",
                }
            },
            status=settings.fail_status,
        )
    chat = request.path.endswith("chat/completions")
    # As the region: max_completion_tokens, when sent, is the limit (OpenAI's newer name wins).
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    n = min(settings.tokens, int(asked or settings.tokens))
    usage = Usage.of(PROMPT_TOKENS, n)
    rid = request.headers.get("x-request-id", "pacer")
    if not body.get("stream"):
        answer = answer_for(chat, rid, body.get("model"))  # a request without a model gets null, as before
        await asyncio.sleep(_first_token_delay(settings) + settings.interval_s * (n - 1) if n else 0.0)
        return web.Response(
            body=json_encoder.encode(answer.whole(WORD * n, "length", usage)),
            content_type="application/json",
            charset="utf-8",
            headers={"Server-Timing": "pacer;dur=0"},
        )
    chunks = _chunks(answer_for(chat, rid, body.get("model", "")), n, usage)
    include_usage = (body.get("stream_options") or {}).get("include_usage", False)
    response = web.StreamResponse(headers={**sse.HEADERS, "Server-Timing": "queue;dur=0, prefill;dur=0"})
    await asyncio.sleep(_first_token_delay(settings))  # "prefill": the first token takes an interval too
    await response.prepare(request)
    started = time.perf_counter()
    for i, chunk in enumerate(chunks.tokens):
        if settings.break_after and i == settings.break_after:
            request.transport.close()  # the region dies mid-stream
            return response
        await response.write(chunk)
        # Pace against the start time, so scheduling delays never accumulate.
        delay = started + (i + 1) * settings.interval_s - time.perf_counter()
        if delay > 0 and i + 1 < len(chunks.tokens):
            await asyncio.sleep(delay)
    await response.write(chunks.end)
    if include_usage:
        await response.write(chunks.usage)
    await response.write(sse.DONE)
    if settings.eof_delay_s:
        await asyncio.sleep(settings.eof_delay_s)
    await response.write_eof()
    return response


def _first_token_delay(settings: PacerSettings) -> float:
    """How long the first token takes: one interval, or on the step clock until the first step at least
    one interval away (later tokens keep the interval from there, so they stay on the steps)."""
    return step_delay(time.perf_counter(), settings.interval_s, settings.step_clock)


def step_delay(now: float, interval_s: float, step_clock: bool) -> float:
    """The wait from ``now`` to the first token: ``interval_s``, or on the step clock (steps at the
    multiples of ``interval_s``) to the first step at least ``interval_s`` after ``now``."""
    if not step_clock or interval_s <= 0:
        return interval_s
    return interval_s + (-now) % interval_s


class _Chunks:
    def __init__(self, tokens: list[bytes], end: bytes, usage: bytes) -> None:
        self.tokens, self.end, self.usage = tokens, end, usage


def _chunks(answer: Answer, n: int, usage: Usage) -> _Chunks:
    """Every event of a stream of ``n`` tokens, encoded once (one token event, reused). A chat stream's
    role opener is written with its first token, so it takes no interval of its own."""
    token = sse.event(answer.content(WORD))
    tokens = [token] * n
    if (opener := answer.opener()) is not None:
        first = sse.event(opener)
        tokens = [first + token, *tokens[1:]] if n else [first]
    return _Chunks(tokens, sse.event(answer.finish("length")), sse.event(answer.usage(usage)))
