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
import logging
import math
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edge.answer import (
    MAX_TOKEN_TEXT_BYTES,
    Answer,
    UpstreamFault,
    check_answer,
    check_embeddings,
    read_bounded,
    read_refusal,
    with_usage,
)
from edge.asking import ask_regions, fell_back
from edge.attempts import Refused, release_refused
from edge.fallbacks import fallback_models
from edge.h1 import Response
from edge.journey import Journey, Preempting, Reply
from edge.relay import Opened, SseRelay, StreamClock, StreamLimits, StreamOutcome, StreamWatchdog
from edge.resume import combine_usage, may_continue, open_continuation
from edge.retry import Deadline
from edge.upstream import Upstream
from edge.usage_audit import AuditedUsage, Delivered
from nearshore.protocol import sse
from nearshore.protocol.errors import EXCEEDS_LIMIT, ApiError
from nearshore.protocol.headers import MODEL, REGION, SERVER_TIMING
from nearshore.protocol.schemas import CompletionRequest, EmbeddingRequest

log = logging.getLogger("nearshore.edge.forward")

# The most bytes one log-probability alternative takes in JSON (chat's shape: name, logprob, bytes list).
LOGPROB_ALTERNATIVE_BYTES = 160
# An embedding's numbers in JSON ("-0.012345678901234567," at most) or base64 (4 bytes as 5.33), its object's
# own keys, and the dimensions assumed for a model the config does not list.
JSON_NUMBER_BYTES = 26
BASE64_NUMBER_BYTES = 6
VECTOR_OVERHEAD_BYTES = 256
DEFAULT_DIMENSIONS = 4096


def _response_budget(journey: Journey) -> int:
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None
    if isinstance(body, EmbeddingRequest):
        # One vector per input, of the model's dimensions: the bound follows from the request.
        dims = up.embedding_dimensions.get(journey.model) or body.dimensions or DEFAULT_DIMENSIONS
        per_number = BASE64_NUMBER_BYTES if body.encoding_format == "base64" else JSON_NUMBER_BYTES
        return up.response_base_bytes + len(body.texts()) * (VECTOR_OVERHEAD_BYTES + dims * per_number)
    per_token, tokens = up.response_bytes_per_token, admission.max_tokens
    if (alternatives := body.top_logprobs_asked()) is not None:
        # Each scored token carries its alternatives; with echo, every prompt token is scored too.
        per_token += LOGPROB_ALTERNATIVE_BYTES * (alternatives + 1)
        if isinstance(body, CompletionRequest) and body.echo:
            tokens += admission.prompt_ceiling
    return up.response_base_bytes + per_token * tokens


async def forward(journey: Journey) -> Reply | None:
    state, call, admission, body = journey.state, journey.call, journey.admission, journey.body
    assert call is not None and admission is not None and body is not None
    up = state.config.upstream
    since_arrival = time.perf_counter() - journey.started
    journey.deadline = Deadline.after(up.request_deadline_s - since_arrival)
    if isinstance(body, EmbeddingRequest) and (size := _response_budget(journey)) > up.max_embeddings_bytes:
        raise ApiError(
            EXCEEDS_LIMIT,
            f"The answer to this request may take {size} bytes, more than this edge relays "
            f"({up.max_embeddings_bytes}): send fewer inputs per request.",
            param="input",
        )
    chain = fallback_models(journey)
    stream = _start_stream(journey) if body.stream else None
    state.metrics.overhead.observe(time.perf_counter() - journey.started)
    opening = ask_regions(journey, _head_timeout_s(journey), chain=chain)
    try:
        if journey.preempt is None:
            opened = await opening
        else:
            raced = await _race(journey.preempt, opening)
            if not isinstance(raced, Opened):
                return raced  # the other stage's answer came first: the region's request is cancelled
            opened = raced
    except Refused as refused:
        journey.region = refused.opened.upstream.replica.region
        release_refused(refused)
        return _failed_before_first_byte(journey, stream, refused.error, refused.passed_on)
    except ApiError as exc:
        return _failed_before_first_byte(journey, stream, exc)
    opened.timing.route_s, opened.timing.queue_s = journey.route_s, journey.queue_s
    _taken(journey, opened)
    return None


def _taken(journey: Journey, opened: Opened) -> None:
    """``opened`` answers the request (its region, its model) and is released at the journey's exit."""
    assert journey.body is not None and journey.call is not None
    journey.opened, journey.region = opened, opened.upstream.replica.region
    if opened.model != journey.body.model:
        fell_back(journey, opened.model)
        if isinstance(journey.stream, StreamReply) and not journey.stream.client.prepared:
            journey.stream.client.headers[MODEL] = opened.model  # (after a heartbeat: in its chunks only)
    elif journey.served_model:  # asked again, the model itself answered after a fallback had failed
        journey.served_model = ""
        journey.call.client_headers.pop(MODEL, None)
    journey.cleanups.append(_release(journey, opened))


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
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            if isinstance(exc, Refused):
                release_refused(exc)
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
    """The region's whole answer, checked. One whose body fails after its head (late, cut, not the
    answer's shape) is not the client's answer yet: another replica or fallback is asked, within the
    request's attempts and deadline."""
    state, admission, call = journey.state, journey.admission, journey.call
    assert admission is not None and call is not None and journey.deadline is not None
    tried: list[Upstream] = []
    while True:
        opened = journey.opened
        assert opened is not None
        upstream = opened.response
        if upstream.status != 200:
            error, refused = await read_refusal(upstream)
            return _failed_before_first_byte(journey, None, error, refused)
        try:
            answer = await _checked_unary(journey, upstream)
            break
        except UpstreamFault as fault:
            tried.append(opened.upstream)
            state.pool.failed(opened.upstream, f"its answer: {fault.error.message}"[:300])
            if not await _ask_again(journey, tried, fault):
                return _failed_before_first_byte(journey, None, fault.error)
    journey.answered(answer.usage)
    journey.answer_text, journey.finish_reason = answer.text, answer.finish_reason
    if answer.texts:  # (an embeddings answer has none: its usage is prompt tokens only)
        journey.delivered = _delivered(journey, answer.texts)
    edge_s = opened.timing.forwarded_at - journey.started
    headers = {**call.client_headers, REGION: journey.region, SERVER_TIMING: opened.timing.header(edge_s)}
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return UnaryReply(answer, headers)


