"""The forward and relay stages: send an admitted request to a region, bring its answer back, and record
the outcome on the journey.

forward: a stream's client side starts first (its watchdog sends heartbeats while the region prefills), then
the request goes to the first region that answers in time (failover before the first byte). relay: a unary
answer is read with its bounds and checked; a stream is relayed event by event. Each returns a reply whose
``finish`` sends the last part once the journey is billed. Errors before anything reached the client are
raised as :class:`ApiError`; after, they end the stream as an error event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edge.answer import (
    MAX_TOKEN_TEXT_BYTES,
    MAX_VECTOR_BYTES,
    Answer,
    UpstreamFault,
    check_answer,
    check_embeddings,
    read_bounded,
    read_refusal,
    with_usage,
)
from edge.journey import Journey, Preempting, Reply
from edge.relay import Opened, SseRelay, StreamLimits, StreamWatchdog, open_upstream
from edge.resume import combine_usage, may_continue, open_continuation
from edge.usage_audit import AuditedUsage
from nearshore.protocol import sse
from nearshore.protocol.errors import ApiError
from nearshore.protocol.headers import REGION, SERVER_TIMING
from nearshore.protocol.schemas import CompletionRequest, EmbeddingRequest

# The most bytes one log-probability alternative takes in JSON (chat's shape: name, logprob, bytes list).
LOGPROB_ALTERNATIVE_BYTES = 160


def _response_budget(journey: Journey) -> int:
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None
    if isinstance(body, EmbeddingRequest):
        return up.response_base_bytes + MAX_VECTOR_BYTES * len(body.texts())
    per_token, tokens = up.response_bytes_per_token, admission.max_tokens
    if (alternatives := body.top_logprobs_asked()) is not None:
        # Each scored token carries its alternatives; with echo, every prompt token is scored too.
        per_token += LOGPROB_ALTERNATIVE_BYTES * (alternatives + 1)
        if isinstance(body, CompletionRequest) and body.echo:
            tokens += admission.prompt_ceiling
    return up.response_base_bytes + per_token * tokens


async def forward(journey: Journey) -> Reply | None:
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None and journey.body is not None
    up = state.config.upstream
    if journey.body.stream:
        stream = _start_stream(journey)
        first_byte_s = up.first_byte_timeout_s
    else:
        stream = None
        # A unary answer's first byte is its whole answer: allow for the tokens it may have to generate.
        first_byte_s = up.first_byte_timeout_s + up.unary_timeout_per_token_s * admission.max_tokens
    state.metrics.overhead.observe(time.perf_counter() - journey.started)
    order = state.pool.ordered(journey.route)
    opening = open_upstream(
        state.pool, order, call.path, call.body, call.headers, state.metrics, first_byte_s
    )
    try:
        if journey.preempt is None:
            opened = await opening
        else:
            raced = await _race(journey.preempt, opening)
            if not isinstance(raced, Opened):
                return raced  # the other stage's answer came first: the region's request is cancelled
            opened = raced
    except ApiError as exc:
        return _failed_before_first_byte(journey, stream, exc)
    journey.opened, journey.region = opened, opened.upstream.replica.region
    opened.timing.route_s, opened.timing.queue_s = journey.route_s, journey.queue_s
    journey.cleanups.append(_release(journey, opened))
    return None


async def _race(
    preempt: asyncio.Task[Preempting | None], opening: Coroutine[Any, Any, Opened]
) -> Opened | Reply:
    """The region's answer head, unless ``preempt`` first ends with a reply (then the region's request is
    cancelled: its connection closes and the region aborts the work)."""
    upstream = asyncio.ensure_future(opening)
    try:
        done, _ = await asyncio.wait({upstream, preempt}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client left mid-race: the region's request goes too
        _abandon(upstream)
        raise
    if preempt in done and not preempt.cancelled() and preempt.exception() is None:
        reply = preempt.result()
        if reply is not None:
            if not reply.won(upstream):
                _abandon(upstream)
            return reply
    return await upstream


def _abandon(upstream: asyncio.Future[Opened]) -> None:
    """Cancel the region's request; one that answered meanwhile is closed and its slot given back."""

    def drop(task: asyncio.Future[Opened]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        opened = task.result()
        opened.response.close()
        opened.upstream.replica.inflight -= 1

    upstream.add_done_callback(drop)
    upstream.cancel()


def _release(journey: Journey, opened: Opened):
    async def release() -> None:
        opened.response.close()  # pooled again if read to its end; else the connection is dropped
        replica = opened.upstream.replica
        replica.inflight -= 1
        if journey.status == "ok" and journey.opened is opened:  # not the region that died mid-answer
            journey.state.pool.router.finished(
                replica, (time.perf_counter() - opened.timing.forwarded_at) * 1000
            )

    return release


async def relay(journey: Journey) -> Reply:
    if isinstance(journey.stream, StreamReply):
        return await _relay_stream(journey, journey.stream)
    return await _read_unary(journey)


def _failed_before_first_byte(
    journey: Journey, stream: StreamReply | None, error: ApiError, refused: bool = False
) -> Reply:
    """No token reached the client: a plain HTTP error if nothing did, else an error event (a heartbeat
    already committed the stream)."""
    journey.failed(error, refused=refused)
    if stream is None or not stream.client.prepared:
        assert journey.call is not None
        error.extra_headers.update(journey.call.client_headers)
        if journey.region:
            error.extra_headers[REGION] = journey.region
        raise error
    stream.failure = error
    return stream


# --- unary ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class UnaryReply:
    answer: Answer
    headers: dict[str, str]

    async def finish(self, audited: AuditedUsage | None) -> web.Response:
        body = self.answer.body
        if audited is not None and audited.anomalies:
            body = with_usage(body, audited.usage)
        return web.Response(body=body, content_type="application/json", headers=self.headers)


async def _read_unary(journey: Journey) -> Reply:
    state, opened, admission, call = journey.state, journey.opened, journey.admission, journey.call
    assert opened is not None and admission is not None and call is not None
    up = state.config.upstream
    upstream = opened.response
    if upstream.status != 200:
        error, refused = await read_refusal(upstream)
        return _failed_before_first_byte(journey, None, error, refused)
    try:
        max_bytes = min(up.max_unary_bytes, _response_budget(journey))
        body = await read_bounded(upstream, max_bytes, up.idle_timeout_s)
        # No tokenizer spells a token in more bytes than this; completions with echo carry the prompt too.
        max_text = admission.max_tokens * MAX_TOKEN_TEXT_BYTES + (
            admission.prompt_ceiling if call.echo else 0
        )
        if isinstance(journey.body, EmbeddingRequest):
            answer = check_embeddings(upstream, body, len(journey.body.texts()))
        else:
            answer = check_answer(journey.kind, upstream, body, max_text)
    except UpstreamFault as fault:
        return _failed_before_first_byte(journey, None, fault.error)
    journey.answered(answer.usage)
    journey.answer_text, journey.finish_reason = answer.text, answer.finish_reason
    edge_s = opened.timing.forwarded_at - journey.started
    headers = {**call.client_headers, REGION: journey.region, SERVER_TIMING: opened.timing.header(edge_s)}
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return UnaryReply(answer, headers)


# --- streams -------------------------------------------------------------------------------------------


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


def _start_stream(journey: Journey) -> StreamReply:
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None
    up = state.config.upstream
    client = web.StreamResponse(headers={**sse.HEADERS, **call.client_headers})
    limits = StreamLimits(up.max_event_bytes, _response_budget(journey), admission.max_tokens)
    stream = StreamReply(journey, SseRelay(journey.request, client, limits, echo=call.echo))
    watchdog = StreamWatchdog(
        stream.relay,
        up.heartbeat_s,
        state.config.server.write_timeout_s,
        up.idle_timeout_s,
        stream.commit,
        stream.cut_off,
    )
    watchdog.start()
    journey.stream = stream
    journey.cleanups.append(watchdog.stop)
    return stream


async def _relay_stream(journey: Journey, stream: StreamReply) -> Reply:
    state, opened = journey.state, journey.opened
    assert opened is not None
    relay = stream.relay
    try:
        upstream = opened.response
        if upstream.status != 200:
            error, refused = await read_refusal(upstream)
            return _failed_before_first_byte(journey, stream, error, refused)
        if upstream.content_type != "text/event-stream":
            fault = UpstreamFault.bad(f"the region answered a stream with {upstream.content_type!r}")
            return _failed_before_first_byte(journey, stream, fault.error)
        await stream.commit(opened)
        outcome = await relay.relay(upstream)
        if relay.first_write_at:
            state.metrics.ttft.observe(relay.first_write_at - journey.started)
        if may_continue(journey, outcome):
            timeout_s = state.config.upstream.first_byte_timeout_s
            resumed = await open_continuation(journey, opened, outcome, timeout_s)
            if resumed is not None:
                journey.continued_from, journey.region = journey.region, resumed.upstream.replica.region
                journey.opened = opened = resumed
                journey.cleanups.append(_release(journey, resumed))
                first_events = outcome.content_events
                relay.resume()
                outcome = await relay.relay(resumed.response)
                combine_usage(outcome, first_events, journey.bounds.prompt_ceiling)
                state.metrics.continued.labels(journey.continued_from, journey.region).inc()
        if outcome.failure is not None:
            journey.failed(outcome.failure)
            stream.failure = outcome.failure
        else:
            journey.answered(outcome.usage)
            journey.answer_text, journey.finish_reason = "".join(outcome.text), outcome.finish_reason
        return stream
    except (ConnectionError, TimeoutError):
        # The client stopped reading (write timeout) or its socket broke: it is cut off, billed what it got.
        journey.left()
        stream.cut = True
        state.in_background(state.pool.replenish(opened.upstream))
        return stream
    except asyncio.CancelledError:
        # The client left: leaving the block above closed the upstream request, so the region aborts.
        state.in_background(state.pool.replenish(opened.upstream))
        raise
    finally:
        outcome = relay.outcome
        journey.relayed_events = outcome.content_events
        journey.produced = journey.produced or outcome.content_events > 0
        if journey.usage is None:
            journey.usage = outcome.usage
