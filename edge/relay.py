"""The relay stage: bring the answer the forward stage opened to the client, and record how it ended.

A unary answer is read with its bounds and checked; one whose body fails after its head is not the client's
answer yet, so the forward stage asks another replica or fallback. A stream is copied event by event as it
arrives (:class:`edge.sse_relay.SseRelay`) on the request's clock; one that its region ended with a
failure is reported as cut (``journey.relayed.cut``: what the client has, who failed it) and the continue
stage (:mod:`edge.resume`) takes it from there. The reply's ``finish`` sends the last part once the
journey is billed. What reached the client is noted on ``journey.relayed``, an answer that arrived whole
as a :class:`~edge.journey.WholeAnswer` (what the response cache stores).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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
from edge.forward import ask_again
from edge.h1 import Response
from edge.journey import CutShort, Journey, Reply, WholeAnswer
from edge.opened import Opened
from edge.response_budget import response_budget
from edge.retry import stall_window
from edge.sse_relay import SseRelay, StreamClock, StreamOutcome
from edge.stream_reply import StreamReply, failed_before_first_byte
from edge.upstream import Upstream
from edge.usage_audit import AuditedUsage, Delivered
from nearshore.protocol.headers import REGION, SERVER_TIMING
from nearshore.protocol.schemas import CompletionRequest, EmbeddingRequest

# Its lines kept the logger they had when the relay lived in edge/forward.py.
log = logging.getLogger("nearshore.edge.forward")

Step = Callable[[], Awaitable[Reply | None]]


async def relay(journey: Journey) -> Reply | None:
    stream = journey.forwarded.stream
    if isinstance(stream, StreamReply):
        return await _relay_stream(journey, stream)
    return await _read_unary(journey)


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
    state, admission = journey.state, journey.admission
    assert admission is not None and journey.call is not None and journey.forwarded.deadline is not None
    tried: list[Upstream] = []
    while True:
        opened = journey.forwarded.opened
        assert opened is not None
        upstream = opened.response
        if upstream.status != 200:
            error, refused = await read_refusal(upstream)
            return failed_before_first_byte(journey, None, error, refused)
        try:
            answer = await _checked_unary(journey, upstream)
            break
        except UpstreamFault as fault:
            tried.append(opened.upstream)
            state.pool.failed(opened.upstream, f"its answer: {fault.error.message}"[:300], opened.model)
            if not await ask_again(journey, tried, fault):
                return failed_before_first_byte(journey, None, fault.error)
    journey.answered(answer.usage)
    journey.relayed.answer = WholeAnswer(answer.text, answer.finish_reason)
    if answer.texts:  # (an embeddings answer has none: its usage is prompt tokens only)
        journey.relayed.delivered = _delivered(journey, answer.texts)
    edge_s = opened.timing.forwarded_at - journey.started
    call = journey.call  # as the forward stage left it: a fallback that answered names itself
    headers = {
        **call.client_headers,
        REGION: journey.forwarded.region,
        SERVER_TIMING: opened.timing.header(edge_s),
    }
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    return UnaryReply(answer, headers)


async def _checked_unary(journey: Journey, upstream: Response) -> Answer:
    up, admission, call = journey.state.config.upstream, journey.admission, journey.call
    deadline = journey.forwarded.deadline
    assert admission is not None and call is not None and deadline is not None
    budget = response_budget(journey)
    # An embeddings answer's bound is its own (checked against max_embeddings_bytes before sending).
    max_bytes = budget if isinstance(journey.body, EmbeddingRequest) else min(up.max_unary_bytes, budget)
    body = await read_bounded(upstream, max_bytes, deadline.cap(up.stall_timeout_s) or 0.001)
    # No tokenizer spells a token in more bytes than this; completions with echo carry the prompt too.
    max_text = admission.completion_tokens * MAX_TOKEN_TEXT_BYTES + (
        admission.prompt_ceiling if call.echo else 0
    )
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


# --- streams -------------------------------------------------------------------------------------------


async def _relay_stream(journey: Journey, stream: StreamReply) -> Reply | None:
    opened = journey.forwarded.opened
    assert opened is not None

    async def first() -> Reply | None:
        upstream = opened.response
        if upstream.status != 200:
            error, refused = await read_refusal(upstream)
            return failed_before_first_byte(journey, stream, error, refused)
        if upstream.content_type != "text/event-stream":
            fault = UpstreamFault.bad(f"the region answered a stream with {upstream.content_type!r}")
            return failed_before_first_byte(journey, stream, fault.error)
        await stream.commit(opened)
        outcome = await relay_from(journey, stream.relay, opened)
        if stream.relay.first_write_at:
            journey.state.metrics.ttft.observe(stream.relay.first_write_at - journey.started)
        if outcome.failure is not None:  # cut: the continue stage decides whether another region goes on
            journey.relayed.cut = CutShort(opened, outcome, (opened.upstream,))
            return None
        return end_stream(journey, stream, outcome)

    return await relay_guarded(journey, stream, first)


async def relay_from(journey: Journey, relay: SseRelay, opened: Opened) -> StreamOutcome:
    """Relay ``opened``'s stream on the request's clock: its first token within ttft_timeout_s of asking
    it and within the request's first-byte budget, then no silence longer than the stall window (the stall
    timeout, or what the stalls that cut this stream before left of the stall budget), all before the
    deadline. A continuation's first token is a silence of the stream the client has: the window bounds
    it."""
    up, forwarded = journey.state.config.upstream, journey.forwarded
    assert forwarded.deadline is not None
    asked_at = time.monotonic() - (time.perf_counter() - opened.timing.forwarded_at)
    first_s = forwarded.first_byte.limit(opened.model, up.ttft_timeout_s, now=asked_at)
    window_s = stall_window(up.stall_timeout_s, up.stall_budget_s, journey.continued.stalled_s)
    relay.clock = StreamClock(asked_at + first_s, window_s, forwarded.deadline.at, first_s)
    return await relay.relay(opened.response)


async def relay_guarded(journey: Journey, stream: StreamReply, step: Step) -> Reply | None:
    """Run ``step``, which relays ``stream``, as the client may break it. Unless the step hands the stream
    on (None: the continue stage takes it), what was relayed is noted on the journey however it ends."""
    state = journey.state
    handed_on = False
    try:
        reply = await step()
        handed_on = reply is None
        return reply
    except (ConnectionError, TimeoutError):
        # The client stopped reading (write timeout) or its socket broke: it is cut off, billed what it got.
        journey.left()
        stream.cut = True
        state.in_background(state.pool.replenish(_answering(journey)))
        return stream
    except asyncio.CancelledError:
        # The client left: leaving the relay closed the upstream request, so the region aborts.
        state.in_background(state.pool.replenish(_answering(journey)))
        raise
    finally:
        if not handed_on:
            _note_relayed(journey, stream.relay.outcome)


def end_stream(journey: Journey, stream: StreamReply, outcome: StreamOutcome) -> Reply:
    """Record how the stream ended: answered (its text whole), or failed (an error event tells the client)."""
    if outcome.bad_events:
        _count_bad_events(journey, outcome)
    if outcome.failure is not None:
        journey.failed(outcome.failure)
        stream.failure = outcome.failure
    else:
        journey.answered(outcome.usage)
        journey.relayed.answer = WholeAnswer("".join(outcome.text), outcome.finish_reason)
    return stream


def _answering(journey: Journey) -> Upstream:
    opened = journey.forwarded.opened
    assert opened is not None
    return opened.upstream


def _note_relayed(journey: Journey, outcome: StreamOutcome) -> None:
    journey.relayed.events = outcome.content_events
    recorded = journey.outcome
    recorded.produced = recorded.produced or outcome.content_events > 0
    if recorded.usage is None:
        recorded.usage = outcome.usage


def _count_bad_events(journey: Journey, outcome: StreamOutcome) -> None:
    region = journey.forwarded.region
    journey.relayed.bad_events = outcome.bad_events
    journey.state.metrics.bad_events.labels(region or "none").inc(outcome.bad_events)
    log.warning(
        "request %s: %s sent %d stream events that do not parse (skipped)",
        journey.request_id,
        region,
        outcome.bad_events,
    )
