"""Fallback chains: the models that answer when a model's own replicas cannot.

A chain comes from the request (``x-nearshore-fallback: model-a,model-b``, for key tiers allowed to name
one, within the models the key and the edge allow), else from the config (``[fallbacks] models``), else,
for a request a size alias sized, the alias's other model (the large pool down: the small one answers). A
context-length refusal goes to ``[fallbacks] context`` instead. Each fallback is routed as the model asked
for would be (residency included) and gets the same request with its own name in ``model``.
"""

from __future__ import annotations

from edge.attempts import Target
from edge.call_body import region_body
from edge.client_route import route_for
from edge.journey import Journey
from geo.route import NoRoute
from nearshore.protocol.errors import INVALID_REQUEST, ApiError
from nearshore.protocol.headers import FALLBACK

_MAX_HEADER_BYTES = 1024


def fallback_models(journey: Journey) -> list[str]:
    """The request's chain: its own (header) if it names one, else the config's for its model."""
    body, key = journey.body, journey.key
    assert body is not None and key is not None
    config = journey.state.config
    header = journey.request.headers.get(FALLBACK)
    if header is None:
        configured = config.fallbacks.models.get(body.model)
        if configured is not None:
            return list(configured)
        other = journey.sizing.other_size
        return [other] if other else []
    tiers = config.fallbacks.header_tiers
    if "*" not in tiers and key.tier not in tiers:
        raise ApiError(
            INVALID_REQUEST, f"This key's tier ({key.tier}) may not name fallbacks.", param=FALLBACK
        )
    if len(header) > _MAX_HEADER_BYTES:
        raise ApiError(INVALID_REQUEST, f"{FALLBACK} is too long.", param=FALLBACK)
    chain: list[str] = []
    for name in (part.strip() for part in header.split(",")):
        if not name or name == body.model or name in chain:
            continue
        if name not in config.models or not key.allows(name):
            raise ApiError(
                INVALID_REQUEST,
                f"{FALLBACK}: the model {name[:64]!r} is not served to this key.",
                param=FALLBACK,
            )
        chain.append(name)
    if len(chain) > config.fallbacks.max_header_models:
        limit = config.fallbacks.max_header_models
        raise ApiError(INVALID_REQUEST, f"{FALLBACK} may name at most {limit} models.", param=FALLBACK)
    return chain


def context_models(journey: Journey) -> list[str]:
    assert journey.body is not None
    return list(journey.state.config.fallbacks.context.get(journey.body.model, ()))


def targets(journey: Journey, models: list[str]) -> list[Target]:
    """Each model routed, with the body its replicas get."""
    body, admission = journey.body, journey.admission
    assert body is not None and admission is not None
    pool = journey.state.pool
    out = []
    for model in models:
        payload = region_body(body, admission.max_tokens, model)
        try:
            out.append(Target(model, pool.ordered(route_for(journey, model)), payload))
        except NoRoute as exc:
            out.append(Target(model, [], payload, why_none=str(exc)))
    return out
