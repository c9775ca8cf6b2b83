"""A stand-in region that misbehaves on purpose: ``nearshore hostile``.

It speaks the regional node's API shape (POST /v1/chat/completions and /v1/completions, GET /health,
GET /v1/models) so an edge routes to it, then answers as a faulty or hostile region would, to prove that
the edge trusts nothing from an upstream. Many modes break HTTP itself, so it is written on raw asyncio
streams rather than aiohttp's server.

The mode is chosen per request: the body's ``user`` field when it reads ``mode:<spec>`` (the edge
forwards the body unchanged, so a test picks a mode per request and runs modes side by side), else the
default that ``POST /_control`` set for a while, else ``--mode`` (``ok`` by default). A spec is a mode
with its arguments (``mode:stall-at:20:30``), or one per instance by ``--name``, since an edge sends the
same body to every replica (``mode:london=429:1,*=ok``; hostile_spec.py). An unknown mode or a bad
spec answers 400. The table below is a broken or lying region's modes; hostile_provider.py adds a
misbehaving provider's (429s, 5xx, resets, slow, stalled, cut and malformed streams, ``down``), with
their arguments. ``GET /_log`` lists the last requests with their arrival time, mode and status, and
``POST /_control`` (``{"mode": "<spec>", "for_s": 60}``) sets the default for a while
(hostile_server.py); both are for tests, on the hostile itself.

| mode               | what the caller gets                                                             |
|--------------------|----------------------------------------------------------------------------------|
| ok                 | a correct answer, streamed or not; usage: prompt 10, completion = tokens sent    |
| endless-body       | 200 application/json, chunked, a body that never ends (bytes at full speed)      |
| endless-stream     | SSE token events that never stop (ignores max_tokens, never sends [DONE])        |
| no-newline         | 200 text/event-stream whose bytes never hold a blank line (``data: aaaa...``)    |
| huge-event         | one SSE event of HUGE_EVENT_BYTES, then normal ones (unary: one huge body)       |
| usage-negative     | a correct answer whose usage is negative (unary body and stream usage chunk)     |
| usage-huge         | a correct answer claiming 1e15 completion tokens                                 |
| usage-overflow     | a correct answer claiming 2**70 completion tokens (past int64)                   |
| usage-over-max     | a correct answer claiming 842650 completion tokens, far past max_tokens          |
| too-many-tokens    | TOO_MANY_FACTOR times the tokens asked for, then usage claiming the tokens asked |
| truncated-length   | a Content-Length larger than the bytes sent (half the body), then close          |
| truncated-chunked  | chunked body with a bad chunk-size line mid-body, then close                     |
| close-mid-body     | chunked body, closed in the middle of the JSON (no last chunk)                   |
| truncated-json     | a complete HTTP response whose JSON is cut off (``{"id": "x", "choi``)           |
| html-200           | an HTML page, 200, text/html                                                     |
| html-418           | an HTML page, 418, text/html                                                     |
| sse-on-unary       | a unary request answered with an SSE stream (a stream request: ok)               |
| json-on-stream     | a stream request answered with a unary JSON body (a unary request: ok)           |
| hang               | reads the request, sends nothing, keeps the socket open                          |
| hang-after-headers | 200 headers (SSE for a stream, JSON for unary), then nothing, socket open        |
| slow-drip          | a correct response (head included), one byte every DRIP_INTERVAL_S              |
| error-401          | 401 with an OpenAI-shaped error (a region that does not trust this edge)         |
| garbage-error      | 400 labelled application/json whose body is not JSON                             |

Unless a row says otherwise, a mode answers stream and unary requests alike (the broken body is the
correct answer's, streamed or not). Bounds, so a test cannot leak through it: every mode ends when the
peer closes and after ``--limit-s`` at most; writes wait on drain(), so a peer that stops reading costs
no CPU; at most ``--max-connections`` sockets at once; request heads and bodies are bounded
(hostile_http.py). ``/health`` reports ``open_connections`` so a test can see them all gone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from harness.standins.hostile_answers import PROMPT_TOKENS, WORD, usage
from harness.standins.hostile_http import MAX_HEAD_BYTES, chunk
from harness.standins.hostile_provider import PROVIDER_MODES
from harness.standins.hostile_server import JSON, SSE, Exchange, HostileRegion, HostileSettings, Mode, checked
from harness.standins.hostile_spec import SpecError, parse
from nearshore.httpkit import install_uvloop
from nearshore.protocol import sse
from nearshore.protocol.errors import INVALID_API_KEY, ApiError

log = logging.getLogger("nearshore.hostile")

FILLER = b"a" * (64 * 1024)  # what endless bodies are made of
HUGE_EVENT_BYTES = 8 * 1024 * 1024
TOO_MANY_FACTOR = 50
DRIP_INTERVAL_S = 1.0
CUT_JSON = b'{"id": "x", "choi'
TEXT_MARK = "<text>"  # where an answer's text sits in its JSON
HTML = b"<!DOCTYPE html><html><head><title>Gateway</title></head><body><h1>Please sign in</h1></body></html>"
GARBAGE = b"<<upstream exploded>> \x00\xff{not json"


# ---- the answer a correct region gives, and its usage -----------------------------------------------


def _events(ex: Exchange, num_tokens: int, claimed: dict[str, Any], first_text: str = WORD) -> list[bytes]:
    return ex.answer.stream(num_tokens, claimed, ex.include_usage, first_text)


def _correct_body(ex: Exchange) -> tuple[str, bytes]:
    """The content type and whole body of the correct answer (SSE for a stream request)."""
    n = ex.honest_tokens
    if ex.stream:
        return SSE, b"".join(_events(ex, n, usage(PROMPT_TOKENS, n)))
    return JSON, ex.answer.unary(WORD * n, usage(PROMPT_TOKENS, n))


async def _correct(
    ex: Exchange, claimed: dict[str, Any] | None = None, num_tokens: int | None = None
) -> None:
    """A correct answer of ``num_tokens`` (honest by default) claiming ``claimed`` usage."""
    n = ex.honest_tokens if num_tokens is None else num_tokens
    claimed = claimed or usage(PROMPT_TOKENS, n)
    if ex.stream:
        await ex.send_stream(_events(ex, n, claimed))
    else:
        await ex.send_whole(200, JSON, ex.answer.unary(WORD * n, claimed))


# ---- the modes ----------------------------------------------------------------------------------------


def _lying(prompt_tokens: int, completion_tokens: int) -> Callable[[Exchange], Awaitable[None]]:
    async def run(ex: Exchange) -> None:
        await _correct(ex, usage(prompt_tokens, completion_tokens))

    return run


async def _too_many_tokens(ex: Exchange) -> None:
    n = ex.honest_tokens
    await _correct(ex, usage(PROMPT_TOKENS, n), num_tokens=max(n, 1) * TOO_MANY_FACTOR)


async def _endless_body(ex: Exchange) -> None:
    await ex.open_chunked(JSON)
    # The correct answer up to where its text begins, then text that never ends.
    head = ex.answer.unary(TEXT_MARK, usage(PROMPT_TOKENS, 0))
    await ex.send(chunk(head[: head.index(TEXT_MARK.encode())]))
    filler = chunk(FILLER)
    while True:
        await ex.send(filler)


async def _endless_stream(ex: Exchange) -> None:
    await ex.open_chunked(SSE)
    if ex.answer.chat:
        await ex.send(chunk(ex.answer.first_event()))
    batch = chunk(ex.answer.token_event() * 64)
    while True:
        await ex.send(batch)


async def _no_newline(ex: Exchange) -> None:
    await ex.open_chunked(SSE)
    await ex.send(chunk(b"data: "))
    filler = chunk(FILLER)
    while True:
        await ex.send(filler)


async def _huge_event(ex: Exchange) -> None:
    n = max(ex.honest_tokens, 1)
    huge = "a" * HUGE_EVENT_BYTES
    if ex.stream:
        await ex.send_stream(_events(ex, n, usage(PROMPT_TOKENS, n), first_text=huge))
    else:
        await ex.send_whole(200, JSON, ex.answer.unary(huge + WORD * (n - 1), usage(PROMPT_TOKENS, n)))


async def _truncated_length(ex: Exchange) -> None:
    content_type, body = _correct_body(ex)
    await ex.send(ex.head(200, content_type, length=len(body), keep_alive=False) + body[: len(body) // 2])


async def _truncated_chunked(ex: Exchange) -> None:
    content_type, body = _correct_body(ex)
    half = len(body) // 2
    await ex.open_chunked(content_type)
    await ex.send(chunk(body[:half]) + b"zz\r\n" + body[half : half + 16])


async def _close_mid_body(ex: Exchange) -> None:
    content_type, body = _correct_body(ex)
    await ex.open_chunked(content_type)
    await ex.send(chunk(body[: len(body) // 2]))


async def _truncated_json(ex: Exchange) -> None:
    if ex.stream:
        await ex.send_whole(200, SSE, b"data: " + CUT_JSON + b"\n\n" + sse.DONE)
    else:
        await ex.send_whole(200, JSON, CUT_JSON)


def _html(status: int) -> Callable[[Exchange], Awaitable[None]]:
    async def run(ex: Exchange) -> None:
        await ex.send_whole(status, "text/html; charset=utf-8", HTML)

    return run


# SSE for every request is the correct answer to a stream request; JSON for every one, to a unary one.
async def _sse_on_unary(ex: Exchange) -> None:
    n = ex.honest_tokens
    await ex.send_stream(_events(ex, n, usage(PROMPT_TOKENS, n)))


async def _json_on_stream(ex: Exchange) -> None:
    n = ex.honest_tokens
    await ex.send_whole(200, JSON, ex.answer.unary(WORD * n, usage(PROMPT_TOKENS, n)))


async def _hang(_ex: Exchange) -> None:
    await asyncio.Event().wait()  # until the peer closes or the limit


async def _hang_after_headers(ex: Exchange) -> None:
    await ex.open_chunked(SSE if ex.stream else JSON)
    await asyncio.Event().wait()


async def _slow_drip(ex: Exchange) -> None:
    content_type, body = _correct_body(ex)
    response = ex.head(200, content_type, length=len(body), keep_alive=False) + body
    for i in range(len(response)):
        await ex.send(response[i : i + 1])
        await asyncio.sleep(DRIP_INTERVAL_S)


async def _error_401(ex: Exchange) -> None:
    error = ApiError(INVALID_API_KEY, f"region {ex.settings.name} does not trust this caller")
    await ex.send_whole(401, JSON, error.to_json())


async def _garbage_error(ex: Exchange) -> None:
    await ex.send_whole(400, JSON, GARBAGE)


MODES: dict[str, Mode] = {
    "ok": Mode(_correct, True),
    "endless-body": Mode(_endless_body, False),
    "endless-stream": Mode(_endless_stream, False),
    "no-newline": Mode(_no_newline, False),
    "huge-event": Mode(_huge_event, True),
    "usage-negative": Mode(_lying(-PROMPT_TOKENS, -1000), True),
    "usage-huge": Mode(_lying(PROMPT_TOKENS, 10**15), True),
    "usage-overflow": Mode(_lying(PROMPT_TOKENS, 2**70), True),
    "usage-over-max": Mode(_lying(PROMPT_TOKENS, 842650), True),
    "too-many-tokens": Mode(_too_many_tokens, True),
    "truncated-length": Mode(_truncated_length, False),
    "truncated-chunked": Mode(_truncated_chunked, False),
    "close-mid-body": Mode(_close_mid_body, False),
    "truncated-json": Mode(_truncated_json, True),
    "html-200": Mode(_html(200), True),
    "html-418": Mode(_html(418), True),
    "sse-on-unary": Mode(_sse_on_unary, True),
    "json-on-stream": Mode(_json_on_stream, True),
    "hang": Mode(_hang, False),
    "hang-after-headers": Mode(_hang_after_headers, False),
    "slow-drip": Mode(_slow_drip, False),
    "error-401": Mode(_error_401, True),
    "garbage-error": Mode(_garbage_error, True),
}


# Every mode a request can pick: the region's above, the provider's (hostile_provider.py).
ALL_MODES: dict[str, Mode] = {**MODES, **PROVIDER_MODES}


def mode_spec(text: str) -> str:
    """``--mode``: a spec whose every choice names a mode and whose arguments bind."""
    try:
        return str(checked(ALL_MODES, parse(text)))
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument(
        "--mode",
        default="ok",
        type=mode_spec,
        metavar="SPEC",
        help="the mode when a body's user is not mode:<spec> (default ok): a mode with its arguments "
        "(stall-at:20:30) or one per --name (london=503,*=ok); modes: " + ", ".join(ALL_MODES),
    )
    parser.add_argument("--name", default="hostile")
    parser.add_argument("--tokens", type=int, default=16, help="tokens in a correct answer (default 16)")
    parser.add_argument(
        "--limit-s", type=float, default=300.0, help="the longest any one answer lasts (default 300 s)"
    )
    parser.add_argument("--max-connections", type=int, default=1000, help="sockets open at once")


async def _serve(settings: HostileSettings, host: str, port: int) -> None:
    region = HostileRegion(settings, ALL_MODES)
    server = await asyncio.start_server(region.handle, host, port, limit=MAX_HEAD_BYTES, reuse_address=True)
    log.info("hostile region %s on %s:%d, default mode %s", settings.name, host, port, settings.mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()
        server.close()
        await region.close()


def main(args: argparse.Namespace) -> int:
    install_uvloop()
    settings = HostileSettings(args.name, args.mode, args.tokens, args.limit_s, args.max_connections)
    asyncio.run(_serve(settings, args.host, args.port))
    return 0
