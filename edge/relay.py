"""Forwarding one request to a region: failover before the first byte, then a chunk-by-chunk SSE relay.

Nothing here buffers a stream: each upstream event is written to the client as it arrives, and a client
that reads slowly holds back the upstream read (aiohttp's write waits for the socket to drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import msgspec
from aiohttp import web

from edge.metrics import EdgeMetrics
from edge.upstream import Region, UpstreamPool, connect_seconds
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
        connect_seconds.set(0.0)
        try:
            response = await region.session.post(path, data=body, headers=headers)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            pool.mark_down(region)
            skipped.append(f"{region.name}: {type(exc).__name__}")
            metrics.failovers.labels(region.name).inc()
            continue
        timing.first_byte_s = time.perf_counter() - timing.forwarded_at
        timing.connect_s = connect_seconds.get()
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
    """Copies one upstream SSE stream to the client as it arrives: whatever whole events one read brings
    go out in one write (so nothing waits for a later event, and nothing is split).

    The edge always asks the region for a usage chunk; it is dropped here unless the client asked too.
    ``[DONE]`` is held back: the caller writes it after the usage record is committed.
    """

    def __init__(self, client: web.StreamResponse, keep_usage_chunk: bool) -> None:
        self.client = client
        self.keep_usage_chunk = keep_usage_chunk
        self.last_write = time.monotonic()
        self.write_started = 0.0  # set while a write waits for the client to take it
        self.first_write_at = 0.0
        # Updated as events pass, so a stream cut short still knows what it relayed.
        self.outcome = StreamOutcome()

    async def write(self, data: bytes, *, content: bool = True) -> None:
        self.write_started = time.monotonic()
        await self.client.write(data)
        self.last_write = time.monotonic()
        self.write_started = 0.0
        if content and not self.first_write_at:
            self.first_write_at = time.perf_counter()

    async def relay(self, upstream: aiohttp.ClientResponse) -> StreamOutcome:
        outcome = self.outcome
        content = upstream.content
        pending = b""
        try:
            while not outcome.done:
                data = await content.readany()
                if not data:
                    if pending.strip():
                        outcome.upstream_error = "the region closed the stream mid-event"
                    break  # upstream closed
                pending += data
                if b"\n\n" not in pending:
                    continue
                *events, pending = pending.split(b"\n\n")
                forward = [e for e in events if self._keep(e)]
                if forward:
                    await self.write(b"\n\n".join(forward) + b"\n\n")
            if outcome.done:
                # Read to the end of the response (the chunked terminator), or aiohttp closes the
                # connection instead of pooling it, and the next request pays new handshakes.
                await content.read()
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.IncompleteReadError,
        ) as exc:
            outcome.upstream_error = f"the region's stream broke: {type(exc).__name__}"
        return outcome

    def _keep(self, event: bytes) -> bool:
        """Note what the event says; whether it goes to the client."""
        outcome = self.outcome
        if outcome.done or not event:
            return False
        if event.startswith(b"data: [DONE]"):
            outcome.done = True
            return False
        if event.startswith(b'data: {"error"'):
            outcome.upstream_error = event[6:].strip().decode(errors="replace")
            return True
        if b'"usage":{' in event and b'"choices":[]' in event:
            outcome.usage = usage_of(event[6:])
            return self.keep_usage_chunk
        if b'"finish_reason":null' in event and b'"role":"assistant"' not in event:
            outcome.token_events += 1
        return True


class StreamWatchdog:
    """One timer per stream, instead of a task and a timeout per write.

    When nothing has gone to the client for ``heartbeat_s``, it sends an SSE comment (the first one
    commits the response if the region has not answered yet), so idle hops stay open during a long
    prefill. When a write has waited for the client longer than ``write_timeout_s``, it cuts the client
    off: the handler then ends, which cancels the upstream request.
    """

    def __init__(
        self,
        relay: SseRelay,
        heartbeat_s: float,
        write_timeout_s: float,
        commit: Callable[[], Awaitable[None]],
        cut_off: Callable[[], None],
    ) -> None:
        self.relay = relay
        self.heartbeat_s = heartbeat_s
        self.write_timeout_s = write_timeout_s
        self.commit = commit
        self.cut_off = cut_off
        self.tick_s = min(heartbeat_s, write_timeout_s) / 2
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._beat: asyncio.Task | None = None

    def start(self) -> None:
        self._timer = self._loop.call_later(self.tick_s, self._check)

    def _check(self) -> None:
        now = time.monotonic()
        relay = self.relay
        if relay.write_started and now - relay.write_started >= self.write_timeout_s:
            self._timer = None
            self.cut_off()
            return
        idle = not relay.write_started and now - relay.last_write >= self.heartbeat_s
        if idle and (self._beat is None or self._beat.done()):
            self._beat = self._loop.create_task(self._heartbeat())
        self._timer = self._loop.call_later(self.tick_s, self._check)

    async def _heartbeat(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.commit()
            await self.relay.write(sse.comment("keep-alive"), content=False)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._beat is not None and not self._beat.done():
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
