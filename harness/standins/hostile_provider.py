"""The faults a misbehaving OpenAI-compatible provider shows, as modes of ``nearshore hostile``.

hostile.py holds the modes of a broken or lying region; these are the everyday faults of a provider
behind the edge: rate limits, 5xx, resets, slow or stalled streams, streams that end wrong. They test the
edge's failover, retries, deadlines and stream endings. A mode takes its arguments in the spec, in the
table's order (``mode:stall-at:3:1``, hostile_spec.py); one left out takes its default. ``at``
counts content (token) events: a chat stream's role opener comes before them and is not counted. An
answer is ``--tokens`` long, capped by max_tokens, unless said otherwise below.

| mode             | args, defaults        | what the caller gets                                           |
|------------------|-----------------------|----------------------------------------------------------------|
| 429              | retry_s=1             | 429 rate_limit_exceeded, ``Retry-After: <retry_s>``            |
| 429-date         | retry_s=1             | the same, Retry-After an HTTP date (now + retry_s, rounded up) |
| 429-bare         |                       | the same, no Retry-After                                       |
| 500-once         | tag=default           | 500 server_error to the tag's first request, then correct ones |
| 503              |                       | 503 service_unavailable, always                                |
| reset            |                       | reads the request, then resets the connection (RST)            |
| slow-first-token | wait_s=20             | nothing (not even the head) for wait_s, then a correct answer  |
| slow-first-event | wait_s=20             | the head at once, events (unary: body) after wait_s, then ok   |
| cut-at           | at=40 of=60           | ``at`` of ``of`` content events, then the body's clean end     |
| stall-at         | at=20 stall_s=30      | ``at`` content events, silence for stall_s, then the rest      |
| malformed-chunk  | at=10 kind=json       | a bad event after ``at`` content events, then the rest, [DONE] |
| no-done          |                       | a correct stream (finish, usage chunks) ending without [DONE]  |
| context-length   |                       | 400 invalid_request_error, code context_length_exceeded        |
| content-filter   |                       | 400 code content_filter, as Azure OpenAI sends it              |
| down             | down_s=60 tag=default | 503 for down_s since first seen (or /_control), then ok        |

cut-at's answer is ``of`` tokens (capped by max_tokens); its stream has no finish_reason, no usage chunk
and no [DONE]. stall-at and malformed-chunk answer max(``--tokens``, at + 1) tokens, capped by max_tokens,
so the fault sits between good events (before the finish chunk when max_tokens is smaller). ``kind`` is
``json`` (``data: {not json``) or ``shape`` (``data: {"foo": 1}``). Unary requests: cut-at sends a
well-framed chunked JSON body cut at the fraction at/of; stall-at pauses its Content-Length body at the
fraction at/n; malformed-chunk answers 200 with the bad body (``{not json`` or ``{"foo": 1}``); no-done
is a correct answer. A fractional retry_s goes out as written (``Retry-After: 0.5``, which HTTP does not
allow: a test of the edge's parser). ``500-once`` and ``down`` remember their keys (tag; down_s and tag)
per instance, bounded (hostile_state.py): use a new tag per test. Every mode but reset keeps the
connection; every wait ends as soon as the peer leaves, and every answer by ``--limit-s``.
"""

from __future__ import annotations

import math
import socket
import struct
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from harness.standins.hostile_answers import PROMPT_TOKENS, WORD, encode, usage
from harness.standins.hostile_http import LAST_CHUNK, chunk
from harness.standins.hostile_server import JSON, SSE, Exchange, Mode
from harness.standins.hostile_spec import Param, count, one_of, seconds, tag
from harness.standins.hostile_state import Memory
from nearshore.protocol.errors import CONTEXT_LENGTH_EXCEEDED, RATE_LIMITED

MAX_WAIT_S = 3600.0
MAX_EVENTS = 100_000
BAD_EVENTS = {"json": b"data: {not json\n\n", "shape": b'data: {"foo": 1}\n\n'}
BAD_BODIES = {"json": b"{not json", "shape": b'{"foo": 1}'}


@dataclass(frozen=True)
class ProviderError:
    """An error body as a provider sends it (these differ from Nearshore's own: a null code or type)."""

    status: int
    message: str
    type: str | None
    code: str | None
    param: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        fields = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return encode({"error": {**fields, **self.extra}})


