"""A lean HTTP/1.1 server for the edge's hot routes, and aiohttp's server for everything else.

Every client connection starts here. A request on a hot route (a POST the caller's ``route`` answers with a
handler), framed plainly (one Content-Length, no transfer coding, no ``Expect``), is read, handed to its
handler as an :class:`Exchange`, and answered on the connection's transport with no per-request objects
beyond the exchange and its task. Anything else (another route, a chunked or malformed request, a head or
body past the limits) hands the connection, its bytes untouched, to ``fallback``: aiohttp's request handler,
which answers it as it always did, so the lean path never decides what an odd request means.

What a connection guarantees, as aiohttp's server does for the edge: one request at a time (a pipelined
next one waits in the buffer), the handler's task cancelled when the client leaves, a head that trickles in
cut off after ``head_timeout_s``, an idle kept-alive connection closed after ``keepalive_s``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

from multidict import CIMultiDict, CIMultiDictProxy

log = logging.getLogger("nearshore.edge")

HEAD_END = b"\r\n\r\n"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
# A header name is an RFC 9110 token; anything else goes to aiohttp, which says what is wrong with it.
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# Framings the lean path leaves to aiohttp: a body it would have to decode, or a promise to answer first.
_HANDED_OVER = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
# A control character in the head (a CR or LF not in a line end included): aiohttp refuses such a head.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")
_PAUSE_AT = 1 << 16  # a pipelining client's bytes held while a request runs, before its reads pause


@dataclass(frozen=True, slots=True)
class Limits:
    max_head_bytes: int = 16384
    max_body_bytes: int = 1 << 20
    head_timeout_s: float = 10.0
    keepalive_s: float = 75.0


class Exchange:
    """One request on the lean path and its answer: a whole reply, or a head and then chunks."""

    __slots__ = ("_sent", "body", "headers", "keep_alive", "method", "path", "query", "target", "transport")

    def __init__(
        self,
        method: str,
        target: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        keep_alive: bool,
        transport: asyncio.Transport,
    ) -> None:
        self.method, self.target, self.headers, self.body = method, target, headers, body
        self.path, _, self.query = target.partition("?")
        self.keep_alive = keep_alive
        self.transport = transport
        self._sent = 0  # 0: nothing sent; 1: a stream's head; 2: the whole answer

    @property
    def started(self) -> bool:
        return self._sent > 0

    @property
    def finished(self) -> bool:
        return self._sent == 2

    def reply(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """The whole answer at once."""
        assert self._sent == 0, "the answer was already begun"
        self._sent = 2
        head = self._head(status, headers) + b"Content-Length: %d\r\n\r\n" % len(body)
        self.transport.write(head + body)

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        """A streamed answer's head; its body follows in :meth:`write` and ends with :meth:`end`."""
        assert self._sent == 0, "the answer was already begun"
        self._sent = 1
        framing = b"Transfer-Encoding: chunked\r\n\r\n" if self.keep_alive else b"Connection: close\r\n\r\n"
        self.transport.write(self._head(status, headers) + framing)

    @property
    def chunked(self) -> bool:
        return self.keep_alive

    def write(self, data: bytes) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.keep_alive else data)

    def end(self, data: bytes = b"") -> None:
        """The stream's last bytes and its end, in one write."""
        assert self._sent == 1, "no stream was started"
        self._sent = 2
        if self.transport.is_closing():
            return
        if not self.keep_alive:
            if data:
                self.transport.write(data)
            return
        self.transport.write((b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n")

    def _head(self, status: int, headers: Mapping[str, str]) -> bytes:
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status"))]
        lines.extend(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        if not self.keep_alive and self._sent == 2:
            lines.append(b"Connection: close\r\n")
        return b"".join(lines)


Handler = Callable[[Exchange], Awaitable[None]]
Route = Callable[[str, str], Handler | None]  # (method, path) -> the handler of a hot route, else None


class _Request:
    """A head that parsed plainly: what the lean path needs to read its body and run it."""

    __slots__ = ("headers", "keep_alive", "length", "method", "target")

    def __init__(self, method: str, target: str, headers: CIMultiDict[str], length: int, keep_alive: bool):
        self.method, self.target, self.headers = method, target, headers
        self.length, self.keep_alive = length, keep_alive


def parse_head(head: bytes) -> _Request | None:
    """The request in ``head`` (without its blank line), or None where the lean path should not judge it:
    aiohttp then reads the same bytes and answers (a 400 for a malformed head, chunked bodies, ...)."""
    if _CONTROL.search(head):
        return None
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].startswith(b"/"):
        return None
    method, target, version = parts
    if not method or not _TOKEN.issuperset(method):
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    length = -1
    connection = b""
    host = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or not _TOKEN.issuperset(name):
            return None  # also a folded line (it starts with a space)
        lower = name.lower()
        value = value.strip(b" \t")
        if lower in _HANDED_OVER:
            return None
        if lower == b"content-length":
            if length >= 0 or not value.isdigit():
                return None  # two lengths, or one that is not a number: a smuggling attempt, aiohttp says so
            length = int(value)
        elif lower == b"connection":
            connection = value.lower()
        elif lower == b"host":
            host = True
        headers.add(name.decode("latin-1"), value.decode("latin-1"))
    if version == b"HTTP/1.1" and not host:
        return None  # aiohttp refuses it (RFC 9112: a 1.1 request names its host)
    # An HTTP/1.0 client gets its answer on a connection that then closes (no chunks, no keep-alive).
    keep_alive = version == b"HTTP/1.1" and b"close" not in connection
    return _Request(
        method.decode("ascii", "replace"), target.decode("latin-1"), headers, max(length, 0), keep_alive
    )


class H1Server(asyncio.Protocol):
    """One client connection (see the module's docstring)."""

    def __init__(self, route: Route, fallback: Callable[[], asyncio.Protocol], limits: Limits) -> None:
        self.route, self.fallback, self.limits = route, fallback, limits
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._buffer = b""
        self._pending: tuple[_Request, Handler, int] | None = None  # a head read, its body still coming
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._handed = False
        self._idle = False  # between requests of a kept-alive connection (its keep-alive timer runs)

    # --- the transport's callbacks --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm(self.limits.head_timeout_s)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._next()
        elif len(self._buffer) > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        # As aiohttp's server: the client's FIN ends the connection, and with it the request it left (the
        # edge stops a region's work for a client who is gone).
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._disarm()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: the journey ends as aiohttp's handler cancellation ends it

    # --- requests -------------------------------------------------------------------------------------------

    def _next(self) -> None:
        transport = self.transport
        if transport is None or self._handed:
            return
        if self._pending is None:
            end = self._buffer.find(HEAD_END)
            if end < 0:
                if len(self._buffer) > self.limits.max_head_bytes:
                    self._hand_over()
                elif self._buffer and self._idle:  # a new request begins: its head has head_timeout_s
                    self._idle = False
                    self._arm(self.limits.head_timeout_s)
                return
            if end > self.limits.max_head_bytes:
                return self._hand_over()
            request = parse_head(self._buffer[:end])
            handler = self.route(request.method, request.target.partition("?")[0]) if request else None
            if request is None or handler is None or request.length > self.limits.max_body_bytes:
                return self._hand_over()
            self._pending = (request, handler, end + 4)
        request, handler, start = self._pending
        whole = start + request.length
        if len(self._buffer) < whole:
            return
        self._pending = None
        body, self._buffer = self._buffer[start:whole], self._buffer[whole:]
        self._disarm()
        exchange = Exchange(
            request.method,
            request.target,
            CIMultiDictProxy(request.headers),
            body,
            request.keep_alive,
            transport,
        )
        self._task = self._loop.create_task(self._run(handler, exchange))

    async def _run(self, handler: Handler, exchange: Exchange) -> None:
        try:
            await handler(exchange)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request on %s failed", exchange.path)
            if not exchange.started:
                exchange.keep_alive = False
                body = b'{"error":{"message":"internal error","type":"server_error","code":"internal_error"}}'
                exchange.reply(500, {"Content-Type": "application/json"}, body)
        finally:
            self._task = None
        transport = self.transport
        if transport is None:
            return
        if not exchange.finished or not exchange.keep_alive:
            transport.close() if exchange.finished else transport.abort()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if self._buffer:
            self._next()
        if self._task is None and not self._handed:
            self._idle = True
            self._arm(self.limits.keepalive_s)

    def _hand_over(self) -> None:
        """aiohttp's server takes the connection from here, reading the same bytes we were given."""
        transport = self.transport
        assert transport is not None and self._task is None
        self._handed = True
        self._disarm()
        protocol = self.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._paused:
            self._paused = False
            transport.resume_reading()
        data, self._buffer = self._buffer, b""
        if data:
            protocol.data_received(data)

    # --- timers ---------------------------------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self._loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport is not None and self._task is None and not self._handed:
            self.transport.close()  # an idle keep-alive, or a head or body that did not come in time