async def _checked_unary(journey: Journey, upstream: Response) -> Answer:
    up, admission, call = journey.state.config.upstream, journey.admission, journey.call
    assert admission is not None and call is not None and journey.deadline is not None
    budget = _response_budget(journey)
    # An embeddings answer's bound is its own (checked against max_embeddings_bytes before sending).
    max_bytes = budget if isinstance(journey.body, EmbeddingRequest) else min(up.max_unary_bytes, budget)
    body = await read_bounded(upstream, max_bytes, journey.deadline.cap(up.stall_timeout_s) or 0.001)
    # No tokenizer spells a token in more bytes than this; completions with echo carry the prompt too.
    max_text = admission.max_tokens * MAX_TOKEN_TEXT_BYTES + (admission.prompt_ceiling if call.echo else 0)
    if isinstance(journey.body, EmbeddingRequest):
        return check_embeddings(upstream, body, len(journey.body.texts()))
    return check_answer(journey.kind, upstream, body, max_text)


def _delivered(journey: Journey, texts: tuple[str, ...]) -> Delivered:
    """The answer's text as the client gets it, in completion tokens: counted as the edge counts prompts
    (edge/token_count.py), and the fewest it can be. An echoed prompt is not the answer's."""
    body, counter = journey.body, journey.state.counter
    echoed = body.prompt_text() if isinstance(body, CompletionRequest) and body.echo else ""
    answers = [t.removeprefix(echoed) for t in texts]
    floor = sum(math.ceil(len(t.encode()) / MAX_TOKEN_TEXT_BYTES) for t in answers)
    tokens = sum(counter.count_text(t) for t in answers if t)
    return Delivered(max(tokens, floor), floor)


def _head_timeout_s(journey: Journey) -> float:
    """How long a replica may take to its answer's head: a stream's is its first token; a unary answer's
    first byte is its whole answer, so it also gets time for the tokens it may have to generate."""
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None and body is not None
    if body.stream:
        return up.ttft_timeout_s
    return up.ttft_timeout_s + up.unary_timeout_per_token_s * admission.max_tokens


async def _ask_again(journey: Journey, tried: list[Upstream], fault: UpstreamFault) -> bool:
    """Ask the replicas and fallbacks not ``tried`` for the unary answer; whether one answered."""
    log.warning(
        "request %s: %s's answer failed (%s); asking again", journey.request_id, journey.region, fault
    )
    try:
        opened = await ask_regions(journey, _head_timeout_s(journey), tried)
    except Refused as refused:
        release_refused(refused)
        return False
    except ApiError:
        return False
    _taken(journey, opened)
    return True


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


async def _relayed(journey: Journey, relay: SseRelay, opened: Opened) -> StreamOutcome:
    """Relay ``opened``'s stream on the request's clock: its first token within ttft_timeout_s of asking
    it, then no stall longer than stall_timeout_s, all before the deadline."""
    up = journey.state.config.upstream
    assert journey.deadline is not None
    asked_at = time.monotonic() - (time.perf_counter() - opened.timing.forwarded_at)
    relay.clock = StreamClock(
        asked_at + up.ttft_timeout_s, up.stall_timeout_s, journey.deadline.at, up.ttft_timeout_s
    )
    return await relay.relay(opened.response)


def _count_bad_events(journey: Journey, outcome: StreamOutcome) -> None:
    journey.bad_events = outcome.bad_events
    journey.state.metrics.bad_events.labels(journey.region or "none").inc(outcome.bad_events)
    log.warning(
        "request %s: %s sent %d stream events that do not parse (skipped)",
        journey.request_id,
        journey.region,
        outcome.bad_events,
    )


def _start_stream(journey: Journey) -> StreamReply:
    state, call, admission = journey.state, journey.call, journey.admission
    assert call is not None and admission is not None
    up = state.config.upstream
    client = web.StreamResponse(headers={**sse.HEADERS, **call.client_headers})
    limits = StreamLimits(
        up.max_event_bytes, _response_budget(journey), admission.max_tokens, up.max_bad_events
    )
    stream = StreamReply(journey, SseRelay(journey.request, client, limits, echo=call.echo))
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
        outcome = await _relayed(journey, relay, opened)
        if relay.first_write_at:
            state.metrics.ttft.observe(relay.first_write_at - journey.started)
        failed = [opened.upstream]
        while may_continue(journey, outcome):
            resumed = await open_continuation(journey, opened, outcome, failed)
            if resumed is None:
                break
            journey.continuations += 1
            journey.continued_from = journey.region
            _taken(journey, resumed)
            opened = resumed
            failed.append(resumed.upstream)
            first_events = outcome.content_events
            relay.resume()
            outcome = await _relayed(journey, relay, resumed)
            combine_usage(outcome, first_events, journey.bounds.prompt_ceiling)
            state.metrics.continued.labels(journey.continued_from, journey.region).inc()
        if outcome.bad_events:
            _count_bad_events(journey, outcome)
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
