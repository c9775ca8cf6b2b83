"""The edge's keep-alive connection pool to one region origin (the client's connections and parser are
edge/h1.py): idle connections reused, new ones opened on demand, and spares opened in the background where
the edge dropped a healthy one."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

from edge.h1 import H1Connection, Response

log = logging.getLogger("nearshore.edge.h1")


def _time_out(waiter: asyncio.Future[Response], seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no response head within {seconds:g}s"))


class H1Pool:
    """Keep-alive connections to one origin (``http://host:port`` or ``https://``, mTLS by the context)."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        *,
        max_idle: int,
        keepalive_s: float,
        connect_timeout_s: float,
        keep_warm: int = 0,
    ) -> None:
        """``keep_warm``: a connection the edge drops while the region is fine (its request abandoned: the
        client left, a cache hit won the race) is replaced in the background while fewer than this many
        are idle, so the next request does not pay the handshakes (one to three round trips to a region
        across an ocean)."""
        self.host, self.port, self.ssl = host, port, ssl_context
        self.max_idle = max_idle
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.keep_warm = keep_warm
        self._idle: list[H1Connection] = []
        self._all: set[H1Connection] = set()
        self._refills: set[asyncio.Task[None]] = set()
        self._closed = False
        self.host_header = host if port in (80, 443) else f"{host}:{port}"

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes = b"",
        head_timeout_s: float | None = None,
    ) -> Response:
        """Send one request; return once the response head has arrived (the body follows). With
        ``head_timeout_s``, a head that takes longer raises TimeoutError (one timer, no task cancellation)."""
        started = time.perf_counter()
        connection, connect_s = await self._acquire()
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        waiter = connection.send(head, body)
        timer = None
        if head_timeout_s is not None:
            left = max(0.0, head_timeout_s - (time.perf_counter() - started))
            timer = asyncio.get_running_loop().call_later(left, _time_out, waiter, head_timeout_s)
        try:
            response = await waiter
        except asyncio.CancelledError:
            connection.close()  # a response may still come; this connection cannot serve another
            self.refill()  # the caller gave up, not the region
            raise
        except BaseException:
            connection.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        response.connect_s = connect_s
        return response

    async def _acquire(self) -> tuple[H1Connection, float]:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.closed or now - connection.idle_since > self.keepalive_s:
                connection.close()
                continue
            return connection, 0.0
        started = time.perf_counter()
        connection = await self._connect()
        return connection, time.perf_counter() - started

    async def _connect(self) -> H1Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            transport, connection = await loop.create_connection(
                lambda: H1Connection(self),
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.ssl else None,
            )
        # uvloop calls connection_made on the next turn of the loop: the transport is ours already.
        connection.transport = connection.transport or transport  # type: ignore[assignment]
        self._all.add(connection)
        return connection

    def refill(self) -> None:
        """Open connections in the background to stand idle until ``keep_warm`` do (those being opened
        count). An idle one past ``keepalive_s`` is closed first: the next request would not take it."""
        now = time.monotonic()
        for connection in [c for c in self._idle if now - c.idle_since > self.keepalive_s]:
            connection.close()  # (which takes it out of the pool)
        while not self._closed and len(self._idle) + len(self._refills) < self.keep_warm:
            try:
                task = asyncio.get_running_loop().create_task(self._open_idle())
            except RuntimeError:  # no loop (the pool is being torn down): nothing to keep warm
                return
            self._refills.add(task)
            task.add_done_callback(self._refills.discard)

    async def _open_idle(self) -> None:
        try:
            connection = await self._connect()
        except (OSError, TimeoutError) as exc:  # (ssl.SSLError is an OSError) the probes will tell
            log.debug("could not open a spare connection to %s:%s: %s", self.host, self.port, exc)
            return
        if self._closed:
            connection.close()
        else:
            self.put_back(connection)

    def put_back(self, connection: H1Connection) -> None:
        if connection.closed or len(self._idle) >= self.max_idle:
            connection.close()
        else:
            self._idle.append(connection)

    def forget(self, connection: H1Connection) -> None:
        self._all.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        for connection in list(self._all):
            connection.close()
        self._idle.clear()
