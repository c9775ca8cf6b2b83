"""The edge relays each event as it arrives, proved without a clock: a region in the test's own process sends
its next token only once the client has read the one before. An edge that held an event back (to bunch it
with the next, or until the end) would leave both sides waiting, and the stream would time out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from nearshore.protocol.sse import iter_data
from tests.fake_region import FakeRegion, edge_over

MODEL = "gemma-3-270m"
TOKENS = 8
WAIT_S = 30.0  # far beyond any relay on a busy machine: only an event held back waits this long


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    return _event(
        {"id": "c", "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


async def test_each_event_reaches_the_client_before_the_region_sends_the_next(tmp_path: Path):
    read = [asyncio.Event() for _ in range(TOKENS)]  # set by the client as it reads token i

    async def lockstep(kind: str, body: dict[str, Any], request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(TOKENS):
            await response.write(_chunk(f" t{i}"))
            await asyncio.wait_for(read[i].wait(), WAIT_S)
        await response.write(_chunk(None, "length"))
        usage = {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 3 + TOKENS}
        await response.write(_event({"id": "c", "model": MODEL, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        return response

    region = FakeRegion(lockstep)
    async with edge_over(region, tmp_path, "london") as edge, aiohttp.ClientSession() as session:
        key = edge.new_key()
        request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        request["max_tokens"] = TOKENS
        texts: list[str] = []
        async with session.post(
            edge.url + "/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.status == 200, await response.text()
            async for data in iter_data(response.content):
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                assert "choices" in chunk, chunk  # an error event: the edge gave up on a region left waiting
                delta = chunk["choices"][0]["delta"].get("content")
                if delta:
                    read[len(texts)].set()
                    texts.append(delta)
    assert texts == [f" t{i}" for i in range(TOKENS)]
    assert region.asked == 1  # one region stream, never retried after a timeout