RATE_LIMIT = ProviderError(
    429,
    "Rate limit reached for gemma-3-270m in organization org-hostile on requests per min (RPM): "
    "Limit 3, Used 3, Requested 1.",
    RATE_LIMITED.type,
    RATE_LIMITED.code,
)
SERVER_ERROR = ProviderError(
    500, "The server had an error while processing your request. Sorry about that!", "server_error", None
)
UNAVAILABLE = ProviderError(
    503, "The server is overloaded or not ready yet.", "server_error", "service_unavailable"
)
CONTEXT_LENGTH = ProviderError(
    400,
    "This model's maximum context length is 4096 tokens. However, your messages resulted in 5120 tokens. "
    "Please reduce the length of the messages.",
    CONTEXT_LENGTH_EXCEEDED.type,
    CONTEXT_LENGTH_EXCEEDED.code,
    "messages",
)
_NOT_FILTERED = {"filtered": False, "severity": "safe"}
CONTENT_FILTER = ProviderError(
    400,
    "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. "
    "Please modify your prompt and retry.",
    None,
    "content_filter",
    "prompt",
    {
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": _NOT_FILTERED,
                "self_harm": _NOT_FILTERED,
                "sexual": _NOT_FILTERED,
                "violence": {"filtered": True, "severity": "medium"},
            },
        },
    },
)


# ---- the pieces: the correct answer, a stream with a hole, an error --------------------------------------


def _events(ex: Exchange, num_tokens: int) -> list[bytes]:
    return ex.answer.stream(num_tokens, usage(PROMPT_TOKENS, num_tokens), ex.include_usage)


def _unary(ex: Exchange, num_tokens: int) -> bytes:
    return ex.answer.unary(WORD * num_tokens, usage(PROMPT_TOKENS, num_tokens))


def _after(ex: Exchange, num_content: int) -> int:
    """The index of the event after ``num_content`` content events (a chat stream opens with its role)."""
    return num_content + (1 if ex.answer.chat else 0)


def _fraction(body: bytes, part: int, whole: int) -> int:
    return len(body) * part // max(whole, 1)


async def _correct(ex: Exchange) -> None:
    n = ex.honest_tokens
    if ex.stream:
        await ex.send_stream(_events(ex, n))
    else:
        await ex.send_whole(200, JSON, _unary(ex, n))


async def _stream(ex: Exchange, events: list[bytes], pause_at: int = 0, pause_s: float = 0.0) -> None:
    """A well-framed chunked SSE response, silent for ``pause_s`` before ``events[pause_at]``."""
    await ex.send(ex.head(200, SSE, length=None, keep_alive=True))
    for i, event in enumerate(events):
        if i == pause_at:
            await ex.pause(pause_s)
        await ex.send(chunk(event))
    await ex.send(LAST_CHUNK)


async def _paused_body(ex: Exchange, body: bytes, pause_at: int, pause_s: float) -> None:
    """A Content-Length JSON response, silent for ``pause_s`` after its first ``pause_at`` body bytes."""
    await ex.send(ex.head(200, JSON, length=len(body), keep_alive=True) + body[:pause_at])
    await ex.pause(pause_s)
    await ex.send(body[pause_at:])


async def _error(ex: Exchange, error: ProviderError, headers: dict[str, str] | None = None) -> None:
    await ex.send_whole(error.status, JSON, error.body(), headers)


# ---- the modes ----------------------------------------------------------------------------------------


def _rate_limit(retry_s: float | None) -> ProviderError:
    later = "later" if retry_s is None else f"in {retry_s:g}s"
    return replace(RATE_LIMIT, message=f"{RATE_LIMIT.message} Please try again {later}.")


async def _429(ex: Exchange) -> None:
    retry_s = ex.args["retry_s"]
    await _error(ex, _rate_limit(retry_s), {"Retry-After": f"{retry_s:g}"})


async def _429_date(ex: Exchange) -> None:
    retry_s = ex.args["retry_s"]
    when = datetime.fromtimestamp(math.ceil(time.time() + retry_s), UTC)
    await _error(ex, _rate_limit(retry_s), {"Retry-After": format_datetime(when, usegmt=True)})


async def _429_bare(ex: Exchange) -> None:
    await _error(ex, _rate_limit(None))


def _once_key(args: dict[str, Any]) -> tuple[Any, ...]:
    return ("500-once", args["tag"])


async def _500_once(ex: Exchange) -> None:
    _, first = ex.memory.first_seen(_once_key(ex.args))
    await (_error(ex, SERVER_ERROR) if first else _correct(ex))


def _arm_500_once(memory: Memory, args: dict[str, Any]) -> None:
    memory.forget(_once_key(args))  # the next request with the tag fails again


async def _503(ex: Exchange) -> None:
    await _error(ex, UNAVAILABLE)


