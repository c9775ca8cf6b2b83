"""Asking the regions for one request: its model's replicas, then its fallbacks (edge/attempts.py), all
within the request's attempts and deadline, leaving out the replicas that already failed it.

The local stand-in (edge/degraded.py) comes after the fallbacks, when the request may have it. The forward
stage asks first; a unary answer whose body failed after its head, and a stream that failed before its first
token, ask again here: nothing reached the client, so any replica or fallback may answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from edge.attempts import Attempts, Target
from edge.degraded import stand_ins
from edge.fallbacks import context_models, fallback_models, targets
from edge.journey import Journey
from edge.opened import Opened
from edge.upstream import Upstream
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
