"""Forward one admitted request to a region and bring its answer back, recording the outcome on its journey.

:func:`forward_unary` and :func:`forward_stream` return a reply whose ``finish`` sends the last part once the
journey is closed (the ledger row committed): the whole body of a unary answer, or a stream's usage chunk,
error event and ``[DONE]``. Errors before anything reached the client are raised as :class:`ApiError`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import msgspec
from aiohttp import web

from edge.answer import (
    MAX_TOKEN_TEXT_BYTES,
    Answer,
    UpstreamFault,
    check_answer,
    read_bounded,
    read_refusal,
)
from edge.journey import Journey
from edge.relay import Opened, SseRelay, StreamLimits, StreamWatchdog, open_upstream
from edge.state import EdgeState
from edge.usage_audit import AuditedUsage
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError
from nearshore.protocol.headers import REGION as REGION_HEADER
from nearshore.protocol.schemas import Usage, json_encoder


@dataclass(frozen=True, slots=True)
class Call:
    """What goes to the region, and the headers every answer to the client carries."""

    path: str
    body: bytes
    headers: dict[str, str]
    client_headers: dict[str, str]
    echo: bool = False  # /v1/completions with echo: the first streamed text is the prompt


def _response_budget(state: EdgeState, journey: Journey) -> int:
    up = state.config.upstream
    return up.response_base_bytes + up.response_bytes_per_token * journey.admission.max_tokens


def _with_usage(payload: bytes, usage: Usage) -> bytes:
    """``payload`` (a JSON object) with its ``usage`` replaced by the figure the edge billed."""
    data = msgspec.json.decode(payload)
    data["usage"] = usage
    return json_encoder.encode(data)


# --- unary ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class UnaryReply:
    answer: Answer
    headers: dict[str, str]

    async def finish(self, audited: AuditedUsage | None) -> web.Response:
        body = self.answer.body
        if audited is not None and audited.anomalies:
            body = _with_usage(body, audited.usage)
        return web.Response(body=body, content_type="application/json", headers=self.headers)


async def forward_unary(request: web.Request, state: EdgeState, journey: Journey, call: Call) -> UnaryReply:
    up = state.config.upstream
    forwarded = time.perf_counter()
    state.metrics.overhead.observe(forwarded - journey.started)
    # The whole answer is its first byte: allow for the tokens it may have to generate.
    deadline_s = up.first_byte_timeout_s + up.unary_timeout_per_token_s * journey.admission.max_tokens
    opened = await open_upstream(state.pool, call.path, call.body, call.headers, state.metrics, deadline_s)
    journey.region = opened.region.name
    headers = {**call.client_headers, REGION_HEADER: journey.region}
    async with opened.response as upstream:
        if upstream.status != 200:
            error, refused = await read_refusal(upstream)
            journey.failed(error, refused=refused)
            error.extra_headers.update(headers)
            raise error
        try:
            max_bytes = min(up.max_unary_bytes, _response_budget(state, journey))
            body = await read_bounded(upstream, max_bytes, up.idle_timeout_s)
            a = journey.admission
            # Completions with echo carry the prompt too.
            max_text = a.max_tokens * MAX_TOKEN_TEXT_BYTES + (a.prompt_ceiling if call.echo else 0)
            answer = check_answer(journey.kind, upstream, body, max_text)
        except UpstreamFault as fault:
            journey.failed(fault.error)
            fault.error.extra_headers.update(headers)
            raise fault.error from None
    journey.answered(answer.usage)
    headers["Server-Timing"] = opened.timing.header(forwarded - journey.started)
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return UnaryReply(answer, headers)


# --- streams -------------------------------------------------------------------------------------------


class StreamReply:
    """The client's side of one stream: committed by the first heartbeat or the region's answer."""

    def __init__(
        self, request: web.Request, state: EdgeState, journey: Journey, call: Call, relay: SseRelay
    ) -> None:
        self.request = request
        self.state = state
        self.journey = journey
        self.call = call
        self.client = relay.client
        self.relay = relay
        self.keep_usage = False
        self.failure: ApiError | None = None
        self.cut = False  # the client stopped reading or went away: no end to send
        self._prepare_lock = asyncio.Lock()

    async def commit(self, opened: Opened | None = None) -> None:
        """Send the response head (once); with the region's answer, its name and timings go in it."""
        async with self._prepare_lock:
            if self.client.prepared:
                return
            if opened is not None:
                self.client.headers[REGION_HEADER] = opened.region.name
                edge_s = opened.timing.forwarded_at - self.journey.started
                self.client.headers["Server-Timing"] = opened.timing.header(edge_s)
            await self.client.prepare(self.request)

    def cut_off(self) -> None:
        if self.request.transport is not None:
            self.request.transport.close()

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
                    event = _with_usage(event, audited.usage)
                await self.relay.write(b"data: " + event + b"\n\n")
            await self.relay.write(sse.DONE)
            await self.client.write_eof()
        except (ConnectionError, RuntimeError):
            self.cut_off()  # the client left after its row was committed: nothing more to send
        self.state.metrics.e2e.observe(time.perf_counter() - self.journey.started)
        return self.client


