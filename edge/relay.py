"""Forwarding one request to a region: failover before the first byte, then a chunk-by-chunk SSE relay.

Nothing here buffers a stream: each upstream event is written to the client as it arrives, and a client
that reads slowly holds back the upstream read (aiohttp's write waits for the socket to drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
import msgspec
from aiohttp import web

from edge.metrics import EdgeMetrics
from edge.upstream import Region, UpstreamPool
from nearshore.protocol import sse
from nearshore.protocol.errors import UPSTREAM_UNAVAILABLE, ApiError
from nearshore.protocol.schemas import Usage

RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass(slots=True)
class UpstreamTiming:
    forwarded_at: float = 0.0
    connect_s: float = 0.0
    first_byte_s: float = 0.0
    region_timing: str = ""

    def header(self, edge_s: float) -> str:
        parts = [
            f"edge;dur={edge_s * 1000:.2f}",
            f"upstream-connect;dur={self.connect_s * 1000:.2f}",
            f"upstream-ttfb;dur={self.first_byte_s * 1000:.1f}",
        ]
        if self.region_timing:
            parts.append(self.region_timing)
        return ", ".join(parts)


@dataclass(slots=True)
class Opened:
    region: Region
    response: aiohttp.ClientResponse
    timing: UpstreamTiming
    skipped: list[str] = field(default_factory=list)


async def open_upstream(
    pool: UpstreamPool, path: str, body: bytes, headers: dict[str, str], metrics: EdgeMetrics
) -> Opened:
    """POST to the first region that answers without a retryable error; the others are skipped."""
    skipped: list[str] = []
    for region in pool.candidates():
        timing = UpstreamTiming(forwarded_at=time.perf_counter())
        trace: dict[str, float] = {}
        try:
            response = await region.session.post(path, data=body, headers=headers, trace_request_ctx=trace)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            pool.mark_down(region)
            skipped.append(f"{region.name}: {type(exc).__name__}")
            metrics.failovers.labels(region.name).inc()
            continue
        timing.first_byte_s = time.perf_counter() - timing.forwarded_at
        timing.connect_s = trace.get("connect_s", 0.0)
        timing.region_timing = response.headers.get("Server-Timing", "")
        if response.status in RETRYABLE:
            detail = (await response.read())[:200].decode(errors="replace")
            response.release()
            if response.status >= 500 and response.status != 503:
                pool.mark_down(region)
            skipped.append(f"{region.name}: HTTP {response.status} {detail}")
            metrics.failovers.labels(region.name).inc()
            continue
        return Opened(region, response, timing, skipped)
    raise ApiError(
        UPSTREAM_UNAVAILABLE,
        "No region could take the request"
        + (f" ({'; '.join(skipped)})" if skipped else " (none configured)"),
        retry_after_s=1,
    )


class _UsageOnly(msgspec.Struct):
    usage: Usage | None = None


_usage_decoder = msgspec.json.Decoder(_UsageOnly)


def usage_of(payload: bytes) -> Usage | None:
    try:
        return _usage_decoder.decode(payload).usage
    except msgspec.DecodeError:
        return None


@dataclass(slots=True)
class StreamOutcome:
    usage: Usage | None = None
    token_events: int = 0  # content events relayed: the billable estimate if no usage arrives
    upstream_error: str = ""
    done: bool = False


class SseRelay:
    """Copies one upstream SSE stream to the client, event by event.

    The edge always asks the region for a usage chunk; it is dropped here unless the client asked too.
    ``[DONE]`` is held back: the caller writes it after the usage record is committed.
    """

    def __init__(self, client: web.StreamResponse, keep_usage_chunk: bool, write_timeout_s: float) -> None:
        self.client = client
        self.keep_usage_chunk = keep_usage_chunk
        self.write_timeout_s = write_timeout_s
        self.last_write = time.monotonic()
        self.first_write_at = 0.0
        # Updated as events pass, so a stream cut short still knows what it relayed.
        self.outcome = StreamOutcome()

    async def write(self, data: bytes) -> None:
        async with asyncio.timeout(self.write_timeout_s):  # a client that stops reading is cut off
            await self.client.write(data)
        self.last_write = time.monotonic()
        if not self.first_write_at:
            self.first_write_at = time.perf_counter()

    async def relay(self, upstream: aiohttp.ClientResponse) -> StreamOutcome:
        outcome = self.outcome
        content = upstream.content
        try:
            while True:
                event = await content.readuntil(b"\n\n")
                if not event:
                    break  # upstream closed
                if not event.endswith(b"\n\n"):
                    outcome.upstream_error = "the region closed the stream mid-event"
                    break
                if event.startswith(b"data: [DONE]"):
                    outcome.done = True
                    # Read to the end of the response (the chunked terminator), or aiohttp closes the
                    # connection instead of pooling it, and the next request pays new handshakes.
                    await content.read()
                    break
                if event.startswith(b'data: {"error"'):
                    outcome.upstream_error = event[6:].strip().decode(errors="replace")
                    await self.write(event)
                    continue
                if b'"usage":{' in event and b'"choices":[]' in event:
                    outcome.usage = usage_of(event[6:])
                    if not self.keep_usage_chunk:
                        continue
                elif b'"finish_reason":null' in event and b'"role":"assistant"' not in event:
                    outcome.token_events += 1
                await self.write(event)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.IncompleteReadError,
        ) as exc:
            outcome.upstream_error = f"the region's stream broke: {type(exc).__name__}"
        return outcome


class Heartbeat:
    """Sends an SSE comment when nothing has gone to the client for ``interval_s``; the first one
    commits the response (status 200 and headers) if the region has not answered yet."""

    def __init__(self, relay: SseRelay, interval_s: float, commit: callable) -> None:
        self.relay = relay
        self.interval_s = interval_s
        self.commit = commit
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            while True:
                idle = time.monotonic() - self.relay.last_write
                if idle < self.interval_s:
                    await asyncio.sleep(self.interval_s - idle)
                    continue
                await self.commit()
                await self.relay.client.write(sse.comment("keep-alive"))
                self.relay.last_write = time.monotonic()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
