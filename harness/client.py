"""The one streaming client of the benchmarks, ``nearshore chat`` and the scenarios: send one OpenAI
streaming request and time what comes back.

A :class:`Stream` records, in seconds from when the request was sent (or was due to be sent, for an
open-loop load): TTFT (the first content event), the gap before each later content event (inter-token
latency), the last content event and the end (``data: [DONE]``); also the status, the serving region,
the response's Server-Timing parts and the usage event. A content event is one whose first choice carries
text (a chat delta's ``content`` or a completion's ``text``): the role, finish and usage events are not.

The reader takes any async iterable of raw body bytes, so a client that opens its own connection (the
scenarios' phase-by-phase probe) reads a stream exactly as an aiohttp client does.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import msgspec

from nearshore.protocol import sse
from nearshore.protocol.headers import CACHE, REGION, SERVER_TIMING
from nearshore.protocol.server_timing import parse_server_timing


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the server took from its prefix cache (0 when it does not say)."""
        details = self.prompt_tokens_details
        return details.cached_tokens if details is not None else 0


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] = []
    usage: Usage | None = None
    error: dict | None = None


_event_decoder = msgspec.json.Decoder(_Event)


@dataclass(slots=True)
class Stream:
    """One streamed answer as its client saw it; an empty ``error`` means it ended with ``[DONE]``."""

    status: int = 0
    ttft_s: float = 0.0
    last_token_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0  # content events
    gaps_s: list[float] = field(default_factory=list)
    usage: Usage | None = None
    region: str = ""
    cache: str = ""  # the edge's x-nearshore-cache: HIT, SEMANTIC or MISS ("" from a server without one)
    server_timing_ms: dict[str, float] = field(default_factory=dict)
    error: str = "unfinished"

    def server_timing_s(self, name: str) -> float:
        """One Server-Timing part in seconds; NaN when the server did not send it."""
        return self.server_timing_ms.get(name, math.nan) / 1000


def read_head(stream: Stream, status: int, headers: Mapping[str, str]) -> None:
    """What the response's head tells: status, serving region, cache, Server-Timing (case-blind headers)."""
    stream.status = status
    stream.region = headers.get(REGION, "")
    stream.cache = headers.get(CACHE, "")
    stream.server_timing_ms = parse_server_timing(headers.get(SERVER_TIMING, ""))


async def read_events(
    body: AsyncIterable[bytes],
    stream: Stream,
    started: float,
    *,
    expected_tokens: int | None = None,
    on_text: Callable[[str], object] | None = None,
) -> None:
    """Read an SSE body to ``[DONE]``, timing each content event from ``started`` (a perf_counter time);
    ``on_text`` sees each event's text as it arrives. An error event, or fewer content events than
    ``expected_tokens``, is the stream's error."""
    parser = sse.SseParser()
    async for piece in body:
        now = time.perf_counter() - started
        for data in parser.feed(piece):
            data = data.lstrip()
            if not data:
                continue  # an empty event
            if data == sse.DONE_DATA:
                stream.e2e_s = now
                short = expected_tokens is not None and stream.tokens != expected_tokens
                stream.error = f"{stream.tokens} of {expected_tokens} tokens" if short else ""
                return
            event = _event_decoder.decode(data)
            if event.error is not None:
                stream.error = f"error event: {data[:200]!r}"
                return
            if event.usage is not None:
                stream.usage = event.usage
            text = _text(event)
            if not text:
                continue  # the role, finish or usage event
            if on_text is not None:
                on_text(text)
            if stream.tokens == 0:
                stream.ttft_s = now
            else:
                stream.gaps_s.append(now - stream.last_token_s)
            stream.last_token_s = now
            stream.tokens += 1
    # An event the body cut off before its blank line is not whole (as the SSE spec reads it): not read.
    stream.error = "the stream ended without [DONE]"


def _text(event: _Event) -> str:
    for choice in event.choices:
        text = choice.delta.content if choice.delta is not None else choice.text
        if text:
            return text
    return ""


async def stream_once(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stream: Stream,
    *,
    started: float | None = None,
    expected_tokens: int | None = None,
    on_text: Callable[[str], object] | None = None,
) -> Stream:
    """POST one streaming request to ``url`` and read its answer into ``stream``; a failure of any kind
    (status, connection, timeout, a broken event) becomes ``stream.error``, never an exception."""
    started = time.perf_counter() if started is None else started
    try:
        async with session.post(url, data=body, headers=headers) as response:
            read_head(stream, response.status, response.headers)
            if response.status != 200:
                stream.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return stream
            await read_events(
                response.content.iter_any(), stream, started, expected_tokens=expected_tokens, on_text=on_text
            )
    except (TimeoutError, aiohttp.ClientError, OSError, msgspec.DecodeError) as exc:
        stream.error = repr(exc)[:200]
    return stream