async def _reset(ex: Exchange) -> None:
    sock = ex.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ex.writer.transport.abort()  # with a zero linger the kernel sends RST, not FIN


async def _slow_first_token(ex: Exchange) -> None:
    await ex.pause(ex.args["wait_s"])
    await _correct(ex)


async def _slow_first_event(ex: Exchange) -> None:
    n = ex.honest_tokens
    if ex.stream:
        await _stream(ex, _events(ex, n), 0, ex.args["wait_s"])
    else:
        await _paused_body(ex, _unary(ex, n), 0, ex.args["wait_s"])


async def _cut_at(ex: Exchange) -> None:
    n = ex.capped(ex.args["of"])
    k = min(ex.args["at"], n)
    if ex.stream:
        await _stream(ex, _events(ex, n)[: _after(ex, k)])
        return
    body = _unary(ex, n)
    cut = chunk(body[: _fraction(body, k, n)]) if k else b""  # an empty chunk would end the body early
    await ex.send(ex.head(200, JSON, length=None, keep_alive=True) + cut + LAST_CHUNK)


def _faulty_length(ex: Exchange) -> tuple[int, int]:
    """Tokens in an answer with a fault after ``at`` of them, and where the fault sits."""
    n = ex.capped(max(ex.settings.tokens, ex.args["at"] + 1))
    return n, min(ex.args["at"], n)


async def _stall_at(ex: Exchange) -> None:
    n, k = _faulty_length(ex)
    if ex.stream:
        await _stream(ex, _events(ex, n), _after(ex, k), ex.args["stall_s"])
    else:
        body = _unary(ex, n)
        await _paused_body(ex, body, _fraction(body, k, n), ex.args["stall_s"])


async def _malformed_chunk(ex: Exchange) -> None:
    if not ex.stream:
        await ex.send_whole(200, JSON, BAD_BODIES[ex.args["kind"]])
        return
    n, k = _faulty_length(ex)
    events = _events(ex, n)
    events.insert(_after(ex, k), BAD_EVENTS[ex.args["kind"]])
    await _stream(ex, events)


async def _no_done(ex: Exchange) -> None:
    if not ex.stream:
        await _correct(ex)
        return
    await _stream(ex, _events(ex, ex.honest_tokens)[:-1])


async def _context_length(ex: Exchange) -> None:
    await _error(ex, replace(CONTEXT_LENGTH, param="messages" if ex.answer.chat else "prompt"))


async def _content_filter(ex: Exchange) -> None:
    await _error(ex, CONTENT_FILTER)


def _down_key(args: dict[str, Any]) -> tuple[Any, ...]:
    return ("down", args["down_s"], args["tag"])


async def _down(ex: Exchange) -> None:
    since, _ = ex.memory.first_seen(_down_key(ex.args))
    await (_error(ex, UNAVAILABLE) if time.monotonic() - since < ex.args["down_s"] else _correct(ex))


def _arm_down(memory: Memory, args: dict[str, Any]) -> None:
    memory.restart(_down_key(args))  # down from the moment the control set it


_WAIT = (Param("wait_s", seconds(MAX_WAIT_S), 20.0),)
_RETRY = (Param("retry_s", seconds(MAX_WAIT_S), 1.0),)
_AT = count(0, MAX_EVENTS)

PROVIDER_MODES: dict[str, Mode] = {
    "429": Mode(_429, True, _RETRY),
    "429-date": Mode(_429_date, True, _RETRY),
    "429-bare": Mode(_429_bare, True),
    "500-once": Mode(_500_once, True, (Param("tag", tag, "default"),), _arm_500_once),
    "503": Mode(_503, True),
    "reset": Mode(_reset, False),
    "slow-first-token": Mode(_slow_first_token, True, _WAIT),
    "slow-first-event": Mode(_slow_first_event, True, _WAIT),
    "cut-at": Mode(_cut_at, True, (Param("at", _AT, 40), Param("of", count(1, MAX_EVENTS), 60))),
    "stall-at": Mode(_stall_at, True, (Param("at", _AT, 20), Param("stall_s", seconds(MAX_WAIT_S), 30.0))),
    "malformed-chunk": Mode(
        _malformed_chunk, True, (Param("at", _AT, 10), Param("kind", one_of(*BAD_EVENTS), "json"))
    ),
    "no-done": Mode(_no_done, True),
    "context-length": Mode(_context_length, True),
    "content-filter": Mode(_content_filter, True),
    "down": Mode(
        _down, True, (Param("down_s", seconds(86_400), 60.0), Param("tag", tag, "default")), _arm_down
    ),
}
