"""The relay stage: bring the answer the forward stage opened to the client, and record how it ended.

A unary answer is read with its bounds and checked; one whose body fails after its head is not the client's
answer yet, so another replica or fallback is asked (:mod:`edge.asking`). A stream is copied event by event
as it arrives, by its owner (:class:`edge.stream_reply.StreamReply`) on the request's clock; one that its
region ended with a failure is reported as cut short (``stream.cut_short``: what the client has, who failed
it) and the continue stage (:mod:`edge.stages.continuation`) takes it from there. The reply's ``finish``
sends the last part once the journey is billed. What reached the client is ``journey.relayed``: the
stream itself, or a unary answer's :class:`~edge.journey.Relayed` record, with an answer that arrived whole
as a :class:`~edge.journey.WholeAnswer` (what the store stage keeps).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from aiohttp import web

from edge.answer_size import response_budget
from edge.asking import ask_again
from edge.h1 import Response
from edge.journey import AS_IS, Dialect, Journey, Relayed, Reply, WholeAnswer
from edge.provider import named
from edge.region_answer import (
    MAX_TOKEN_TEXT_BYTES,
    Answer,
    UpstreamFault,
    check_answer,
    check_embeddings,
    read_bounded,
    read_refusal,
    with_usage,
)
from edge.stream_reply import CutShort, StreamReply, failed_before_first_byte
from edge.upstream import Upstream
from edge.usage_audit import AuditedUsage, Delivered
from nearshore.protocol.headers import REGION, SERVER_TIMING
from nearshore.protocol.schemas import CompletionRequest, EmbeddingRequest


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
    dialect: Dialect = AS_IS

    async def finish(self, audited: AuditedUsage | None) -> web.Response:
        body = self.answer.body
        if audited is not None and (audited.anomalies or not audited.reported):  # the figure billed
            body = with_usage(body, audited.usage)
        body = await self.dialect.whole(body)
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
    journey.answered()
    journey.relayed = Relayed(
        # (an embeddings answer has no texts: its usage is prompt tokens only)
        delivered=await _delivered(journey, answer.texts) if answer.texts else None,
        answer=WholeAnswer(answer.text, answer.finish_reason),
        usage=answer.usage,
        produced=True,
    )
    edge_s = opened.timing.forwarded_at - journey.started
    call = journey.call  # as the forward stage left it: a fallback that answered names itself
    headers = {
        **call.client_headers,
        REGION: journey.forwarded.region,
        SERVER_TIMING: opened.timing.header(edge_s),
    }
    state.metrics.e2e.observe(time.perf_counter() - journey.started)
    if opened.upstream.provider is not None:  # the client is told the edge's name, not the provider's id
        answer = dataclasses.replace(answer, body=named(answer.body, opened.model))
    return UnaryReply(answer, headers, journey.dialect)


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


async def _delivered(journey: Journey, texts: tuple[str, ...]) -> Delivered:
    """The answer's text as the client gets it, in completion tokens: counted as the edge counts prompts
    (edge/token_count.py), and the fewest it can be. An echoed prompt is not the answer's."""
    body, counter = journey.body, journey.state.counter
    echoed = body.prompt_text() if isinstance(body, CompletionRequest) and body.echo else ""
    answers = [t.removeprefix(echoed) for t in texts]
    floor = sum(math.ceil(len(t.encode()) / MAX_TOKEN_TEXT_BYTES) for t in answers)
    owner = journey.key.key_id if journey.key is not None else ""
    tokens = sum([await counter.text_tokens(t, owner=owner) for t in answers if t])
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
        outcome = await stream.relay_from(opened)
        if stream.first_write_at:
            journey.state.metrics.ttft.observe(stream.first_write_at - journey.started)
        if outcome.failure is not None:  # cut: the continue stage decides whether another region goes on
            stream.cut_short = CutShort(opened, outcome, (opened.upstream,))
            return None
        return stream.end(outcome)

    return await stream.guarded(first)
