"""The hostile region's server: connections, requests, and the bounds every mode runs within.

Written on raw asyncio streams (netem/hostile_http.py reads the requests) because many modes break HTTP
itself. The modes are passed in (netem/hostile.py holds them); each request picks one by the body's
``user`` (``mode:<name>``), else the default. A mode whose answer is complete and well framed keeps the
connection; any other ends it, when it is done, when the peer closes or at the limit, whichever is first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError, kind_for_status
from netem.hostile_answers import Answer, encode
from netem.hostile_http import LAST_CHUNK, HttpError, Request, chunk, read_request, response_head

JSON = "application/json"
SSE = sse.HEADERS["Content-Type"]
IDLE_TIMEOUT_S = 60.0  # a keep-alive connection with no next request


@dataclass
class HostileSettings:
    name: str
    mode: str
    tokens: int
    limit_s: float
    max_connections: int


@dataclass
class Exchange:
    """One request on one connection, and the means to answer it."""

    request: Request
    body: dict[str, Any]
    settings: HostileSettings
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    answer: Answer

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))

    @property
    def honest_tokens(self) -> int:
        """The tokens a correct region would send: ``--tokens``, capped by max_tokens as the pacer does."""
        asked = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        if isinstance(asked, int) and asked > 0:
            return min(self.settings.tokens, asked)
        return self.settings.tokens

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()
        # drain() returns without yielding while the socket keeps up: yield, so an endless writer
        # never starves the other connections.
        await asyncio.sleep(0)

    def head(self, status: int, content_type: str, *, length: int | None, keep_alive: bool) -> bytes:
        headers = {"Content-Type": content_type}
        if content_type == SSE:
            headers.update(sse.HEADERS)
        headers["x-request-id"] = self.answer.request_id
        headers["Server-Timing"] = "queue;dur=0, prefill;dur=0"
        if length is None:
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers["Content-Length"] = str(length)
        headers["Connection"] = "keep-alive" if keep_alive and self.request.keep_alive else "close"
        return response_head(status, headers)

    async def send_whole(self, status: int, content_type: str, body: bytes) -> None:
        await self.send(self.head(status, content_type, length=len(body), keep_alive=True) + body)

    async def send_stream(self, events: list[bytes]) -> None:
        """A complete chunked SSE response, one chunk per event as the region writes them."""
        await self.send(self.head(200, SSE, length=None, keep_alive=True))
        for event in events:
            await self.send(chunk(event))
        await self.send(LAST_CHUNK)

    async def open_chunked(self, content_type: str) -> None:
        await self.send(self.head(200, content_type, length=None, keep_alive=False))


@dataclass(frozen=True)
class Mode:
    run: Callable[[Exchange], Awaitable[None]]
    keep_alive: bool  # the response is complete and well framed: the connection can serve the next one


class HostileRegion:
    """Accepts connections and answers each request by its mode, within the settings' bounds."""

    def __init__(self, settings: HostileSettings, modes: dict[str, Mode]) -> None:
        self.settings = settings
        self.modes = modes
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.settings.max_connections:
            writer.close()  # over the bound: refuse by closing, as an overloaded host would
            return
        self._writers.add(writer)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the peer left or went quiet: nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Drop every connection, so each handler ends on its own rather than being cancelled."""
        for writer in list(self._writers):
            writer.transport.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._writers:
                    await asyncio.sleep(0.01)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer the next request; True when the connection can carry another."""
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                request = await read_request(reader)
        except HttpError as exc:
            await _send_error(writer, exc.status, exc.message)
            return False
        if request is None:
            return False
        if request.method == "GET" and request.path == "/health":
            health = {"status": "ok", "model": "ready", "hostile": self.settings.name}
            await _send_json(writer, 200, {**health, "open_connections": self.open_connections}, request)
            return request.keep_alive
        if request.method == "GET" and request.path == "/v1/models":
            models = {"object": "list", "data": [{"id": "gemma-3-270m", "object": "model"}]}
            await _send_json(writer, 200, models, request)
            return request.keep_alive
        if request.path not in ("/v1/chat/completions", "/v1/completions"):
            await _send_error(writer, 404, f"no route {request.path}", request)
            return request.keep_alive
        if request.method != "POST":
            await _send_error(writer, 405, f"{request.method} not allowed on {request.path}", request)
            return request.keep_alive
        return await self._answer(request, reader, writer)

    async def _answer(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            body = msgspec.json.decode(request.body)
        except msgspec.DecodeError:
            body = None
        if not isinstance(body, dict):
            await _send_error(writer, 400, "the body must be a JSON object", request)
            return request.keep_alive
        name = self.settings.mode
        user = body.get("user")
        if isinstance(user, str) and user.startswith("mode:"):
            name = user.removeprefix("mode:")
        mode = self.modes.get(name)
        if mode is None:
            await _send_error(writer, 400, f"unknown hostile mode {name!r}", request, param="user")
            return request.keep_alive
        model = body.get("model") if isinstance(body.get("model"), str) else "gemma-3-270m"
        request_id = request.headers.get("x-request-id", "hostile")[:128]
        answer = Answer(request.path.endswith("chat/completions"), request_id, model)
        ex = Exchange(request, body, self.settings, reader, writer, answer)
        if mode.keep_alive:
            # Complete answers are bounded too: a peer that stops reading cannot hold one past the limit.
            async with asyncio.timeout(self.settings.limit_s):
                await mode.run(ex)
            return request.keep_alive
        await self._until_peer_leaves(ex, mode)
        return False

    async def _until_peer_leaves(self, ex: Exchange, mode: Mode) -> None:
        """Run a mode that ends with the connection: until it is done, the peer closes, or the limit."""
        work = asyncio.ensure_future(mode.run(ex))
        peer_gone = asyncio.ensure_future(_until_eof(ex.reader))
        try:
            await asyncio.wait(
                {work, peer_gone}, timeout=self.settings.limit_s, return_when="FIRST_COMPLETED"
            )
        finally:
            for task in (work, peer_gone):
                task.cancel()
            await asyncio.gather(work, peer_gone, return_exceptions=True)


async def _until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(64 * 1024):
        pass  # whatever else the peer sends is not read as a request: this connection is ending


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: Any, request: Request) -> None:
    await _send_body(writer, status, encode(payload), request.keep_alive)


async def _send_error(
    writer: asyncio.StreamWriter,
    status: int,
    message: str,
    request: Request | None = None,
    param: str | None = None,
) -> None:
    error = ApiError(kind_for_status(status), message, param=param)
    await _send_body(writer, status, error.to_json(), request is not None and request.keep_alive)


async def _send_body(writer: asyncio.StreamWriter, status: int, body: bytes, keep_alive: bool) -> None:
    headers = {
        "Content-Type": JSON,
        "Content-Length": str(len(body)),
        "Connection": "keep-alive" if keep_alive else "close",
    }
    writer.write(response_head(status, headers) + body)
    await writer.drain()
