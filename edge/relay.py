"""Forwarding one request to a region: failover before the first byte, then a checked SSE relay.

Nothing here buffers a stream: each upstream event is written to the client as it arrives, and a client
that reads slowly holds back the upstream read (aiohttp's write waits for the socket to drain). Nothing
here trusts the region either: its headers must come within ``first_byte_timeout_s``; one event may be at
most ``max_event_bytes``, the whole stream at most its byte budget, and it may carry at most ``max_tokens``
content events; every event must be a completion chunk; a stream silent for ``idle_timeout_s`` is cut off.
A region that breaks a rule is stopped there and the client is told with a typed error event.
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

from edge.answer import NO_USAGE, UpstreamFault, passed_on, usage_bytes
from edge.metrics import EdgeMetrics
from edge.upstream import Region, UpstreamPool, connect_seconds
from nearshore.protocol import sse
from nearshore.protocol.errors import UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE, ApiError, ErrorBody

RETRYABLE = frozenset({429, 500, 502, 503, 504})
# After [DONE], the rest of the response (the chunked terminator) is read so the connection is pooled;
# a region that keeps sending or stalls there loses the connection instead of holding the user's [DONE].
_TAIL_BYTES = 64 * 1024
_TAIL_S = 1.0
_PEEK_BYTES = 4096
_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError)


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
    pool: UpstreamPool,
    path: str,
    body: bytes,
    headers: dict[str, str],
    metrics: EdgeMetrics,
    first_byte_timeout_s: float,
) -> Opened:
    """POST to the first region that answers in time without a retryable error; the others are skipped."""
    skipped: list[str] = []
    timed_out = malformed = 0
    for region in pool.candidates():
        timing = UpstreamTiming(forwarded_at=time.perf_counter())
        connect_seconds.set(0.0)
        try:
            async with asyncio.timeout(first_byte_timeout_s):
                response = await region.session.post(path, data=body, headers=headers)
        except TimeoutError:
            timed_out += 1
            _skip(pool, region, metrics, skipped, f"no answer within {first_byte_timeout_s:g}s")
            continue
        except aiohttp.ClientResponseError as exc:  # it answered, but not in HTTP
            malformed += 1
            _skip(pool, region, metrics, skipped, f"a malformed response ({exc.message[:80]!r})")
            continue
        except (aiohttp.ClientError, OSError) as exc:
            _skip(pool, region, metrics, skipped, type(exc).__name__)
            continue
        timing.first_byte_s = time.perf_counter() - timing.forwarded_at
        timing.connect_s = connect_seconds.get()
        timing.region_timing = response.headers.get("Server-Timing", "")[:512]
        if response.status in RETRYABLE:
            detail = await _peek(response)
            if response.status >= 500 and response.status != 503:
                pool.mark_down(region)
            skipped.append(f"{region.name}: HTTP {response.status} {detail}")
            metrics.failovers.labels(region.name).inc()
            continue
        return Opened(region, response, timing, skipped)
    where = f" ({'; '.join(skipped)})" if skipped else " (none configured)"
    if skipped and timed_out == len(skipped):
        raise ApiError(UPSTREAM_TIMEOUT, "No region answered in time" + where, retry_after_s=1)
    if skipped and malformed == len(skipped):
        raise UpstreamFault.bad("No region answered in HTTP" + where).error
    raise ApiError(UPSTREAM_UNAVAILABLE, "No region could take the request" + where, retry_after_s=1)


def _skip(pool: UpstreamPool, region: Region, metrics: EdgeMetrics, skipped: list[str], why: str) -> None:
    pool.mark_down(region)
    skipped.append(f"{region.name}: {why}")
    metrics.failovers.labels(region.name).inc()


async def _peek(response: aiohttp.ClientResponse) -> str:
    """The start of a refusal's body, for the log and the 503 message; a long or slow rest is not read."""
    data = b""
    try:
        async with asyncio.timeout(1.0):
            while len(data) <= _PEEK_BYTES and (more := await response.content.readany()):
                data += more
    except (TimeoutError, aiohttp.ClientError, asyncio.IncompleteReadError):
        pass
    if response.content.at_eof():
        response.release()  # read whole: the connection goes back to the pool
    else:
        response.close()
    return data[:200].decode(errors="replace")


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_event_bytes: int
    max_stream_bytes: int
    max_content_events: int


@dataclass(slots=True)
class StreamOutcome:
    usage: bytes | None = None  # the region's usage JSON, to audit
    usage_event: bytes | None = None  # the usage chunk's JSON, for a client that asked for it
    content_events: int = 0
    failure: ApiError | None = None  # what the client is told at the end (the region's error, or the edge's)
    fault: bool = False  # the edge stopped the stream because the region broke a rule
    done: bool = False


class UpstreamIdle(Exception):
    pass


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: msgspec.Raw = NO_USAGE
    error: ErrorBody | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)


