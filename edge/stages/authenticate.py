"""The authenticate stage: the request's API key (edge/admission.py: bearer or x-api-key, known, not
revoked, not expired), or a 401."""

from __future__ import annotations

from edge.admission import authenticate
from edge.journey import Journey, Reply


async def authenticate_stage(journey: Journey) -> Reply | None:
    journey.key = authenticate(journey.request, journey.state)
    return None
