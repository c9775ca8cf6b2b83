"""Warm, pooled connections from the edge to each region, and the regions' health.

A user's request should cross the ocean once: the TCP and TLS handshakes to every region are done before
it arrives, and kept alive by periodic health checks that also mark regions up or down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from edge.answer import UpstreamFault, read_bounded
from edge.config import RegionEndpoint, UpstreamConfig
from edge.h1 import H1Pool, MalformedResponse
from nearshore.protocol.headers import EDGE_SECRET
from nearshore.tls import client_context

log = logging.getLogger("nearshore.edge.upstream")
_HEALTH_BYTES = 64 * 1024
_HEALTH_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Region:
    name: str
    url: str
    pool: H1Pool
    up: bool = True
    last_check: float = 0.0


# What a request to a region can fail with before it is answered.
UPSTREAM_ERRORS = (OSError, MalformedResponse, ssl.SSLError)


class UpstreamPool:
    def __init__(self, regions: Sequence[RegionEndpoint], config: UpstreamConfig) -> None:
        self.config = config
        self._endpoints = list(regions)
        self.regions: list[Region] = []
        self._health_task: asyncio.Task | None = None
        self.headers: dict[str, str] = {}
        if config.shared_secret:
            self.headers[EDGE_SECRET] = config.shared_secret

    def _ssl(self, scheme: str) -> ssl.SSLContext | None:
        if scheme != "https":
            return None
        c = self.config
        return client_context(ca=c.ca or None, cert=c.client_cert or None, key=c.client_key or None)

    async def start(self) -> None:
        for endpoint in self._endpoints:
            url = urlsplit(endpoint.url)
            pool = H1Pool(
                url.hostname or "127.0.0.1",
                url.port or (443 if url.scheme == "https" else 80),
                self._ssl(url.scheme),
                max_idle=self.config.pool_size,
                keepalive_s=max(60.0, 3 * self.config.health_interval_s),
                connect_timeout_s=self.config.connect_timeout_s,
            )
            self.regions.append(Region(endpoint.name, endpoint.url, pool))
        await self.warm()
        self._health_task = asyncio.create_task(self._health_loop())

    async def warm(self) -> None:
        """Open ``warm_connections`` connections to every region at once (each one a health check)."""
        n = self.config.warm_connections
        await asyncio.gather(*(self._check(r) for r in self.regions for _ in range(max(1, n))))

    async def _check(self, region: Region) -> None:
        try:
            async with asyncio.timeout(_HEALTH_TIMEOUT_S):
                response = await region.pool.request("GET", "/health", self.headers)
                try:
                    ok = response.status == 200
                    await read_bounded(response, _HEALTH_BYTES, _HEALTH_TIMEOUT_S)  # pooled again when read
                finally:
                    response.close()
        except (TimeoutError, UpstreamFault, *UPSTREAM_ERRORS):
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
        for region in self.regions:
            region.pool.close()
