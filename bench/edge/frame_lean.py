"""The edge's frame on the lean HTTP/1.1 server core (edge/h1_server.py): what the frame would spend per
request with aiohttp's server out of the hot path.

``bench edge --floor`` runs it beside the frame on aiohttp (frame.py), the bare byte relay (floor.py) and
nginx. The same pool to the region and the same SSE relay as frame.py, every event checked; only the server
side of the client's connection differs: the lean core reads the request and writes the answer itself, and
hands anything else (here /health) to aiohttp on the same connection. So the frame minus this is what
aiohttp's server costs, and this minus the floor what the pool and the relay's checks cost.

    python -m bench.edge.frame_lean --port 8080 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from bench.edge.floor import run
from bench.edge.frame import HEAD_TIMEOUT_S, LIMITS, health, region_pool, served_until_stopped
from edge.h1_pool import H1Pool
from edge.h1_server import Exchange, H1Server, Handler, Limits
from edge.sse_relay import SseRelay
from nearshore.protocol import sse

HOT_PATHS = frozenset(("/v1/chat/completions", "/v1/completions"))


class _StreamSink:
    """What the SSE relay asks of a streamed answer (aiohttp's StreamResponse's head, write and end), on an
    exchange whose head is already sent."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.prepared = True
        self.headers = {"Transfer-Encoding": "chunked" if exchange.chunked else "identity"}

    async def write(self, data: bytes) -> None:
        self.exchange.write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self.exchange.end(data)


def proxy_for(pool: H1Pool) -> Handler:
    async def proxy(exchange: Exchange) -> None:
        """The request to the region's same path; a stream relayed event by event, else the body."""
        headers = {"Content-Type": "application/json"}
        upstream = await pool.request("POST", exchange.path, headers, exchange.body, HEAD_TIMEOUT_S)
        if upstream.content_type != "text/event-stream":
            parts = []
            while chunk := await upstream.read():
                parts.append(chunk)
            exchange.reply(upstream.status, {"Content-Type": upstream.content_type}, b"".join(parts))
            return
        exchange.start(200, sse.HEADERS)
        sink = _StreamSink(exchange)
        relay = SseRelay(exchange, sink, LIMITS)  # type: ignore[arg-type]  # the two parts it reads
        await relay.relay(upstream)
        await relay.write(sse.DONE, last=True)

    return proxy


async def serve(port: int, upstream_url: str) -> None:
    pool = region_pool(upstream_url)
    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    proxy = proxy_for(pool)

    def route(method: str, path: str) -> Handler | None:
        return proxy if method == "POST" and path in HOT_PATHS else None

    limits = Limits()
    fallback = runner.server
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: H1Server(route, fallback, limits), "127.0.0.1", port)
    async with server:
        await served_until_stopped(pool, runner)


def main(argv: list[str] | None = None) -> None:
    run("python -m bench.edge.frame_lean", __doc__.split("\n\n")[0], serve, argv)


if __name__ == "__main__":
    main()
