"""Warm, pooled connections from the edge to each region, and the regions' health.

A user's request should cross the ocean once: the TCP and TLS handshakes to every region are done before
it arrives, and kept alive by periodic health checks that also mark regions up or down.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from edge.config import RegionEndpoint, UpstreamConfig
from nearshore.protocol.headers import EDGE_SECRET
from nearshore.tls import client_context

log = logging.getLogger("nearshore.edge.upstream")


@dataclass(eq=False)
class Region:
    name: str
    url: str
    session: aiohttp.ClientSession
    up: bool = True
    last_check: float = 0.0


class UpstreamPool:
    def __init__(self, regions: Sequence[RegionEndpoint], config: UpstreamConfig) -> None:
        self.config = config
        self._endpoints = list(regions)
        self.regions: list[Region] = []
        self._health_task: asyncio.Task | None = None
        self.headers: dict[str, str] = {}
        if config.shared_secret:
            self.headers[EDGE_SECRET] = config.shared_secret

    def _ssl(self, url: str) -> ssl.SSLContext | bool:
        if not url.startswith("https://"):
            return False
        c = self.config
        return client_context(ca=c.ca or None, cert=c.client_cert or None, key=c.client_key or None)

    async def start(self) -> None:
        for endpoint in self._endpoints:
            connector = TimedConnector(
                limit=self.config.pool_size,
                keepalive_timeout=max(60.0, 3 * self.config.health_interval_s),
                ssl=self._ssl(endpoint.url),
            )
            session = aiohttp.ClientSession(
                base_url=endpoint.url,
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
            self.regions.append(Region(endpoint.name, endpoint.url, session))
        await self.warm()
        self._health_task = asyncio.create_task(self._health_loop())

    async def warm(self) -> None:
        """Open ``warm_connections`` connections to every region at once (each one a health check)."""
        n = self.config.warm_connections
        await asyncio.gather(*(self._check(r) for r in self.regions for _ in range(max(1, n))))

    async def _check(self, region: Region) -> None:
        try:
            async with region.session.get(
                "/health", headers=self.headers, timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                ok = r.status == 200 and await _read_small(r)
        except (TimeoutError, aiohttp.ClientError, OSError):
            ok = False
        if ok != region.up:
            log.warning("region %s is %s", region.name, "up" if ok else "DOWN")
        region.up = ok
        region.last_check = time.monotonic()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await asyncio.gather(*(self._check(r) for r in self.regions))

    async def replenish(self, region: Region) -> None:
        """Open a connection to replace one that a cut-short stream took down with it, so the next
        user does not pay the handshakes (a health check leaves its connection in the pool)."""
        await self._check(region)

    def candidates(self) -> list[Region]:
        """Regions in configured order, those marked down last (they may have recovered since)."""
        return sorted(self.regions, key=lambda r: not r.up)

    def mark_down(self, region: Region) -> None:
        if region.up:
            log.warning("region %s failed a request; marked down until its next health check", region.name)
        region.up = False

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await asyncio.gather(*(r.session.close() for r in self.regions))


_HEALTH_BYTES = 64 * 1024


async def _read_small(response: aiohttp.ClientResponse) -> bool:
    """Read a health answer to its end (so its connection is pooled), unless it is far too large."""
    size = 0
    while data := await response.content.readany():
        size += len(data)
        if size > _HEALTH_BYTES:
            response.close()
            return False
    return True


# Seconds the current request spent opening a new upstream connection (0 when a pooled one was used).
# Set inside the connector, read by the caller of session.post: both run in the request's own context.
connect_seconds: contextvars.ContextVar[float] = contextvars.ContextVar("connect_seconds", default=0.0)


class TimedConnector(aiohttp.TCPConnector):
    """Times new connections for the Server-Timing header (a trace config would cost every request)."""

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await super()._create_connection(*args, **kwargs)
        finally:
            connect_seconds.set(time.perf_counter() - started)
