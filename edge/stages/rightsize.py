"""The rightsize stage: a request for a size alias (``auto``) gets the small or the large model
(:mod:`geo.rightsize`) before admission prices and reserves it; the choice is in ``x-nearshore-model``."""

from __future__ import annotations

import msgspec

from edge.journey import Journey, Reply, Sizing
from geo.rightsize import choose
from nearshore.protocol.errors import PERMISSION_DENIED, ApiError
from nearshore.protocol.headers import SIZE_HINT
from nearshore.protocol.schemas import ChatCompletionRequest


async def rightsize_stage(journey: Journey) -> Reply | None:
    state, body, key = journey.state, journey.body, journey.key
    assert body is not None and key is not None
    alias = state.aliases.get(body.model)
    if alias is None:
        return None
    counter = state.counter
    if isinstance(body, ChatCompletionRequest):
        prompt_tokens = await counter.chat_tokens(
            body.messages, continue_final=body.continue_final_message, owner=key.key_id
        )
    else:
        prompt_tokens = await counter.text_tokens(body.prompt_text(), owner=key.key_id)
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
