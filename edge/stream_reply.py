"""A stream's client side: started by the forward stage before the region answers (its watchdog sends
heartbeats while the region prefills), filled by the relay stage, and ended by its ``finish`` once the
journey is billed (the checked usage chunk or the error event, then ``[DONE]``).

Also the answer to a request that failed before any token reached the client: a plain HTTP error if
nothing did, else an error event on the stream a heartbeat already committed.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from edge.answer import with_usage
from edge.journey import Journey, Reply
from edge.opened import Opened
from edge.response_budget import event_budget, response_budget
from edge.sse_relay import SseRelay, StreamLimits
from edge.usage_audit import AuditedUsage
from edge.watchdog import StreamWatchdog
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError
from nearshore.protocol.headers import REGION, SERVER_TIMING


class StreamReply:
    """The client's side of one stream: committed by the first heartbeat or the region's answer."""

    def __init__(self, journey: Journey, relay: SseRelay) -> None:
        assert journey.call is not None
        self.journey = journey
        self.request = journey.request
        self.client = relay.client
        self.relay = relay
        self.keep_usage = journey.call.keep_usage
        self.failure: ApiError | None = None
        self.cut = False  # the client stopped reading or went away: no end to send
        self._prepare_lock = asyncio.Lock()

    @property
    def first_write_at(self) -> float:
        return self.relay.first_write_at

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
        if self.cut:
            self.cut_off()
            return self.client
        try:
            await self.commit()
            outcome = self.relay.outcome
            if self.failure is not None:
                await self.relay.write(sse.error(self.failure))
            elif self.keep_usage and outcome.usage_event is not None:
                event = outcome.usage_event
                if audited is not None and audited.anomalies:
                    event = with_usage(event, audited.usage)
                await self.relay.write(b"data: " + event + b"\n\n")
            await self.relay.write(sse.DONE)
            await self.client.write_eof()
        except (ConnectionError, RuntimeError):
            self.cut_off()  # the client left after its row was committed: nothing more to send
        self.journey.state.metrics.e2e.observe(time.perf_counter() - self.journey.started)
        return self.client


def start_stream(journey: Journey) -> StreamReply:
    """The stream's client side and its watchdog (stopped at the journey's exit), on the journey."""
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None
    up = state.config.upstream
    client = web.StreamResponse(headers={**sse.HEADERS, **call.client_headers})
    limits = StreamLimits(
        event_budget(journey), response_budget(journey), admission.completion_tokens, up.max_bad_events
    )
    stream = StreamReply(
        journey, SseRelay(journey.request, client, limits, echo=call.echo, choices=admission.choices)
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
