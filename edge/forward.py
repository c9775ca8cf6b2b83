"""The forward stage: choose the region that answers an admitted request and open its answer, with failover
before the first byte.

A stream's client side starts first (its watchdog sends heartbeats while the region prefills), then the
request goes to the first region that answers in time (:mod:`edge.asking`, :mod:`edge.attempts`), racing a
reply an earlier stage handed over (a semantic cache lookup): whichever comes first answers. Errors before
anything reached the client are raised as :class:`ApiError` (or end a committed stream with an error
event). The answer is taken on the journey (its region, its model) and released at the journey's exit;
the relay stage reads it and asks here again when a unary answer fails before it reached the client, and
the continue stage takes each continuation's stream here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from edge.answer import UpstreamFault
from edge.asking import ask_regions, fell_back
from edge.attempts import Refused
from edge.degraded import answered_locally, cut_now, cut_off, may_answer
from edge.fallbacks import fallback_models
from edge.journey import Journey, Preempting, Racing, Reply
from edge.opened import Opened
from edge.response_budget import response_budget
from edge.retry import Deadline, FirstByteBudget
from edge.stream_reply import StreamReply, failed_before_first_byte, start_stream
from edge.upstream import Upstream
from nearshore.protocol.errors import EXCEEDS_LIMIT, ApiError
from nearshore.protocol.headers import MODEL
from nearshore.protocol.schemas import EmbeddingRequest

log = logging.getLogger("nearshore.edge.forward")


async def forward(journey: Journey, racing: Racing | None = None) -> Reply | None:
    state, call, admission, body = journey.state, journey.call, journey.admission, journey.body
    assert call is not None and admission is not None and body is not None
    up = state.config.upstream
    since_arrival = time.perf_counter() - journey.started
    journey.forwarded.deadline = Deadline.after(up.request_deadline_s - since_arrival)
    if isinstance(body, EmbeddingRequest) and (size := response_budget(journey)) > up.max_embeddings_bytes:
        raise ApiError(
            EXCEEDS_LIMIT,
            f"The answer to this request may take {size} bytes, more than this edge relays "
            f"({up.max_embeddings_bytes}): send fewer inputs per request.",
            param="input",
        )
    chain = fallback_models(journey)
    journey.forwarded.chain = tuple(chain)
    journey.forwarded.first_byte = first_byte_budget(journey, bool(chain))
    stream = start_stream(journey) if body.stream else None
    state.metrics.overhead.observe(time.perf_counter() - journey.started)
    cut = cut_now(journey)
    if cut and journey.routed.unrouted and not may_answer(journey, chain):
        opening: Coroutine[Any, Any, Opened] = _refuse(cut_off(journey))  # nothing on this side may answer
    else:
        opening = ask_regions(journey, head_timeout_s(journey), chain=chain)
    start = racing.start if racing is not None else None
    if cut and start is not None:  # the cache first: the local tier only once the lookup missed
        pending = start()
        opening, start = _after(pending, opening), lambda: pending
    try:
        if start is None:
            opened = await opening
        else:
            raced = await _race(start, opening, stream)
            if not isinstance(raced, Opened):
                return raced  # the other stage's answer came first: the region's request is cancelled
            opened = raced
    except Refused as refused:
        journey.forwarded.region = refused.opened.upstream.replica.region
        refused.release()
        return failed_before_first_byte(journey, stream, refused.error, refused.passed_on)
    except ApiError as exc:
        return failed_before_first_byte(journey, stream, exc)
    opened.timing.route_s, opened.timing.queue_s = journey.routed.route_s, journey.gated.queue_s
    take(journey, opened)
    return None


def take(journey: Journey, opened: Opened) -> None:
    """``opened`` answers the request (its region, its model) and is released at the journey's exit."""
    assert journey.body is not None and journey.call is not None
    forwarded = journey.forwarded
    forwarded.opened, forwarded.region = opened, opened.upstream.replica.region
    if opened.model != journey.body.model:
        fell_back(journey, opened.model)
        stream = forwarded.stream
        if isinstance(stream, StreamReply) and not stream.client.prepared:
            stream.client.headers[MODEL] = opened.model  # (after a heartbeat: in its chunks only)
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


