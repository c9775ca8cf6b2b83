"""The forward stage: choose the region that answers an admitted request and open its answer, with failover
before the first byte.

A stream's client side starts first (its watchdog sends heartbeats while the region prefills), then the
request goes to the first region that answers in time (:mod:`edge.asking`, :mod:`edge.attempts`), racing a
reply an earlier stage handed over (a semantic cache lookup): whichever comes first answers. Errors before
anything reached the client are raised as :class:`ApiError` (or end a committed stream with an error
event). The answer is taken on the journey (its region, its model; :func:`edge.asking.take`) and released
at the journey's exit. In a cut (the cut stage's record) the cache's lookup is awaited before the local
tier is asked, and a request nothing on this side may answer is refused at once (edge/degraded.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from edge.answer_size import response_budget
from edge.asking import ask_regions, head_timeout_s, take
from edge.attempts import Refused
from edge.degraded import cut_off, may_answer
from edge.fallbacks import fallback_models
from edge.journey import Journey, Preempting, Racing, Reply
from edge.opened import Opened
from edge.retry import Deadline, FirstByteBudget
from edge.stream_reply import StreamReply, failed_before_first_byte, start_stream
from nearshore.protocol.errors import EXCEEDS_LIMIT, ApiError
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
    cut = journey.cut.remote_out  # the cut stage's record
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
