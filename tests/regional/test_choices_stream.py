"""One request's choices streamed together (regional/choices.py): a choice that fails with something other
than an API error after the stream began ends the response at once (no handler left waiting) and stops the
other choices' generations."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from nearshore.httpkit import REQUEST_ID_KEY
from nearshore.protocol.schemas import FinishReason, Usage
from regional import choices


class Timings:
    def server_timing(self) -> str:
        return "ttft;dur=1"


class FakeGeneration:
    """Yields its items, then raises ``fails_with`` (if any), or runs until cancelled (``forever``)."""

    def __init__(self, items: list[str], fails_with: Exception | None = None, forever: bool = False) -> None:
        self.items, self.fails_with, self.forever = items, fails_with, forever
        self.timings = Timings()
        self.usage = Usage.of(1, len(items), 0)
        self.closed = asyncio.Event()

    async def __aiter__(self):
        try:
            for text in self.items:
                yield text, None, []
                await asyncio.sleep(0.01)
            if self.fails_with is not None:
                raise self.fails_with
            while self.forever:
                await asyncio.sleep(0.05)
            yield "", "stop", []
        finally:
            self.closed.set()  # what a real generation's cleanup does: its sequence is aborted


class Chunks:
    include_usage = False

    def first(self, _generation) -> bytes:
        return b"data: first\n\n"

    def text(self, text: str, _scored) -> bytes:
        return f"data: {text}\n\n".encode()

    def end(self, finish: FinishReason) -> bytes:
        return f"data: end {finish}\n\n".encode()

    def usage(self, usage: Usage) -> bytes:
        return b""


async def test_a_choice_failing_mid_stream_ends_the_response_and_stops_the_others():
    failing = FakeGeneration(["a", "b"], fails_with=RuntimeError("the sampler broke"))
    endless = FakeGeneration(["x"], forever=True)
    handler_done = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        request[REQUEST_ID_KEY] = "req-choices"
        try:
            return await choices.stream(request, [(failing, Chunks()), (endless, Chunks())])
        finally:
            handler_done.set()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app)
    await server.start_server()
    try:
        url = server.make_url("/v1/chat/completions")
        async with aiohttp.ClientSession() as session, session.post(url, json={}) as response:
            assert response.status == 200
            body = b""
            try:
                async with asyncio.timeout(5):
                    async for chunk in response.content.iter_any():
                        body += chunk
            except aiohttp.ClientPayloadError:
                pass  # the connection is cut: the stream cannot end cleanly after a failure
        assert b"data: a" in body and b"[DONE]" not in body
        async with asyncio.timeout(5):
            await handler_done.wait()
            await endless.closed.wait()  # the other choice's generation was stopped, not left running
    finally:
        await server.close()