def first_byte_budget(journey: Journey, has_chain: bool) -> FirstByteBudget:
    """The request's first-byte budget, from now: upstream.first_byte_budget_s, and never less than one
    ttft_timeout_s (an operator who gave a slow node longer meant it), plus, for a unary answer, the time its
    tokens take; a third of it (at most ttft_timeout_s) kept for the fallback chain."""
    up, body = journey.state.config.upstream, journey.body
    assert body is not None
    budget_s = max(up.first_byte_budget_s, up.ttft_timeout_s)
    generating_s = head_timeout_s(journey) - up.ttft_timeout_s
    reserve_s = min(up.ttft_timeout_s, budget_s / 3) if has_chain else 0.0
    return FirstByteBudget(time.monotonic() + budget_s + generating_s, reserve_s, body.model)


async def _race(
    start: Callable[[], asyncio.Task[Preempting | None]],
    opening: Coroutine[Any, Any, Opened],
    stream: StreamReply | None,
) -> Opened | Reply:
    """The region's answer head, unless the racing reply ``start`` begins first ends with a reply (then the
    region's request is cancelled: its connection closes and the region aborts the work)."""
    upstream = asyncio.ensure_future(opening)
    try:
        # One turn of the loop first: the region's request runs up to its first wait (written on a warm
        # connection, or connecting), so the racing work's CPU never delays it. A miss costs the request
        # nothing; a hit starts a write later (microseconds).
        await asyncio.sleep(0)
        pending = start()
        done, _ = await asyncio.wait({upstream, pending}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client left mid-race: the region's request goes too
        _abandon(upstream)
        raise
    if pending in done and not pending.cancelled() and pending.exception() is None:
        reply = pending.result()
        if reply is not None:
            if not reply.won(upstream, stream.client if stream is not None else None):
                _abandon(upstream)
            return reply
    return await upstream


async def _after(pending: asyncio.Task, opening: Coroutine[Any, Any, Opened]) -> Opened:
    """``opening``, once ``pending`` (the cache's lookup) has ended."""
    try:
        await asyncio.wait({pending})
    except BaseException:
        opening.close()  # never started
        raise
    return await opening


async def _refuse(error: ApiError) -> Opened:
    raise error


def _abandon(upstream: asyncio.Future[Opened]) -> None:
    """Cancel the region's request; one that answered meanwhile is released (its connection, its slot)."""

    def drop(task: asyncio.Future[Opened]) -> None:
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            if isinstance(exc, Refused):
                exc.release()
            return
        task.result().release()

    upstream.add_done_callback(drop)
    upstream.cancel()


def _release(journey: Journey, opened: Opened):
    async def release() -> None:
        opened.release()  # pooled again if read to its end; else the connection is dropped
        if journey.outcome.status == "ok" and journey.forwarded.opened is opened:  # not one that died
            _teach_router(journey, opened)

    return release


def _teach_router(journey: Journey, opened: Opened) -> None:
    """How long the answer took, and in how many tokens: a stream's teaches the replica's decode speed, a
    unary answer's (its head came when it was whole) its queue, as a stream's first token does."""
    service_ms = (time.perf_counter() - opened.timing.forwarded_at) * 1000
    relayed, stream, admission = journey.relayed, journey.forwarded.stream, journey.admission
    prompt_tokens = admission.prompt_estimate if admission is not None else 0
    router, replica = journey.state.pool.router, opened.upstream.replica
    if isinstance(stream, StreamReply):
        first_write = stream.relay.first_write_at
        if journey.continued.count or not first_write or not relayed.events:
            router.finished(replica, service_ms)  # a continuation's first token is not its own
            return
        first_ms = (first_write - opened.timing.forwarded_at) * 1000
        router.finished(replica, service_ms, relayed.events, first_ms)
        return
    tokens = relayed.delivered.tokens if relayed.delivered is not None else 0
    router.finished(replica, opened.timing.first_byte_s * 1000, tokens, None, prompt_tokens)
