"""One stream's owner: its client side, started by the forward stage before the region answers (its watchdog
sends heartbeats while the region prefills), relayed from the region by the relay stage (``relay_from``),
continued from another region by the continue stage (``continue_from``), ended as the last region left it
(``end``), and finished once the journey is billed (the checked usage chunk or the error event, then
``[DONE]``). The stages act on a stream through these verbs only.

Also the answer to a request that failed before any token reached the client: a plain HTTP error if
nothing did, else an error event on the stream a heartbeat already committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from edge.answer_size import event_budget, response_budget
from edge.journey import Journey, Reply, WholeAnswer
from edge.opened import Opened
from edge.region_answer import with_usage
from edge.retry import stall_window
from edge.sse_relay import SseRelay, StreamClock, StreamLimits, StreamOutcome
from edge.upstream import Upstream
from edge.usage_audit import AuditedUsage, Delivered
from edge.watchdog import StreamWatchdog
from nearshore.httpkit import close_unframed
from nearshore.protocol import sse
from nearshore.protocol.answers import answer_for
from nearshore.protocol.errors import ApiError
from nearshore.protocol.headers import REGION, SERVER_TIMING

# Its lines keep the logger they had when the relay lived in the forward stage.
log = logging.getLogger("nearshore.edge.forward")


@dataclass(frozen=True, slots=True)
class CutShort:
    """A stream its region ended with a failure: the relay's report, for the continue stage to act on."""

    opened: Opened  # the region that failed it
    outcome: StreamOutcome  # how it ended, and the text the client already has
    tried: tuple[Upstream, ...]  # the replicas that failed this stream


class StreamReply:
    """One stream, whole: its client side (committed by the first heartbeat or the region's answer), the
    relay that copies its regions' events to it, and what reached the client (the relay's
    :class:`StreamOutcome`, the one record of it: the journey reads it here as its
    :class:`~edge.journey.Delivery`)."""

    def __init__(self, journey: Journey, relay: SseRelay) -> None:
        assert journey.call is not None
        self.journey = journey
        self.request = journey.request
        self.client = relay.client
        self.relay = relay
        self.keep_usage = journey.call.keep_usage
        self.failure: ApiError | None = None
        self.cut_short: CutShort | None = None  # its region failed it: the continue stage's to take on
        self.client_left = False  # the client stopped reading or went away: no end to send
        self._ended_whole = False
        self._prepare_lock = asyncio.Lock()

    @property
    def first_write_at(self) -> float:
        return self.relay.first_write_at

    # --- what reached the client (edge.journey.Delivery) ---

    @property
    def events(self) -> int | None:
        return self.relay.outcome.content_events

    @property
    def delivered(self) -> Delivered | None:
        return None  # a stream's tokens are its events

    @property
    def answer(self) -> WholeAnswer | None:
        outcome = self.relay.outcome
        return WholeAnswer("".join(outcome.text), outcome.finish_reason) if self._ended_whole else None

    @property
    def usage(self) -> bytes | None:
        return self.relay.outcome.usage

    @property
    def produced(self) -> bool:
        return self._ended_whole or self.relay.outcome.content_events > 0

    @property
    def bad_events(self) -> int:
        return self.relay.outcome.bad_events

    def head(self, name: str, value: str, *, replace: bool = True) -> None:
        """A header of the response head, while it is not sent (after a heartbeat: in its chunks only)."""
        if not self.client.prepared and (replace or name not in self.client.headers):
            self.client.headers[name] = value

    async def relay_from(self, opened: Opened) -> StreamOutcome:
        """Relay ``opened``'s stream on the request's clock: its first token within ttft_timeout_s of
        asking it and within the request's first-byte budget, then no silence longer than the stall window
        (the stall timeout, or what the stalls that cut this stream before left of the stall budget), all
        before the deadline."""
        journey = self.journey
        up, forwarded = journey.state.config.upstream, journey.forwarded
        assert forwarded.deadline is not None
        asked_at = time.monotonic() - (time.perf_counter() - opened.timing.forwarded_at)
        first_s = forwarded.first_byte.limit(opened.model, up.ttft_timeout_s, now=asked_at)
        window_s = stall_window(up.stall_timeout_s, up.stall_budget_s, journey.continued.stalled_s)
        self.relay.clock = StreamClock(asked_at + first_s, window_s, forwarded.deadline.at, first_s)
        self.relay.model_name = opened.model if opened.upstream.provider is not None else ""
        return await self.relay.relay(opened.response)

    async def continue_from(self, opened: Opened) -> StreamOutcome:
        """Relay another region's continuation of the answer: its role event is not sent again, and its
        first token is a silence of the stream the client has (the stall window bounds it)."""
        self.relay.resume()
        return await self.relay_from(opened)

    def end(self, outcome: StreamOutcome) -> Reply:
        """Record how the stream ended: answered (its text whole), or failed (an error event tells the
        client at the finish)."""
        journey = self.journey
        if outcome.bad_events:
            self._count_bad_events(outcome)
        if outcome.failure is not None:
            journey.failed(outcome.failure)
            self.failure = outcome.failure
        else:
            journey.answered()
            self._ended_whole = True
        return self

    async def guarded(self, step: Callable[[], Awaitable[Reply | None]]) -> Reply | None:
        """Run ``step``, which relays this stream, as the client may break it. Unless the step hands the
        stream on (None: the continue stage takes it), the stream ends here however it ends; the client
        is billed what reached it (read from this stream)."""
        journey = self.journey
        state = journey.state
        try:
            return await step()
        except (ConnectionError, TimeoutError):
            # The client stopped reading (write timeout) or its socket broke: cut off, billed what it got.
            journey.left()
            self.client_left = True
            state.in_background(state.pool.replenish(self._answering()))
            return self
        except asyncio.CancelledError:
            # The client left: leaving the relay closed the upstream request, so the region aborts.
            state.in_background(state.pool.replenish(self._answering()))
            raise

    def _answering(self) -> Upstream:
        opened = self.journey.forwarded.opened
        assert opened is not None
        return opened.upstream

    def _count_bad_events(self, outcome: StreamOutcome) -> None:
        journey = self.journey
        region = journey.forwarded.region
        journey.state.metrics.bad_events.labels(region or "none").inc(outcome.bad_events)
        log.warning(
            "request %s: %s sent %d stream events that do not parse (skipped)",
            journey.request_id,
            region,
            outcome.bad_events,
        )

    async def commit(self, opened: Opened | None = None) -> None:
        """Send the response head (once); with the region's answer, its name and timings go in it."""
        async with self._prepare_lock:
            if self.client.prepared:
                return
            if opened is not None:
                self.client.headers[REGION] = opened.upstream.replica.region
                edge_s = opened.timing.forwarded_at - self.journey.started
                self.client.headers[SERVER_TIMING] = opened.timing.header(edge_s)
            await self.client.prepare(self.request)

    def cut_off(self) -> None:
        # abort, not close: a TLS close waits for the peer's close_notify, and this peer stopped reading,
        # so the pending write (and the request's bill) would wait for the TLS shutdown timeout.
        if self.request.transport is not None:
            self.request.transport.abort()

    async def finish(self, audited: AuditedUsage | None) -> web.StreamResponse:
        if self.client_left:
            self.cut_off()
            return self.client
        try:
            await self.commit()
            tail = self._last_event(audited)
            if tail and self.relay.recode is not None:  # a dialect's events are recoded each in its turn
                await self.relay.write(tail)
                tail = b""
            await self.journey.dialect.ending(audited)  # a stored response is kept before its end
            # The last event, [DONE] and the chunked terminator: one write.
            await self.relay.write(tail + sse.DONE, last=True)
        except (ConnectionError, RuntimeError):
            self.cut_off()  # the client left after its row was committed: nothing more to send
        self.journey.state.metrics.e2e.observe(time.perf_counter() - self.journey.started)
        return self.client

    def _last_event(self, audited: AuditedUsage | None) -> bytes:
        """What goes before [DONE]: the failure's error event, else the usage chunk for a client that asked
        (the region's, corrected if the audit disagreed, or the edge's own count), else nothing."""
        outcome = self.relay.outcome
        if self.failure is not None:
            return sse.error(self.failure)
        if self.keep_usage and outcome.usage_event is not None:
            event = outcome.usage_event
            if audited is not None and audited.anomalies:
                event = with_usage(event, audited.usage)
            return b"data: " + event + b"\n\n"
        if self.keep_usage and audited is not None and not audited.reported:
            return self._counted_usage_event(audited)
        return b""

    def _counted_usage_event(self, audited: AuditedUsage) -> bytes:
        """The usage chunk of a stream whose region sent none (a provider that does not report): the
        edge's own count, as it billed it."""
        journey = self.journey
        answer = answer_for(journey.kind == "chat", journey.request_id, journey.model)
        return sse.event(answer.usage(audited.usage))


