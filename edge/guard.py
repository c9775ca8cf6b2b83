"""Connection hygiene for the edge: a cap on open sockets and a deadline for request heads, both from accept.

Every accepted socket, its TLS handshake still running or not, counts against ``max_connections``, and a
client must finish the TLS handshake and a request's head within ``header_timeout_s`` of connecting (or
of its previous response), else it is closed. asyncio's TLS server would run the handshake out of sight
(60 s allowed by default) and show the connection to aiohttp only once it is done, so the edge listens on
plain TCP and upgrades each socket itself with ``loop.start_tls``, on the same clock as the headers.

aiohttp closes connections that send nothing, but stops timing once the first byte arrives, so a client
trickling header bytes could hold a connection forever: the head timer here closes it. These hook
aiohttp's request handler and server classes, so ``aiohttp`` is pinned below 4 in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import ssl
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.web_server import Server

from nearshore.api_runner import ApiRequestHandler

log = logging.getLogger("nearshore.edge.guard")

_REFUSAL_LOG_EVERY_S = 10.0  # under a flood, one warning per period, with the count


@dataclass(frozen=True)
class GuardSettings:
    header_timeout_s: float
    max_connections: int
    tls: ssl.SSLContext | None = None


class GuardedRequestHandler(ApiRequestHandler):
    __slots__ = ("_first_head_s", "_head_timer", "_header_timeout_s")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self.arm_head_timer(self._first_head_s)  # what is left of the allowance since accept

    def arm_head_timer(self, delay_s: float) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
        self._head_timer = self._loop.call_later(delay_s, self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        if not self._request_in_progress:
            self.force_close()  # no complete request head in time: a slow or idle client

    def request_finished(self, keepalive_timeout_s: float) -> None:
        # The next request on this connection gets the idle allowance plus the header allowance.
        self.arm_head_timer(keepalive_timeout_s + self._header_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def _tls_protocol_class(loop: asyncio.AbstractEventLoop) -> type:
    """The loop's own TLS protocol (uvloop's is compiled); both take asyncio's arguments."""
    try:
        import uvloop
        from uvloop.loop import SSLProtocol
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.sslproto.SSLProtocol
    return SSLProtocol if isinstance(loop, uvloop.Loop) else asyncio.sslproto.SSLProtocol


class _Accepted(asyncio.Protocol):
    """One accepted socket until it speaks HTTP: counted, and on the header clock, from accept.

    With TLS, the loop's TLS protocol takes the socket over at once, as the loop's own TLS server would
    do, but with the header deadline as its handshake timeout; when the session is up, it calls
    :meth:`connection_made` again with the TLS transport, and the socket is handed to aiohttp.
    (``loop.start_tls`` would need a task, and uvloop starts reading before that task can pause the
    socket, so the ClientHello would land here and be lost.)
    """

    def __init__(self, server: _GuardedServer) -> None:
        self._server = server
        self._raw: asyncio.Transport | None = None  # the TCP transport under a handshake
        self._deadline = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        server = self._server
        if self._raw is not None:  # the second call: the TLS session is up
            server.handshaking.discard(self)
            self._hand_over(transport)
            return
        if server.open_connections() >= server.settings.max_connections:
            server.refused()
            transport.abort()
            return
        timeout_s = server.settings.header_timeout_s
        self._deadline = server.loop_time() + timeout_s
        if server.settings.tls is None:
            self._hand_over(transport)
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_ended)
        tls = _tls_protocol_class(loop)(
            loop, self, server.settings.tls, waiter, server_side=True, ssl_handshake_timeout=timeout_s
        )
        self._raw = transport
        server.handshaking.add(self)
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_ended(self, waiter: asyncio.Future[None]) -> None:
        self._server.handshaking.discard(self)
        if not waiter.cancelled() and waiter.exception() is not None:  # retrieved: no "never retrieved"
            log.debug("TLS handshake not completed: %r", waiter.exception())

    def _hand_over(self, transport: asyncio.Transport) -> None:
        first_head_s = max(self._deadline - self._server.loop_time(), 0.0)
        handler = self._server.make_handler(first_head_s)
        transport.set_protocol(handler)
        handler.connection_made(transport)

    def abort(self) -> None:
        if self._raw is not None:
            self._raw.abort()


class _GuardedServer(Server):
    """aiohttp's server as the listener's protocol factory: each accepted socket meets ``_Accepted`` first."""

    settings: GuardSettings
    handshaking: set[_Accepted]
    _refused: int
    _refusal_logged_at: float

    def __call__(self) -> _Accepted:  # type: ignore[override]
        return _Accepted(self)

    def loop_time(self) -> float:
        return self._loop.time()

    def open_connections(self) -> int:
        return len(self.handshaking) + len(self._connections)

    def make_handler(self, first_head_s: float) -> GuardedRequestHandler:
        handler = GuardedRequestHandler(self, loop=self._loop, **self._kwargs)
        handler._header_timeout_s = self.settings.header_timeout_s
        handler._first_head_s = first_head_s
        return handler

    def refused(self) -> None:
        self._refused += 1
        now = self._loop.time()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_EVERY_S:
            log.warning(
                "connection limit (%d) reached: closed %d new connection(s)",
                self.settings.max_connections,
                self._refused,
            )
            self._refused, self._refusal_logged_at = 0, now

    def pre_shutdown(self) -> None:
        for accepted in list(self.handshaking):  # a handshake in progress has no request to drain
            accepted.abort()
        super().pre_shutdown()


class GuardedRunner(web.AppRunner):
    """An app runner whose server guards connections; serve it on a plain TCP site, TLS comes from here."""

    def __init__(self, app: web.Application, *, settings: GuardSettings, **kwargs: Any):
        super().__init__(app, **kwargs)
        self._settings = settings

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer
        assert isinstance(server, _GuardedServer)
        server.settings = self._settings
        server.handshaking = set()
        server._refused, server._refusal_logged_at = 0, float("-inf")
        return server


def head_timer_middleware(keepalive_timeout_s: float):
    @web.middleware
    async def rearm(request: web.Request, handler):
        try:
            return await handler(request)
        finally:
            protocol = request.protocol
            if isinstance(protocol, GuardedRequestHandler):
                protocol.request_finished(keepalive_timeout_s)

    return rearm
