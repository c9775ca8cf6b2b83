"""Forwarding one request to a region: failover before the first byte, then a checked SSE relay.

Nothing here buffers a stream: the region's bytes are checked and written to the client as they arrive, from
the connection's own ``data_received`` (no coroutine wakes per event), and a client that reads slowly pauses
the region's connection until it drains. Nothing here trusts the region either: its headers must come within
``first_byte_timeout_s``; one event may be at most ``max_event_bytes``, the whole stream at most its byte
budget, and it may carry at most ``max_tokens`` content events; every event must be a completion chunk; a
stream silent for ``idle_timeout_s`` is cut off. A region that breaks a rule is stopped there and the client
is told with a typed error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from edge.answer import NO_USAGE, UpstreamFault, passed_on, usage_bytes
from edge.h1 import MalformedResponse, Response
from edge.metrics import EdgeMetrics
from edge.upstream import UPSTREAM_ERRORS, Upstream, UpstreamPool
from nearshore.protocol import sse
from nearshore.protocol.errors import UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE, ApiError, ErrorBody
from nearshore.protocol.headers import SERVER_TIMING

RETRYABLE = frozenset({429, 500, 502, 503, 504})
_PEEK_BYTES = 4096
# After [DONE], the rest of the response (the chunked terminator) returns the connection to its pool; a
# region that stalls there loses the connection after this long.
_TAIL_S = 1.0
# Past this much unsent to the client, the region's connection is paused until the client drains.
_CLIENT_HIGH_WATER = 64 * 1024


@dataclass(slots=True)
class UpstreamTiming:
    forwarded_at: float = 0.0
    route_s: float = 0.0
    queue_s: float = 0.0
    connect_s: float = 0.0
    first_byte_s: float = 0.0
    region_timing: str = ""

    def header(self, edge_s: float) -> str:
        parts = [
            f"edge;dur={edge_s * 1000:.2f}",
            f"route;dur={self.route_s * 1000:.3f}",
            f"edge-queue;dur={self.queue_s * 1000:.2f}",
            f"upstream-connect;dur={self.connect_s * 1000:.2f}",
            f"upstream-ttfb;dur={self.first_byte_s * 1000:.1f}",
        ]
        if self.region_timing:
            parts.append(self.region_timing)
        return ", ".join(parts)


@dataclass(slots=True)
class Opened:
    upstream: Upstream
    response: Response
    timing: UpstreamTiming
    skipped: list[str] = field(default_factory=list)


async def open_upstream(
    pool: UpstreamPool,
    order: list[Upstream],
    path: str,
    body: bytes,
    headers: dict[str, str],
    metrics: EdgeMetrics,
    first_byte_timeout_s: float,
) -> Opened:
    """POST to the first replica in ``order`` that answers in time without a retryable error; the others
    are skipped, and each failure is reported to the router (enough of them in a row eject a replica)."""
    skipped: list[str] = []
    timed_out = malformed = 0
    for upstream in order:
        timing = UpstreamTiming(forwarded_at=time.perf_counter())
        try:
            response = await _post(upstream, path, headers, body, first_byte_timeout_s)
        except TimeoutError:
            timed_out += 1
            _skip(pool, upstream, metrics, skipped, f"no answer within {first_byte_timeout_s:g}s")
            continue
        except MalformedResponse as exc:  # it answered, but not in HTTP
            malformed += 1
            _skip(pool, upstream, metrics, skipped, f"a malformed response ({str(exc)[:80]})")
            continue
        except UPSTREAM_ERRORS as exc:
            _skip(pool, upstream, metrics, skipped, type(exc).__name__)
            continue
        timing.first_byte_s = time.perf_counter() - timing.forwarded_at
        timing.connect_s = response.connect_s
        timing.region_timing = response.headers.get(SERVER_TIMING.lower(), "")[:512]
        if response.status in RETRYABLE:
            detail = await _peek(response)
            upstream.replica.inflight -= 1
            pool.refused(upstream, response)  # a refusal carries the region's load too (a full queue)
            why = f"HTTP {response.status} {detail}"
            if response.status >= 500 and response.status != 503:
                pool.failed(upstream, why)
            skipped.append(f"{upstream.name}: {why}")
            metrics.failovers.labels(upstream.name).inc()
            continue
        pool.answered(upstream, response, timing.first_byte_s)
        return Opened(upstream, response, timing, skipped)
    where = f" ({'; '.join(skipped)})" if skipped else " (none available)"
    if skipped and timed_out == len(skipped):
        raise ApiError(UPSTREAM_TIMEOUT, "No region answered in time" + where, retry_after_s=1)
    if skipped and malformed == len(skipped):
        raise UpstreamFault.bad("No region answered in HTTP" + where).error
    raise ApiError(UPSTREAM_UNAVAILABLE, "No region could take the request" + where, retry_after_s=1)


async def _post(
    upstream: Upstream, path: str, headers: dict[str, str], body: bytes, timeout_s: float
) -> Response:
    """The request, counted in the replica's in-flight while the region queues and serves it (the caller
    releases an answered one when it is done with it)."""
    replica = upstream.replica
    replica.inflight += 1
    try:
        return await upstream.pool.request("POST", path, headers, body, timeout_s)
    except BaseException:
        replica.inflight -= 1
        raise


def _skip(pool: UpstreamPool, upstream: Upstream, metrics: EdgeMetrics, skipped: list[str], why: str) -> None:
    pool.failed(upstream, why)
    skipped.append(f"{upstream.name}: {why}")
    metrics.failovers.labels(upstream.name).inc()


async def _peek(response: Response) -> str:
    """The start of a refusal's body, for the log and the 503 message; a long or slow rest is not read."""
    data = b""
    with contextlib.suppress(TimeoutError, *UPSTREAM_ERRORS):
        async with asyncio.timeout(1.0):
            while len(data) <= _PEEK_BYTES and (more := await response.read()):
                data += more
    response.close()  # pooled again if it was read to its end
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
    text: list[str] = field(default_factory=list)  # the content relayed, piece by piece (to continue it)
    finish_reason: str = ""  # as the region's last choice said
    failure: ApiError | None = None  # what the client is told at the end (the region's error, or the edge's)
    fault: bool = False  # the edge stopped the stream because the region broke a rule
    done: bool = False


