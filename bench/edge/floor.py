"""The least a Python proxy on uvloop can spend: a byte relay with no checks, the floor under the edge.

``bench edge --floor`` runs it beside the edge and nginx: HTTP/1.1 keep-alive on both sides, each request
copied to a warm connection to the upstream as it came, each piece of the answer copied to the client as
it arrives, nothing parsed but the framing needed to know where a message ends. No keys, limits, ledger,
routing, timeouts or SSE checks: what it spends per stream is the runtime's cost (the event loop, its
callbacks, the syscalls), which no work inside the edge can go below.

    python -m bench.edge.floor --port 8080 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

HEAD_END = b"\r\n\r\n"
CHUNKED_END = b"0\r\n\r\n"


def _length(head: bytes) -> int | None:
    """Content-Length, or None for a chunked body (the only two framings this relay meets)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            return int(value)
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return None
    return 0


class _Upstream(asyncio.Protocol):
    """One kept-alive connection to the upstream; copies each answer to the client that asked."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None
        self._head = b""
        self._left: int | None = -1  # body bytes still due; None: chunked; -1: the head is not in
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None or client.transport is None:
            return
        client.transport.write(data)
        if self._left == -1:
            self._head += data
            end = self._head.find(HEAD_END)
            if end < 0:
                return
            self._left = _length(self._head[:end])
            data = self._head[end + 4 :]
            self._head = b""
        if self._left is None:  # the last chunk ends it (the pacer never sends data that ends so)
            self._tail = (self._tail + data)[-len(CHUNKED_END) - 2 :]
            done = self._tail.endswith(CHUNKED_END)
        else:
            self._left -= len(data)
            done = self._left <= 0
        if done:
            self._left, self._tail, self.client = -1, b"", None
            self.relay.idle.append(self)
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.relay.idle:
            self.relay.idle.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()


class _Client(asyncio.Protocol):
    """One client connection: its requests, one at a time, each sent upstream when whole."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self._buffer = b""
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._next()

    def _next(self) -> None:
        if self._busy:
            return
        end = self._buffer.find(HEAD_END)
        if end < 0:
            return
        whole = end + 4 + (_length(self._buffer[:end]) or 0)
        if len(self._buffer) < whole:
            return
        request, self._buffer = self._buffer[:whole], self._buffer[whole:]
        self._busy = True
        if self.relay.idle:
            self._send(self.relay.idle.pop(), request)
        else:
            asyncio.get_running_loop().create_task(self._connect_and_send(request))

    async def _connect_and_send(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: _Upstream(self.relay), *self.relay.target)
        self._send(upstream, request)

    def _send(self, upstream: _Upstream, request: bytes) -> None:
        upstream.client = self
        assert upstream.transport is not None
        upstream.transport.write(request)

    def answered(self) -> None:
        self._busy = False
        self._next()


class Relay:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.idle: list[_Upstream] = []


async def serve(port: int, upstream_url: str) -> None:
    relay = Relay(upstream_url)
    server = await asyncio.get_running_loop().create_server(lambda: _Client(relay), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def run(
    prog: str, description: str, serve: Callable[[int, str], Awaitable[None]], argv: list[str] | None
) -> None:
    """The command line of a relay the bench runs beside the edge: --port, --upstream; served on uvloop."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL (http://host:port)")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.port, args.upstream))


def main(argv: list[str] | None = None) -> None:
    run("python -m bench.edge.floor", __doc__.split("\n\n")[0], serve, argv)


if __name__ == "__main__":
    main()
