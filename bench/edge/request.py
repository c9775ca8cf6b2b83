"""The request every path of ``bench edge`` gets, and the client session it goes on."""

from __future__ import annotations

import json

import aiohttp

from bench.peers import MODEL, Endpoint
from harness.client import Stream, stream_once

STREAM_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0


def chat_body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def session_for(target: Endpoint) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, ssl=target.ssl or True)
    # A peer that accepts and then never answers (LiteLLM has, here) costs one read timeout, not the run.
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S, sock_connect=10, sock_read=READ_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def one_stream(
    session: aiohttp.ClientSession,
    target: Endpoint,
    body: bytes,
    expected_tokens: int,
    result: Stream,
    started: float | None = None,
) -> Stream:
    """One chat stream to ``target``; ``started`` (a perf_counter time) is when it was due to be sent."""
    url = target.url + "/v1/chat/completions"
    return await stream_once(
        session, url, body, target.headers, result, started=started, expected_tokens=expected_tokens
    )
