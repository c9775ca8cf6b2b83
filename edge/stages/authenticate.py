"""The authenticate stage: the request's API key (edge/admission.py: bearer or x-api-key, known, not
revoked, not expired), or a 401; a key its RPM refused moments ago is refused again (429) until that
refusal's retry time, before its body is read."""

from __future__ import annotations

from edge.admission import authenticate, refuse_if_standing
from edge.journey import Journey, Reply


async def authenticate_stage(journey: Journey) -> Reply | None:
    journey.key = authenticate(journey.request, journey.state)
    refuse_if_standing(journey.state, journey.key)
    return None
