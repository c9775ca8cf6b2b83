"""The hostile region's server: connections, requests, and the bounds every mode runs within.

Written on raw asyncio streams (hostile_http.py reads the requests) because many modes break HTTP
itself. The modes are passed in (hostile.py and hostile_provider.py hold them); each request
picks one by the body's ``user`` (``mode:<spec>``, hostile_spec.py), else the ``POST /_control``
override while it lasts, else ``--mode``. A mode whose answer is complete and well framed keeps the
connection; any other ends it, when it is done, when the peer closes or at the limit, whichever is first.
A complete answer that waits on purpose (:meth:`Exchange.pause`) still ends as soon as the peer leaves.

Besides the regional API it serves two test routes, on itself only: ``GET /_log`` (``DELETE`` clears it),
the last requests it received (hostile_state.py), and ``GET|POST /_control``, the override.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from harness.standins.hostile_answers import Answer, encode
from harness.standins.hostile_http import LAST_CHUNK, HttpError, Request, chunk, read_request, response_head
from harness.standins.hostile_spec import Choice, Param, Spec, SpecError, bind, parse
from harness.standins.hostile_state import Memory, Override, Record, RequestLog
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError, kind_for_status

JSON = "application/json"
SSE = sse.HEADERS["Content-Type"]
IDLE_TIMEOUT_S = 60.0  # a keep-alive connection with no next request
PEER_POLL_S = 0.05  # how often a pause looks whether the peer has left
MAX_CONTROL_BYTES = 4096
MAX_CONTROL_S = 86_400.0
DEFAULT_CONTROL_S = 60.0


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
    args: dict[str, Any]  # the mode's arguments, bound to its Params
    memory: Memory  # the instance's, shared by every request
    record: Record  # this request's line in /_log

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
        return self.capped(self.settings.tokens)

    def capped(self, num_tokens: int) -> int:
        """``num_tokens``, capped by the request's max_tokens as a region caps its answer."""
        asked = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        if isinstance(asked, int) and asked > 0:
            return min(num_tokens, asked)
        return num_tokens

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()
        # drain() returns without yielding while the socket keeps up: yield, so an endless writer
        # never starves the other connections.
        await asyncio.sleep(0)

    async def pause(self, seconds: float) -> None:
        """Send nothing for ``seconds``; end at once (ConnectionResetError) when the peer leaves first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            if self.reader.at_eof() or self.reader.exception() is not None:
                raise ConnectionResetError("the peer left during a pause")
            await asyncio.sleep(min(left, PEER_POLL_S))

    def head(
        self,
        status: int,
        content_type: str,
        *,
        length: int | None,
        keep_alive: bool,
        extra: dict[str, str] | None = None,
    ) -> bytes:
        self.record.status = status
        headers = {"Content-Type": content_type, **(extra or {})}
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

    async def send_whole(
        self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        head = self.head(status, content_type, length=len(body), keep_alive=True, extra=extra)
        await self.send(head + body)

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
    params: tuple[Param, ...] = ()  # its arguments in a spec (mode:name:arg:arg), in order
    # Called when POST /_control installs this mode, so a fault keyed on first sight starts over then.
    arm: Callable[[Memory, dict[str, Any]], None] | None = None


def bound(modes: dict[str, Mode], choice: Choice) -> tuple[Mode, dict[str, Any]]:
    """The choice's mode and its arguments' values; SpecError when either is wrong."""
    mode = modes.get(choice.mode)
    if mode is None:
        raise SpecError(f"unknown hostile mode {choice.mode!r}")
    return mode, bind(mode.params, choice)


def checked(modes: dict[str, Mode], spec: Spec) -> Spec:
    """The spec, once every choice in it (other instances' too) names a mode whose arguments bind."""
    for choice in spec.by_target.values():
        bound(modes, choice)
    return spec


class HostileRegion:
    """Accepts connections and answers each request by its mode, within the settings' bounds."""

    def __init__(self, settings: HostileSettings, modes: dict[str, Mode]) -> None:
        self.settings = settings
        self.modes = modes
        self.default = self.checked(parse(settings.mode))  # SpecError on a bad --mode
        self.log = RequestLog()
        self.memory = Memory()
        self.override: Override | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    # ---- which mode ------------------------------------------------------------------------------------

    def bound(self, choice: Choice) -> tuple[Mode, dict[str, Any]]:
        return bound(self.modes, choice)

    def checked(self, spec: Spec) -> Spec:
        return checked(self.modes, spec)

    def choose(self, user: object) -> tuple[Choice, str]:
        """This request's choice and its source: the body's user, the override, --mode, else ok."""
        name = self.settings.name
        asked = user.removeprefix("mode:") if isinstance(user, str) and user.startswith("mode:") else None
        if asked is not None and (picked := self.checked(parse(asked)).pick(name)):
            return picked, "request"
        if self.override is not None and not self.override.active:
            self.override = None
        if self.override is not None and (picked := self.override.spec.pick(name)):
            return picked, "control"
        if picked := self.default.pick(name):
            return picked, "flag"
        return Choice("ok"), "fallback"

    # ---- connections -------------------------------------------------------------------------------------

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
            await _Reply(writer, False).error(exc.status, exc.message)
            return False
        if request is None:
            return False
        if request.path == "/_log":  # reading the log does not add to it
            await self._log_route(request, _Reply(writer, request.keep_alive))
            return request.keep_alive
        record = Record(time.time(), request.method, request.path, request.headers.get("x-request-id"))
        self.log.add(record)
        try:
            return await self._route(request, _Reply(writer, request.keep_alive, record), reader, writer)
        finally:
            record.end_t = time.time()

    async def _route(
        self, request: Request, reply: _Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.method == "GET" and request.path == "/health":
            health = {"status": "ok", "model": "ready", "hostile": self.settings.name}
            await reply.json(200, {**health, "open_connections": self.open_connections})
        elif request.method == "GET" and request.path == "/v1/models":
            await reply.json(200, {"object": "list", "data": [{"id": "gemma-3-270m", "object": "model"}]})
        elif request.path == "/_control":
            await self._control_route(request, reply)
        elif request.path not in ("/v1/chat/completions", "/v1/completions"):
            await reply.error(404, f"no route {request.path}")
        elif request.method != "POST":
            await reply.error(405, f"{request.method} not allowed on {request.path}")
        else:
            return await self._answer(request, reply, reader, writer)
        return request.keep_alive

    # ---- the test routes ---------------------------------------------------------------------------------

    async def _log_route(self, request: Request, reply: _Reply) -> None:
        if request.method == "GET":
            log = {"name": self.settings.name, "now": time.time(), "requests": self.log.to_json()}
            await reply.json(200, log)
        elif request.method == "DELETE":
            await reply.json(200, {"cleared": self.log.clear()})
        else:
            await reply.error(405, f"{request.method} not allowed on /_log")

    async def _control_route(self, request: Request, reply: _Reply) -> None:
        if request.method == "POST":
            try:
                self.set_override(request.body)
            except HttpError as exc:
                await reply.error(exc.status, exc.message, param="mode" if exc.status == 400 else None)
                return
        elif request.method != "GET":
            await reply.error(405, f"{request.method} not allowed on /_control")
            return
        override = self.override if self.override is not None and self.override.active else None
        state = {
            "name": self.settings.name,
            "mode": str(override.spec) if override else None,
            "for_s": round(override.until - time.monotonic(), 3) if override else None,
            "default": str(self.default),
        }
        await reply.json(200, state)

    def set_override(self, body: bytes) -> None:
        """``{"mode": "<spec>", "for_s": 60}`` sets the default for a while; ``{"mode": null}`` ends it."""
        if len(body) > MAX_CONTROL_BYTES:
            raise HttpError(413, f"a control body is at most {MAX_CONTROL_BYTES} bytes")
        try:
            payload = msgspec.json.decode(body)
        except msgspec.DecodeError:
            payload = None
        if not isinstance(payload, dict):
            raise HttpError(400, 'the body must be a JSON object: {"mode": "<spec>" or null, "for_s": 60}')
        text, for_s = payload.get("mode"), payload.get("for_s", DEFAULT_CONTROL_S)
        if text is None:
            self.override = None
            return
        if not isinstance(text, str):
            raise HttpError(400, "mode must be a spec string, or null to end the override")
        if isinstance(for_s, bool) or not isinstance(for_s, int | float) or not 0 < for_s <= MAX_CONTROL_S:
            raise HttpError(400, f"for_s must be seconds above 0, at most {MAX_CONTROL_S:g}")
        try:
            spec = self.checked(parse(text))
        except SpecError as exc:
            raise HttpError(400, str(exc)) from None
        self.override = Override(spec, time.monotonic() + for_s)
        if (picked := spec.pick(self.settings.name)) is not None:
            mode, args = self.bound(picked)
            if mode.arm is not None:
                mode.arm(self.memory, args)

    # ---- the answers -------------------------------------------------------------------------------------

    async def _answer(
        self, request: Request, reply: _Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            body = msgspec.json.decode(request.body)
        except msgspec.DecodeError:
            body = None
        if not isinstance(body, dict):
            await reply.error(400, "the body must be a JSON object")
            return request.keep_alive
        try:
            choice, source = self.choose(body.get("user"))
            mode, args = self.bound(choice)
        except SpecError as exc:
            await reply.error(400, str(exc), param="user")
            return request.keep_alive
        assert reply.record is not None
        reply.record.mode, reply.record.source = str(choice), source
        model = body.get("model") if isinstance(body.get("model"), str) else "gemma-3-270m"
        request_id = request.headers.get("x-request-id", "hostile")[:128]
        answer = Answer(request.path.endswith("chat/completions"), request_id, model)
        ex = Exchange(request, body, self.settings, reader, writer, answer, args, self.memory, reply.record)
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


@dataclass
class _Reply:
    """A whole JSON answer on a connection, its status noted in the request's record when there is one."""

    writer: asyncio.StreamWriter
    keep_alive: bool
    record: Record | None = None

    async def json(self, status: int, payload: Any) -> None:
        await self.body(status, encode(payload))

    async def error(self, status: int, message: str, param: str | None = None) -> None:
        await self.body(status, ApiError(kind_for_status(status), message, param=param).to_json())

    async def body(self, status: int, body: bytes) -> None:
        if self.record is not None:
            self.record.status = status
        headers = {
            "Content-Type": JSON,
            "Content-Length": str(len(body)),
            "Connection": "keep-alive" if self.keep_alive else "close",
        }
        self.writer.write(response_head(status, headers) + body)
        await self.writer.drain()