class UpstreamIdle(Exception):
    pass


class _Delta(msgspec.Struct):
    role: str | None = None
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: msgspec.Raw = NO_USAGE
    error: ErrorBody | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)


class SseRelay:
    """Copies one upstream SSE stream to the client as it arrives: whatever whole events one read brings
    go out in one write (so nothing waits for a later event, and nothing is split).

    It is the region's response's body sink: :meth:`data` runs inside the connection's ``data_received``.
    The edge always asks the region for a usage chunk; it is held back here (the caller sends the checked
    figure to a client that asked). Upstream comments are dropped (the edge sends its own heartbeats),
    ``[DONE]`` is held back too: the caller writes it after the usage record is committed.
    """

    def __init__(
        self, request: web.Request, client: web.StreamResponse, limits: StreamLimits, echo: bool = False
    ) -> None:
        self.request = request
        self.client = client
        self.limits = limits
        self.last_write = time.monotonic()
        self.write_started = 0.0  # set while the client has not taken what was written
        self.read_started = 0.0  # set while waiting for the region
        self.first_write_at = 0.0
        self.outcome = StreamOutcome()  # updated as events pass, so a stream cut short knows what it relayed
        self._echo_pending = echo  # /v1/completions with echo: the first text event is the prompt
        self._upstream: Response | None = None
        self._pending = b""
        self._total = 0
        self._chunked = True
        self._ended: asyncio.Future[None] | None = None
        self._draining: asyncio.Task | None = None
        self._broken: BaseException | None = None  # the client's side broke while we wrote
        self._resumed = False  # a second region continues the answer: its role event is not sent again

    @property
    def client_broke(self) -> bool:
        return self._broken is not None

    def resume(self) -> None:
        """Ready to relay a second region's continuation of the same answer: what was relayed stays
        counted; a half-received event of the dead stream is dropped; the end is the new stream's."""
        outcome = self.outcome
        outcome.failure, outcome.fault, outcome.done = None, False, False
        outcome.usage = outcome.usage_event = None
        self._pending = b""
        self._resumed = True

    async def write(self, data: bytes, *, content: bool = True) -> None:
        """Write through aiohttp (heartbeats, the end of the stream), waiting for the client to take it."""
        self.write_started = time.monotonic()
        await self.client.write(data)
        self.last_write = time.monotonic()
        self.write_started = 0.0
        if content and not self.first_write_at:
            self.first_write_at = time.perf_counter()

    def stall(self, idle_s: float) -> None:
        """Called by the watchdog: the region sent nothing for ``idle_s``; end the relay with that error."""
        if self._upstream is not None and self.read_started:
            self._upstream.abort(UpstreamIdle(f"no byte from the region for {idle_s:g}s"))

    async def relay(self, upstream: Response) -> StreamOutcome:
        self._upstream = upstream
        self._ended = asyncio.get_running_loop().create_future()
        # The head has gone (HTTP/1.1 clients get chunked framing; 1.0 ones a body that ends with the socket).
        self._chunked = self.client.headers.get("Transfer-Encoding", "").lower() == "chunked"
        self.read_started = time.monotonic()
        upstream.push_to(self)
        try:
            await self._ended
        finally:
            self.read_started = 0.0
            self._upstream = None
            if self._draining is not None and not self._draining.done():
                self._draining.cancel()
        if self._broken is not None:
            raise self._broken
        if self.outcome.done:
            # Read to the end (the chunked terminator may trail [DONE] across a network), so the connection
            # returns to its pool and the next user pays no handshake; a region that stalls there loses it.
            await upstream.finish(_TAIL_S)
        else:
            upstream.close()
        return self.outcome

    # --- the body sink, called from the region connection's data_received ---------------------------------

    def data(self, chunk: bytes) -> None:
        outcome, limits = self.outcome, self.limits
        if outcome.done or outcome.fault or self._broken:
            return
        self.read_started = time.monotonic()
        self._total += len(chunk)
        if self._total > limits.max_stream_bytes:
            return self._stop(f"the region's stream passed {limits.max_stream_bytes} bytes")
        pending = self._pending + chunk if self._pending else chunk
        if b"\n\n" in pending:
            *events, pending = pending.split(b"\n\n")
            forward = [e for e in events if self._keep(e)]
            if forward:
                self._send(b"\n\n".join(forward) + b"\n\n")
        self._pending = pending
        if len(pending) > limits.max_event_bytes:
            return self._stop(f"the region sent an event larger than {limits.max_event_bytes} bytes")
        if outcome.done or outcome.fault:
            self._finish()

    def end(self) -> None:
        if not (self.outcome.done or self.outcome.failure):
            self.outcome.failure = ApiError(
                UPSTREAM_UNAVAILABLE, "The region failed mid-stream: it closed the stream early."
            )
        self._finish()

    def error(self, exc: BaseException) -> None:
        outcome = self.outcome
        if isinstance(exc, UpstreamIdle):
            outcome.fault = True
            outcome.failure = ApiError(UPSTREAM_TIMEOUT, f"The region stalled mid-stream: {exc}.")
        elif isinstance(exc, MalformedResponse):
            self._fault(f"its stream is not HTTP ({exc})")
        elif not outcome.done and not outcome.failure:
            broke = f"The region failed mid-stream: its stream broke ({type(exc).__name__})."
            outcome.failure = ApiError(UPSTREAM_UNAVAILABLE, broke)
        self._finish()

    def _finish(self) -> None:
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    def _stop(self, message: str) -> None:
        self._fault(message)
        self._finish()

    def _fault(self, message: str) -> None:
        self.outcome.fault = True
        self.outcome.failure = UpstreamFault.bad(f"The region's stream was stopped: {message}.").error

    def _send(self, data: bytes) -> None:
        """Write to the client's transport now, framed as aiohttp's chunked writer would."""
        transport = self.request.transport
        if transport is None or transport.is_closing():
            self._broken = ConnectionResetError("the client went away")
            return self._finish()
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if not self.first_write_at:
            self.first_write_at = time.perf_counter()
        if transport.get_write_buffer_size() > _CLIENT_HIGH_WATER:
            self._wait_for_client()
        else:
            self.last_write = time.monotonic()

    def _wait_for_client(self) -> None:
        """The client is slower than the region: pause the region until the client drains (or the watchdog
        cuts it off after write_timeout_s)."""
        if self._upstream is None or (self._draining is not None and not self._draining.done()):
            return
        self.write_started = time.monotonic()
        self._upstream.pause()
        self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        writer = self.client._payload_writer  # aiohttp's writer: its drain waits on the transport's pause
        try:
            if writer is not None:
                await writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._broken = exc
            self._finish()
            return
        self.write_started = 0.0
        self.last_write = time.monotonic()
        if self._upstream is not None:
            self._upstream.resume()

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
        if len(chunk.choices) > 1:
            self._fault("more than the one choice asked for (n=1)")
            return False
        choice = chunk.choices[0]
        text = choice.delta.content if choice.delta is not None else choice.text
        if text:
            if self._echo_pending:
                self._echo_pending = False
            elif outcome.content_events >= self.limits.max_content_events:
                self._fault(f"more than max_tokens ({self.limits.max_content_events}) tokens")
                return False
            else:
                outcome.content_events += 1
                outcome.text.append(text)
        elif self._resumed and choice.delta is not None and choice.delta.role is not None:
            return False  # the client had the role from the first region
        if choice.finish_reason:
            outcome.finish_reason = choice.finish_reason
        return True


class StreamWatchdog:
    """One timer per stream, instead of a task and a timeout per write or read.

    When nothing has gone to the client for ``heartbeat_s``, it sends an SSE comment (the first one
    commits the response if the region has not answered yet), so idle hops stay open during a long
    prefill. When the client has not taken a write for ``write_timeout_s``, it cuts the client off: the
    handler then ends, which cancels the upstream request. When the region has sent nothing for
    ``idle_timeout_s``, it ends the relay with an error.
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
        if relay.read_started and not relay.write_started and now - relay.read_started >= self.idle_timeout_s:
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
