"""A region inside the test's own process, answering each request as the test says: what a lying or noisy
region sends, byte for byte, behind a real edge (:func:`tests.edge_fixtures.start_edge`).

Start the edge with ``await asyncio.to_thread(start_edge, ...)``: its start waits for its probes of this
region, which are answered on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.edge_fixtures import Edge, start_edge

# kind ("chat" or "completions"), the request's JSON body, the request -> the answer
Answerer = Callable[[str, dict[str, Any], web.Request], Awaitable[web.StreamResponse]]


def completion(kind: str, model: str, text: str, usage: Any = None, *, with_usage: bool = True) -> bytes:
    """A unary answer holding ``text``, with ``usage`` as given (any JSON: a lie may be anything), or no
    ``usage`` key at all."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
    payload: dict[str, Any] = {
        "id": "fake-1",
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": 0,
        "model": model,
        "choices": [choice],
    }
    if with_usage:
        payload["usage"] = usage
    return json.dumps(payload).encode()  # json, not msgspec: it writes integers past int64 too


class FakeRegion:
    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.asked = 0  # completion requests received

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": "ready"})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        return await self.answer("chat", await request.json(), request)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        return await self.answer("completions", await request.json(), request)


@asynccontextmanager
async def serving(region: FakeRegion) -> AsyncIterator[str]:
    """The region's base URL while it serves on loopback."""
    server = TestServer(region.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@asynccontextmanager
async def edge_over(region: FakeRegion, folder: Path, name: str) -> AsyncIterator[Edge]:
    """A real edge process (plain HTTP) whose one region, ``name``, is ``region`` serving in this process;
    probed rarely, so that a test's own requests are what the region sees."""
    async with serving(region) as url:
        edge = await asyncio.to_thread(
            start_edge, folder, [(name, url)], tls={"enabled": False}, upstream={"health_interval_s": 60.0}
        )
        try:
            yield edge
        finally:
            await asyncio.to_thread(edge.stop)