async def forward_stream(
    request: web.Request, state: EdgeState, journey: Journey, call: Call, keep_usage: bool
) -> StreamReply:
    up = state.config.upstream
    client = web.StreamResponse(headers={**sse.HEADERS, **call.client_headers})
    max_tokens = journey.admission.max_tokens
    limits = StreamLimits(up.max_event_bytes, _response_budget(state, journey), max_tokens)
    relay = SseRelay(client, limits, echo=call.echo)
    reply = StreamReply(request, state, journey, call, relay)
    reply.keep_usage = keep_usage
    watchdog = StreamWatchdog(
        relay,
        up.heartbeat_s,
        state.config.server.write_timeout_s,
        up.idle_timeout_s,
        reply.commit,
        reply.cut_off,
    )
    state.metrics.overhead.observe(time.perf_counter() - journey.started)
    watchdog.start()
    opened: Opened | None = None
    try:
        try:
            opened = await open_upstream(
                state.pool, call.path, call.body, call.headers, state.metrics, up.first_byte_timeout_s
            )
        except ApiError as exc:
            return _failed_before_first_byte(reply, exc)
        journey.region = opened.region.name
        async with opened.response as upstream:
            if upstream.status != 200:
                error, refused = await read_refusal(upstream)
                return _failed_before_first_byte(reply, error, refused=refused)
            if upstream.content_type != "text/event-stream":
                fault = UpstreamFault.bad(f"the region answered a stream with {upstream.content_type!r}")
                return _failed_before_first_byte(reply, fault.error)
            await reply.commit(opened)
            outcome = await relay.relay(upstream)
        if relay.first_write_at:
            state.metrics.ttft.observe(relay.first_write_at - journey.started)
        if outcome.failure is not None:
            journey.failed(outcome.failure)
            reply.failure = outcome.failure
        else:
            journey.answered(outcome.usage)
        return reply
    except (ConnectionError, TimeoutError):
        # The client stopped reading (write timeout) or its socket broke: it is cut off, billed what it got.
        journey.left()
        reply.cut = True
        if opened is not None:
            state.in_background(state.pool.replenish(opened.region))
        return reply
    except asyncio.CancelledError:
        # The client left: leaving the block above closed the upstream request, so the region aborts.
        if opened is not None:
            state.in_background(state.pool.replenish(opened.region))
        raise
    finally:
        await watchdog.stop()
        outcome = relay.outcome
        journey.relayed_events = outcome.content_events
        journey.produced = journey.produced or outcome.content_events > 0
        if journey.usage is None:
            journey.usage = outcome.usage


def _failed_before_first_byte(reply: StreamReply, error: ApiError, refused: bool = False) -> StreamReply:
    """No token reached the client: a plain HTTP error if nothing did, else an error event (a heartbeat
    already committed the response)."""
    reply.journey.failed(error, refused=refused)
    if not reply.client.prepared:
        error.extra_headers.update(reply.call.client_headers)
        if reply.journey.region:
            error.extra_headers[REGION_HEADER] = reply.journey.region
        raise error
    reply.failure = error
    return reply
