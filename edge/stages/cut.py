"""The cut stage (after admission, before the cache): decide once whether the request's model is cut off
from its remote regions (every remote replica down or ejected by the probes), and the degraded tier's
policy for it (edge/degraded_policy.py: by key tier and model). The stages after it read the record
(``journey.cut``); what the degraded tier answers with is in :mod:`edge.degraded`."""

from __future__ import annotations

import time

from edge.client_route import client_where
from edge.journey import Cut, Journey, Reply
from nearshore.protocol.schemas import EmbeddingRequest


async def cut_stage(journey: Journey) -> Reply | None:
    state, body, key = journey.state, journey.body, journey.key
    tier = state.degraded
    if tier is None:
        return None  # no local region: nothing to degrade to
    assert body is not None and key is not None
    policy = tier.policy(key.tier, body.model, journey.sizing.alias, key.substitute)
    where = client_where(journey, state.locator)
    out = state.pool.router.cut_off(body.model, where, key.tenant, time.monotonic())
    stand_in = policy.stand_in
    if isinstance(body, EmbeddingRequest) or not key.allows(stand_in):
        stand_in = ""  # a vector has no stand-in; a key kept to its models is kept to them in a cut too
    journey.cut = Cut(body.model in tier.remote_models, out, policy.share_local, stand_in)
    return None
