"""Asking the regions for one request: its model's replicas, then its fallbacks (edge/attempts.py), all
within the request's attempts and deadline, leaving out the replicas that already failed it; and taking
the answer that came (its region, its model) on the journey, released at the journey's exit.

The local stand-in (edge/degraded.py) comes after the fallbacks, when the request may have it. The forward
stage asks first; a unary answer whose body failed after its head (the relay stage), and a stream that
failed before its first token (the continue stage), ask again here: nothing reached the client, so any
replica or fallback may answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from edge.attempts import Attempts, Refused, Target
from edge.degraded import answered_locally, stand_ins
from edge.fallbacks import context_models, fallback_models, targets
from edge.journey import Journey
from edge.opened import Opened
from edge.region_answer import UpstreamFault
from edge.stream_reply import StreamReply
from edge.upstream import Upstream
from nearshore.protocol.errors import ApiError
from nearshore.protocol.headers import MODEL

log = logging.getLogger("nearshore.edge.asking")


async def ask_regions(
    journey: Journey, timeout_s: float, tried: Sequence[Upstream] = (), chain: list[str] | None = None
) -> Opened:
    """The first answer head from the request's model or its fallbacks (:class:`Refused` for a 4xx the
    client gets; :class:`ApiError` when none answered). ``tried`` are not asked again."""
    state, call, admission, body = journey.state, journey.call, journey.admission, journey.body
    forwarded, routed = journey.forwarded, journey.routed
    assert call is not None and admission is not None and body is not None and forwarded.deadline is not None
    chain = fallback_models(journey) if chain is None else chain

    def untried(found: list[Target]) -> list[Target]:
        for target in found:
            target.upstreams = [u for u in target.upstreams if u not in tried]
        return found

    order = [] if routed.unrouted else state.pool.ordered(routed.route)
    first = Target(body.model, [u for u in order if u not in tried], call.body, routed.unrouted)
    attempts = Attempts(
        state.pool,
        state.config.upstream,
        state.metrics,
        forwarded.deadline,
        admission.prompt_estimate,
        choices=admission.choices,
        first_byte=forwarded.first_byte,
        request_id=journey.request_id,
        tenant=journey.tenant,
    )
    attempts.made = forwarded.attempts  # max_attempts bounds the request, however many times it asks
    try:
        return await attempts.open(
            first,
            lambda: untried(targets(journey, chain) + stand_ins(journey, chain)),
            lambda: untried(targets(journey, context_models(journey))),
            call.path,
            call.headers,
            timeout_s,
            reserved=1 if chain else 0,  # the model's replicas leave its fallbacks their turn
        )
    finally:
        forwarded.attempts = attempts.made


def fell_back(journey: Journey, model: str) -> None:
    """A fallback model serves the request: the answer, its headers and its bill name it."""
    assert journey.body is not None and journey.call is not None
    journey.forwarded.served_model = model
    journey.call = journey.call.with_client_header(MODEL, model)
    journey.state.metrics.fallbacks.labels(journey.body.model, model).inc()
    log.info("request %s: %s could not answer; %s does", journey.request_id, journey.body.model, model)


def take(journey: Journey, opened: Opened) -> None:
    """``opened`` answers the request (its region, its model) and is released at the journey's exit."""
    assert journey.body is not None and journey.call is not None
    forwarded = journey.forwarded
    forwarded.opened, forwarded.region = opened, opened.upstream.replica.region
    if opened.model != journey.body.model:
        fell_back(journey, opened.model)
        if isinstance(forwarded.stream, StreamReply):
            forwarded.stream.head(MODEL, opened.model)
    elif forwarded.served_model:  # asked again, the model itself answered after a fallback had failed
        forwarded.served_model = ""
        journey.call = journey.call.without_client_header(MODEL)
    answered_locally(journey, opened)  # the degraded tier, if the remote regions could not
    journey.cleanups.append(_release(journey, opened))


async def ask_again(journey: Journey, tried: Sequence[Upstream], fault: UpstreamFault) -> bool:
    """Ask the replicas and fallbacks not ``tried`` for the unary answer whose body failed; whether one
    answered (then it is taken on the journey)."""
    log.warning(
        "request %s: %s's answer failed (%s); asking again",
        journey.request_id,
        journey.forwarded.region,
        fault,
    )
    try:
        opened = await ask_regions(journey, head_timeout_s(journey), tried)
    except Refused as refused:
        refused.release()
        return False
    except ApiError:
        return False
    take(journey, opened)
    return True


def head_timeout_s(journey: Journey) -> float:
    """How long a replica may take to its answer's head: a stream's is its first token; a unary answer's
    first byte is its whole answer, so it also gets time for the tokens it may have to generate."""
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None and body is not None
    if body.stream:
        return up.ttft_timeout_s
    return up.ttft_timeout_s + up.unary_timeout_per_token_s * admission.max_tokens


def _release(journey: Journey, opened: Opened) -> Callable[[], Awaitable[None]]:
    async def release() -> None:
        opened.release()  # pooled again if read to its end; else the connection is dropped
        if journey.outcome.status == "ok" and journey.forwarded.opened is opened:  # not one that died
            _teach_router(journey, opened)

    return release


def _teach_router(journey: Journey, opened: Opened) -> None:
    """How long the answer took, and in how many tokens: a stream's teaches the replica's decode speed, a
    unary answer's (its head came when it was whole) its queue, as a stream's first token does."""
    timing = opened.timing  # counted from when the replica began on it (UpstreamTiming.began_at)
    service_ms = (time.perf_counter() - timing.began_at) * 1000
    relayed, stream, admission = journey.relayed, journey.forwarded.stream, journey.admission
    prompt_tokens = admission.prompt_estimate if admission is not None else 0
    router, replica = journey.state.pool.router, opened.upstream.replica
    if isinstance(stream, StreamReply):
        first_write = stream.first_write_at
        if journey.continued.count or not first_write or not relayed.events:
            router.finished(replica, service_ms)  # a continuation's first token is not its own
            return
        first_ms = (first_write - timing.began_at) * 1000
        router.finished(replica, service_ms, relayed.events, first_ms)
        return
    tokens = relayed.delivered.tokens if relayed.delivered is not None else 0
    router.finished(
        replica, timing.replica_first_byte_s * 1000, tokens, None, prompt_tokens, source=journey.tenant
    )