def start_stream(journey: Journey) -> StreamReply:
    """The stream's client side and its watchdog (stopped at the journey's exit), on the journey."""
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None
    up = state.config.upstream
    client = close_unframed(
        journey.request, web.StreamResponse(headers={**sse.HEADERS, **call.client_headers})
    )
    limits = StreamLimits(
        event_budget(journey), response_budget(journey), admission.completion_tokens, up.max_bad_events
    )
    stream = StreamReply(
        journey,
        SseRelay(
            journey.request,
            client,
            limits,
            echo=call.echo,
            choices=admission.choices,
            recode=journey.dialect.recode,
        ),
    )
    # Checked often enough that a late first token or a stall is seen within a tenth of its limit.
    tick_s = min(1.0, up.ttft_timeout_s / 10, up.stall_timeout_s / 10)
    watchdog = StreamWatchdog(
        stream.relay,
        up.heartbeat_s,
        state.config.server.write_timeout_s,
        stream.commit,
        stream.cut_off,
        tick_s,
    )
    watchdog.start()
    journey.forwarded.stream = stream
    journey.relayed = stream  # what reached the client is read from the stream, as it goes
    journey.cleanups.append(watchdog.stop)
    return stream


def failed_before_first_byte(
    journey: Journey, stream: StreamReply | None, error: ApiError, refused: bool = False
) -> Reply:
    """No token reached the client: a plain HTTP error if nothing did, else an error event (a heartbeat
    already committed the stream)."""
    journey.failed(error, refused=refused)
    if stream is None or not stream.client.prepared:
        assert journey.call is not None
        error.extra_headers.update(journey.call.client_headers)
        if journey.forwarded.region:
            error.extra_headers[REGION] = journey.forwarded.region
        raise error
    stream.failure = error
    return stream
