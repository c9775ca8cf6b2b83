"""Connection hygiene for the edge: a deadline for request headers, and a cap on open connections.

aiohttp closes connections that send nothing, but stops timing once the first byte arrives, so a client
trickling header bytes could hold a connection forever. Here every connection must finish a request's
head within ``header_timeout_s`` of connecting (or of its previous response), else it is closed.
These hook aiohttp's request handler class, so ``aiohttp`` is pinned below 4 in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

log = logging.getLogger("nearshore.edge.guard")


class GuardedRequestHandler(RequestHandler):
    __slots__ = ("_head_timer", "_header_timeout_s", "_max_connections")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self._manager is not None
        if len(self._manager.connections) > self._max_connections:
            log.warning("connection limit (%d) reached: closing a new connection", self._max_connections)
            self.force_close()
            return
        self._head_timer: asyncio.TimerHandle | None = None
        self.arm_head_timer(self._header_timeout_s)

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


class _GuardedServer(Server):
    def __call__(self) -> RequestHandler:
        handler = GuardedRequestHandler(self, loop=self._loop, **self._kwargs)
        handler._header_timeout_s = self._header_timeout_s  # type: ignore[attr-defined]
        handler._max_connections = self._max_connections  # type: ignore[attr-defined]
        return handler


class GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, *, header_timeout_s: float, max_connections: int, **kwargs: Any):
        super().__init__(app, **kwargs)
        self._guard = (header_timeout_s, max_connections)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer
        server._header_timeout_s, server._max_connections = self._guard  # type: ignore[attr-defined]
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