class SseRelay:
    """Copies one upstream SSE stream to the client as it arrives: whatever whole events one read brings
    go out in one write (so nothing waits for a later event, and nothing is split).

    The edge always asks the region for a usage chunk; it is held back here (the caller sends the checked
    figure to a client that asked). Upstream comments are dropped (the edge sends its own heartbeats),
    ``[DONE]`` is held back too: the caller writes it after the usage record is committed.
    """

    def __init__(self, client: web.StreamResponse, limits: StreamLimits, echo: bool = False) -> None:
        self.client = client
        self.limits = limits
        self.last_write = time.monotonic()
        self.write_started = 0.0  # set while a write waits for the client to take it
        self.read_started = 0.0  # set while a read waits for the region
        self.first_write_at = 0.0
        self._echo_pending = echo  # /v1/completions with echo: the first text event is the prompt
        self._upstream: aiohttp.ClientResponse | None = None
        # Updated as events pass, so a stream cut short still knows what it relayed.
        self.outcome = StreamOutcome()

    async def write(self, data: bytes, *, content: bool = True) -> None:
        self.write_started = time.monotonic()
        await self.client.write(data)
        self.last_write = time.monotonic()
        self.write_started = 0.0
        if content and not self.first_write_at:
            self.first_write_at = time.perf_counter()

    def stall(self, idle_s: float) -> None:
        """Called by the watchdog: the region sent nothing for ``idle_s``; end the read with that error."""
        if self._upstream is not None and self.read_started:
            self._upstream.content.set_exception(UpstreamIdle(f"no byte from the region for {idle_s:g}s"))

    async def relay(self, upstream: aiohttp.ClientResponse) -> StreamOutcome:
        outcome, limits = self.outcome, self.limits
        content = upstream.content
        self._upstream = upstream
        pending = b""
        total = 0
        try:
            while not (outcome.done or outcome.fault):
                self.read_started = time.monotonic()
                data = await content.readany()
                self.read_started = 0.0
                if not data:
                    if not outcome.failure:
                        outcome.failure = ApiError(
                            UPSTREAM_UNAVAILABLE, "The region failed mid-stream: it closed the stream early."
                        )
                    break
                total += len(data)
                if total > limits.max_stream_bytes:
                    self._fault(f"the region's stream passed {limits.max_stream_bytes} bytes")
                    break
                pending += data
                if b"\n\n" in pending:
                    *events, pending = pending.split(b"\n\n")
                    forward = [e for e in events if self._keep(e)]
                    if forward:
                        await self.write(b"\n\n".join(forward) + b"\n\n")
                if len(pending) > limits.max_event_bytes:
                    self._fault(f"the region sent an event larger than {limits.max_event_bytes} bytes")
            if outcome.done:
                await _read_tail(upstream)
        except UpstreamIdle as exc:
            outcome.fault = True
            outcome.failure = ApiError(UPSTREAM_TIMEOUT, f"The region stalled mid-stream: {exc}.")
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.IncompleteReadError,
        ) as exc:
            outcome.failure = ApiError(
                UPSTREAM_UNAVAILABLE,
                f"The region failed mid-stream: its stream broke ({type(exc).__name__}).",
            )
        finally:
            self.read_started = 0.0
            self._upstream = None
        return outcome

    def _fault(self, message: str) -> None:
        self.outcome.fault = True
        self.outcome.failure = UpstreamFault.bad(f"The region's stream was stopped: {message}.").error

    def _keep(self, event: bytes) -> bool:
        """Check the event and note what it says; whether it goes to the client now."""
        outcome = self.outcome
        if not event or outcome.done or outcome.fault:
            return False
        if event.startswith(b":"):
            return False
        if not event.startswith(b"data:") or b"\n" in event:
            self._fault("an event that is not one data line")
            return False
        payload = event[5:].strip()
        if payload == b"[DONE]":
            outcome.done = True
            return False
        try:
            chunk = _chunk_decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            self._fault("an event that is not a completion chunk")
            return False
        if chunk.error is not None:
            outcome.failure = passed_on(chunk.error, 502)
            return False
        if (usage := usage_bytes(chunk.usage)) is not None:
            outcome.usage = usage
            if not chunk.choices:
                outcome.usage_event = payload
                return False
        if not chunk.choices:
            self._fault("a chunk with neither choices nor usage")
            return False
        if any((c.delta is not None and c.delta.content) or c.text for c in chunk.choices):
            if self._echo_pending:
                self._echo_pending = False
            elif outcome.content_events >= self.limits.max_content_events:
                self._fault(f"more than max_tokens ({self.limits.max_content_events}) tokens")
                return False
            else:
                outcome.content_events += 1
        return True


async def _read_tail(upstream: aiohttp.ClientResponse) -> None:
    read = 0
    try:
        async with asyncio.timeout(_TAIL_S):
            while data := await upstream.content.readany():
                read += len(data)
                if read > _TAIL_BYTES:
                    break
    except (TimeoutError, aiohttp.ClientError, asyncio.IncompleteReadError):
        pass
    if not upstream.content.at_eof():
        upstream.close()  # not worth pooling


class StreamWatchdog:
    """One timer per stream, instead of a task and a timeout per write or read.

    When nothing has gone to the client for ``heartbeat_s``, it sends an SSE comment (the first one
    commits the response if the region has not answered yet), so idle hops stay open during a long
    prefill. When a write has waited for the client longer than ``write_timeout_s``, it cuts the client
    off: the handler then ends, which cancels the upstream request. When a read has waited for the region
    longer than ``idle_timeout_s``, it ends that read with an error.
    """

    def __init__(
        self,
        relay: SseRelay,
        heartbeat_s: float,
        write_timeout_s: float,
        idle_timeout_s: float,
        commit: Callable[[], Awaitable[None]],
        cut_off: Callable[[], None],
    ) -> None:
        self.relay = relay
        self.heartbeat_s = heartbeat_s
        self.write_timeout_s = write_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.commit = commit
        self.cut_off = cut_off
        self.tick_s = min(heartbeat_s, write_timeout_s, idle_timeout_s) / 2
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
        if relay.read_started and now - relay.read_started >= self.idle_timeout_s:
            relay.stall(self.idle_timeout_s)
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
