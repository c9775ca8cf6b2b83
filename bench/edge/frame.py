"""The edge's frame without its stages: what the edge would spend per request if it did nothing but relay.

``bench edge --floor`` runs it beside the edge, nginx and the bare byte relay (floor.py). It is the edge's
own serving parts and nothing else: aiohttp's server on uvloop, the edge's keep-alive pool to the region
(edge/h1_pool.py) and its SSE relay (edge/sse_relay.py, every event checked as the edge checks it). No
keys, limits, ledger, routing, cache, timeouts or metrics. So the edge minus the frame is what the stages
and the journey around them cost, and the frame minus the floor is what aiohttp, the pool and the relay's
checks cost.

    python -m bench.edge.frame --port 8080 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from aiohttp import web

from bench.edge.floor import run
from edge.h1_pool import H1Pool
from edge.sse_relay import SseRelay, StreamLimits
from nearshore.protocol import sse

POOL = web.AppKey("pool", H1Pool)
# The relay's bounds, as generous as the edge's defaults would be for the bench's short answers.
LIMITS = StreamLimits(max_event_bytes=1 << 20, max_stream_bytes=1 << 30, max_content_events=1 << 20)
HEAD_TIMEOUT_S = 30.0


async def proxy(request: web.Request) -> web.StreamResponse:
    """The request as it came to the region's same path; a stream relayed event by event, else the body."""
    body = await request.read()
    headers = {"Content-Type": "application/json"}
    upstream = await request.app[POOL].request("POST", request.path, headers, body, HEAD_TIMEOUT_S)
    if upstream.content_type != "text/event-stream":
        parts = []
        while chunk := await upstream.read():
            parts.append(chunk)
        return web.Response(body=b"".join(parts), status=upstream.status, content_type=upstream.content_type)
    client = web.StreamResponse(headers=sse.HEADERS)
    await client.prepare(request)
    relay = SseRelay(request, client, LIMITS)
    await relay.relay(upstream)
    await relay.write(sse.DONE, last=True)
    return client


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def region_pool(upstream_url: str) -> H1Pool:
    """The edge's keep-alive pool to the region, sized for the bench's concurrency."""
    parts = urlsplit(upstream_url)
    return H1Pool(
        parts.hostname or "127.0.0.1",
        parts.port or 80,
        None,
        max_idle=256,
        keepalive_s=60.0,
        connect_timeout_s=5.0,
    )


async def served_until_stopped(pool: H1Pool, runner: web.AppRunner) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        pool.close()
        await runner.cleanup()


async def serve(port: int, upstream_url: str) -> None:
    pool = region_pool(upstream_url)
    app = web.Application()
    app[POOL] = pool
    app.router.add_post("/v1/chat/completions", proxy)
    app.router.add_post("/v1/completions", proxy)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await served_until_stopped(pool, runner)


def main(argv: list[str] | None = None) -> None:
    run("python -m bench.edge.frame", __doc__.split("\n\n")[0], serve, argv)


if __name__ == "__main__":
    main()
