"""The checked SSE copy of one region's stream to the client (the engine of the stream's owner,
:mod:`edge.stream_reply`).

Nothing here buffers a stream: the region's bytes are checked and written to the client as they arrive, from
the connection's own ``data_received`` (no coroutine wakes per event), and a client that reads slowly pauses
the region's connection until it drains. Nothing here trusts the region either: one event may be at most
``max_event_bytes``, the whole stream at most its byte budget, and it may carry at most ``max_tokens``
content events; an event that does not parse is skipped, up to ``max_bad_events``; the first content token
must come by its deadline (``ttft_timeout_s`` after asking), then an event at least every
``stall_timeout_s``, and all of it before the request's deadline. A region that breaks a rule is stopped
there and the client is told with a typed error event. A stream that says how it finished
(``finish_reason``) and then ends, or sends its usage, is whole even without ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from edge.h1 import MalformedResponse, Response
from edge.provider import named
from edge.region_answer import NO_USAGE, UpstreamFault, passed_on, usage_bytes
from nearshore.protocol import sse
from nearshore.protocol.errors import UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE, ApiError, ErrorBody

# After [DONE], the rest of the response (the chunked terminator) returns the connection to its pool; a
# region that stalls there loses the connection after this long.
_TAIL_S = 1.0
# Past this much unsent to the client, the region's connection is paused until the client drains.
_CLIENT_HIGH_WATER = 64 * 1024
# ... and resumed once the client's socket holds no more than this.
_CLIENT_LOW_WATER = 16 * 1024


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_event_bytes: int
    max_stream_bytes: int
    max_content_events: int
    max_bad_events: int = 0


@dataclass(frozen=True, slots=True)
class StreamClock:
    """When a stream must show progress, on the monotonic clock: its first content token by
    ``first_token_by``, then an event at least every ``stall_s``, all of it by ``deadline_at``."""

    first_token_by: float
    stall_s: float
    deadline_at: float
    ttft_s: float  # what first_token_by was counted from, for the message

    def overdue(self, now: float, content_events: int, last_event_at: float) -> tuple[str, bool]:
        """Why the stream is late now ("" if it is not), and whether that ends the request."""
        if now >= self.deadline_at:
            return "the request's deadline passed", True
        if content_events == 0:
            if now >= self.first_token_by:
                return f"no first token within {self.ttft_s:g}s", False
        elif now - last_event_at >= self.stall_s:
            return f"no event from the region for {self.stall_s:g}s", False
        return "", False


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
    bad_events: int = 0  # events that did not parse, skipped
    expired: bool = False  # the request's deadline passed: nothing may continue it
    called: bool = False  # it streamed tool calls: its text is not all the answer, nothing continues it
    stalled_s: float = 0.0  # how long the region had been silent when the edge cut it (0: not a stall)


class UpstreamIdle(Exception):
    def __init__(self, message: str, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int = 0
    function: _Function | None = None


class _Delta(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None

    def calls_text(self) -> str:
        """What a tool-call delta carries (a name, arguments): progress, and tokens the client got."""
        parts = [
            (c.function.name or "") + (c.function.arguments or "")
            for c in self.tool_calls or ()
            if c.function
        ]
        return "".join(parts)


class _Choice(msgspec.Struct):
    index: int = 0
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
        self,
        request: web.Request,
        client: web.StreamResponse,
        limits: StreamLimits,
        echo: bool = False,
        choices: int = 1,
        recode: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.request = request
        self.recode = recode  # what the client gets instead of chat's events (the Responses API's)
        self.client = client
        self.limits = limits
        self.choices = choices  # n: chunks name choices 0..n-1
        self.last_write = time.monotonic()
        self.write_started = 0.0  # set while the client has not taken what was written
        self.read_started = 0.0  # set while waiting for the region
        self.first_write_at = 0.0
        self.outcome = StreamOutcome()  # updated as events pass, so a stream cut short knows what it relayed
        self._echo_pending = echo  # /v1/completions with echo: the first text event is the prompt
        self._upstream: Response | None = None
        self._transport: asyncio.Transport | None = None  # the client's, from relay() on
        self._events = sse.SseParser()
        self._out: list[bytes] = []  # checked events of the current read, not yet written
        self._total = 0
        self._chunked = True
        self._ended: asyncio.Future[None] | None = None
        self._draining: asyncio.Task | None = None
        self._broken: BaseException | None = None  # the client's side broke while we wrote
        self._resumed = False  # a second region continues the answer: its role event is not sent again
        self._body_ended = False  # the region's body ended (cleanly or not): nothing more to read
        self.clock: StreamClock | None = None  # armed by the caller before each relay
        self.model_name = ""  # a provider's stream: the edge's name for its model, put in each event
        self.last_event_at = 0.0

    @property
    def client_broke(self) -> bool:
        return self._broken is not None

    def resume(self) -> None:
        """Ready to relay a second region's continuation of the same answer: what was relayed stays
        counted; a half-received event of the dead stream is dropped; the end is the new stream's."""
        outcome = self.outcome
        outcome.failure, outcome.fault, outcome.done = None, False, False
        outcome.usage = outcome.usage_event = None
        outcome.finish_reason = ""
        outcome.stalled_s = 0.0
        self._events = sse.SseParser()
        self._resumed = outcome.content_events > 0 or self.first_write_at > 0
        self._total = 0

    def overdue(self, now: float) -> tuple[str, bool]:
        if self.clock is None:
            return "", False
        return self.clock.overdue(now, self.outcome.content_events, self.last_event_at)

    async def write(self, data: bytes, *, content: bool = True, last: bool = False) -> None:
        """Write through aiohttp (heartbeats, the end of the stream), waiting for the client to take it;
        ``last``: the stream's end (the chunked terminator) goes in the same write."""
        if self.recode is not None:
            data = self.recode(data)
            if not data and not last:
                return
        self.write_started = time.monotonic()
        await (self.client.write_eof(data) if last else self.client.write(data))
        self.last_write = time.monotonic()
        self.write_started = 0.0
        if content and not self.first_write_at:
            self.first_write_at = time.perf_counter()

    def stall(self, why: str, expired: bool = False) -> None:
        """Called by the watchdog: the region is late (``why``); end the relay with that error."""
        if self._upstream is not None and self.read_started:
            self._upstream.abort(UpstreamIdle(why, expired))

    async def relay(self, upstream: Response) -> StreamOutcome:
        self._upstream = upstream
        self._transport = self.request.transport  # one connection's for its life: read once a stream
        self._body_ended = False
        self.last_event_at = time.monotonic()
        self._ended = asyncio.get_running_loop().create_future()
        # The head has gone (HTTP/1.1 clients get chunked framing; 1.0 ones a body that ends with the socket).
        self._chunked = self.client.headers.get("Transfer-Encoding", "").lower() == "chunked"
        self.read_started = time.monotonic()
        upstream.push_to(self)
        try:
            await self._ended
        finally:
            self.flush()  # what the read that ended it brought
            self.read_started = 0.0
            self._upstream = None
            if self._draining is not None and not self._draining.done():
                self._draining.cancel()
        if self._broken is not None:
            raise self._broken
        if self.outcome.done and not self._body_ended:
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
        self._total += len(chunk)
        if self._total > limits.max_stream_bytes:
            return self._stop(f"the region's stream passed {limits.max_stream_bytes} bytes")
        if (payload := self._events.one_line_data(chunk)) is not None:
            # Nearly every piece: one whole event of one data line, nothing before it unfinished: checked, it
            # goes on as it came (its blank line included).
            if len(chunk) - 2 > limits.max_event_bytes:
                self._fault(self._oversized())
            elif self._check(payload):
                self._send(named(chunk, self.model_name) if self.model_name else chunk)
            if outcome.done or outcome.fault:
                self._finish()
            return
        events = self._events.blocks(chunk)
        out = b""
        if len(events) == 1:  # one event, not on one line or after an unfinished one: no list, no join
            if (kept := self._keep(events[0])) is not None:
                out = kept + b"\n\n"
        elif events:
            forward = [kept for e in events if (kept := self._keep(e)) is not None]
            if forward:
                out = b"\n\n".join(forward) + b"\n\n"
        if out:
            self._send(named(out, self.model_name) if self.model_name else out)
        if outcome.done or outcome.fault:  # an event before the unfinished one ended it: that is why it ended
            self._finish()
        elif self._events.pending > limits.max_event_bytes:
            self._stop(self._oversized())

    def end(self) -> None:
        """The region's body ended cleanly: with how it finished said, the answer is whole ([DONE] or not)."""
        self.flush()
        self._body_ended = True
        outcome = self.outcome
        if not (outcome.done or outcome.failure or outcome.fault):
            if outcome.finish_reason or self._all_tokens():
                outcome.done = True
            else:
                outcome.failure = ApiError(
                    UPSTREAM_UNAVAILABLE, "The region failed mid-stream: it closed the stream early."
                )
        self._finish()

    def error(self, exc: BaseException) -> None:
        self.flush()
        self._body_ended = True
        outcome = self.outcome
        if outcome.done or outcome.fault:
            pass
        elif not outcome.failure and (
            (outcome.finish_reason and outcome.usage is not None) or self._all_tokens()
        ):
            outcome.done = True  # it said how it finished and what it cost, or it sent every token asked
        elif isinstance(exc, UpstreamIdle):
            outcome.fault, outcome.expired = True, exc.expired
            outcome.stalled_s = time.monotonic() - self.last_event_at
            when = "before its first token" if outcome.content_events == 0 else "mid-stream"
            outcome.failure = ApiError(UPSTREAM_TIMEOUT, f"The region stalled {when}: {exc}.")
        elif isinstance(exc, MalformedResponse):
            self._fault(f"its stream is not HTTP ({exc})")
        elif not outcome.done and not outcome.failure:
            broke = f"The region failed mid-stream: its stream broke ({type(exc).__name__})."
            outcome.failure = ApiError(UPSTREAM_UNAVAILABLE, broke)
        self._finish()

    def _all_tokens(self) -> bool:
        """Every token asked for was relayed: however the stream ended, the answer is whole (``length``)."""
        outcome = self.outcome
        if outcome.content_events < self.limits.max_content_events:
            return False
        outcome.finish_reason = outcome.finish_reason or "length"
        return True

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
        """Queue ``data`` for the client: what one read of the region brought goes out in one write."""
        if self.recode is not None and not (data := self.recode(data)):
            return
        self._out.append(data)

    def flush(self) -> None:
        """Write what is queued to the client's transport now, framed as aiohttp's chunked writer would
        (the region's connection calls this at the end of each read)."""
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        transport = self._transport
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
        """Wait until the client's socket has taken most of what is queued for it, through the transport's
        public API (a slow reader only: the wait starts at a millisecond and backs off to 50 ms)."""
        transport, wait_s = self.request.transport, 0.001
        while transport is not None and not transport.is_closing():
            if transport.get_write_buffer_size() <= _CLIENT_LOW_WATER:
                break
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, 0.05)
        else:
            self._broken = ConnectionResetError("the client went away")
            self._finish()
            return
        self.write_started = 0.0
        self.last_write = time.monotonic()
        if self._upstream is not None:
            self._upstream.resume()

    def _keep(self, event: bytes) -> bytes | None:
        """Check the event and note what it says; what goes to the client now (None: nothing)."""
        outcome = self.outcome
        if not event or outcome.done or outcome.fault:
            return None
        if len(event) > self.limits.max_event_bytes:  # the same bound whole as unfinished, however it came
            self._fault(self._oversized())
            return None
        if event.startswith(b":"):
            return None
        one_line = event.startswith(b"data:") and b"\n" not in event
        if not one_line and sse.odd_line(event) is not None:
            self._bad("an event line that is not an SSE field")
            return None
        payload = sse.event_data(event)
        if payload is None:
            return None
        payload = payload.strip()
        if not one_line:
            event = b"data: " + payload
        return event if self._check(payload) else None

    def _check(self, payload: bytes) -> bool:
        """Check one event's data (stripped) and note what it says; whether the event goes to the client."""
        outcome = self.outcome
        self.last_event_at = time.monotonic()
        if payload == b"[DONE]":
            if outcome.bad_events and not outcome.finish_reason:  # what it skipped may have been the answer
                self._fault(f"{outcome.bad_events} events that did not parse, and no finish_reason")
                return False
            outcome.done = True
            return False
        try:
            chunk = _chunk_decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return self._bad("an event that is not a completion chunk")
        if chunk.error is not None:
            outcome.failure = passed_on(chunk.error, 502)
            return False
        # (a chunk without usage, or with "usage": null, equals the default: most events skip the copy)
        if chunk.usage != NO_USAGE and (usage := usage_bytes(chunk.usage)) is not None:
            outcome.usage = usage
            if not chunk.choices:
                outcome.usage_event = payload
                return False
        if not chunk.choices:
            return self._bad("a chunk with neither choices nor usage")
        if len(chunk.choices) > 1 or not 0 <= chunk.choices[0].index < self.choices:
            self._fault(f"a choice the request did not ask for (n={self.choices})")
            return False
        choice = chunk.choices[0]
        text = choice.delta.content if choice.delta is not None else choice.text
        if choice.delta is not None and choice.delta.tool_calls:
            outcome.called = True
            text = (text or "") + choice.delta.calls_text()  # a call's name and arguments are its tokens
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

    def _oversized(self) -> str:
        return f"the region sent an event larger than {self.limits.max_event_bytes} bytes"

    def _bad(self, what: str) -> bool:
        """One event that does not parse is skipped (False: nothing to send); past max_bad_events the stream
        is broken."""
        self.outcome.bad_events += 1
        if self.outcome.bad_events > self.limits.max_bad_events:
            self._fault(f"{what} (one of {self.outcome.bad_events} that did not parse)")
        return False
