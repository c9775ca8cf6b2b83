"""The rightsize stage: a request for a size alias (``auto``) gets the small or the large model
(:mod:`geo.rightsize`) before admission prices and reserves it; the choice is in ``x-nearshore-model``."""

from __future__ import annotations

import msgspec

from edge.admission import count_prompt
from edge.journey import Journey, Reply, Sizing
from geo.rightsize import choose
from nearshore.protocol.errors import PERMISSION_DENIED, ApiError
from nearshore.protocol.headers import SIZE_HINT


async def rightsize_stage(journey: Journey) -> Reply | None:
    state, body, key = journey.state, journey.body, journey.key
    assert body is not None and key is not None
    alias = state.aliases.get(body.model)
    if alias is None:
        return None
    # Counted as admission prices it (tool definitions too), and once: admit reuses the count.
    journey.prompt_count = counted = await count_prompt(state, key, body)
    prompt_tokens = min(counted.estimate, counted.ceiling)
    max_tokens = body.token_limit() or state.config.default_max_tokens
    hint = journey.request.headers.get(SIZE_HINT, "").strip().lower()
    model, why = choose(alias, prompt_tokens, max_tokens, key.tier, hint)
    if not key.allows(model):
        raise ApiError(
            PERMISSION_DENIED,
            f"This API key may not use `{model}`, which `{alias.name}` chose ({why}).",
            param="model",
        )
    journey.body = msgspec.structs.replace(body, model=model)
    other = alias.small if model == alias.large else alias.large
    # The large pool down: the small one answers (and back).
    other_size = other if other != model and key.allows(other) else ""
    journey.sizing = Sizing(f"{model}; alias={alias.name}; {why}", other_size, alias.name)
    return None
