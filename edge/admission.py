"""Everything the edge decides before a request leaves: who is asking, is it well formed, may it run now.

API key -> body (schema, size, time) -> model and parameters -> prompt ceiling -> budget hold -> RPM/TPM
reservation. A request that can never fit the key's limits is a 400 (retrying cannot help); one that does not
fit *now* is a 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from aiohttp import web

from edge.journey import Admission, PromptCount
from edge.keys import ApiKey
from edge.limits import Decision, LimiterUnavailable, LimitSpec, rate_limit_headers
from edge.state import EdgeState
from edge.token_count import chat_ceiling, text_ceiling
from nearshore.httpkit import read_json
from nearshore.protocol.checks import check_supported
from nearshore.protocol.errors import (
    EXCEEDS_LIMIT,
    INVALID_API_KEY,
    KEYS_UNAVAILABLE,
    LEDGER_UNAVAILABLE,
    LIMITS_UNAVAILABLE,
    MODEL_NOT_FOUND,
    PERMISSION_DENIED,
    RATE_LIMITED,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PARAMETER,
    ApiError,
)
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from nearshore.protocol.tool_prompt import prompt_messages

Body = ChatCompletionRequest | CompletionRequest

_AUTH_MESSAGES = {
    "missing": "You didn't provide an API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
    "revoked": "This API key has been revoked.",
}


def authenticate(request: web.Request, state: EdgeState) -> ApiKey:
    presented = request.headers.get("x-api-key", "")
    auth = request.headers.get("Authorization", "")
    if auth:
        scheme, _, token = auth.partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    result = state.keys.authenticate(presented)
    if result.reason == "unavailable":
        message = "The edge cannot check API keys right now (its key store is out of reach): retry shortly."
        raise ApiError(KEYS_UNAVAILABLE, message, retry_after_s=5)
    if result.key is None or result.reason != "ok":
        raise ApiError(INVALID_API_KEY, _AUTH_MESSAGES.get(result.reason, "Incorrect API key provided."))
    return result.key


async def read_body(request: web.Request, state: EdgeState, decoder: msgspec.json.Decoder) -> Body:
    if request.content.is_eof():  # the whole body came with the head (most do): nothing to wait for
        return await read_json(request, decoder)
    try:
        async with asyncio.timeout(state.config.server.body_timeout_s):
            return await read_json(request, decoder)
    except TimeoutError:
        raise ApiError(REQUEST_TIMEOUT, "The request body did not arrive in time.") from None


def check_request(state: EdgeState, key: ApiKey, body: Body) -> None:
    if isinstance(body, EmbeddingRequest):
        if body.dimensions is not None:
            message = "dimensions is not supported: no served embedding model can shorten its vectors."
            raise ApiError(UNSUPPORTED_PARAMETER, message, param="dimensions")
    elif body.model in state.aliases:
        return check_supported(body)  # the rightsize stage picks the model and checks the key may use it
    if body.model not in state.config.models:
        raise ApiError(MODEL_NOT_FOUND, f"The model `{body.model}` does not exist.", param="model")
    if not key.allows(body.model):
        raise ApiError(
            PERMISSION_DENIED, f"This API key may not use the model `{body.model}`.", param="model"
        )
    if not isinstance(body, EmbeddingRequest):
        check_supported(body)


async def count_prompt(state: EdgeState, key: ApiKey, body: Body | EmbeddingRequest) -> PromptCount:
    """The prompt's tokens as the region will see them: a chat's tool definitions, calls and answers
    included (the region writes them into the prompt). Long texts are counted on the counter's thread, in
    the key's turn."""
    if isinstance(body, EmbeddingRequest):
        # Word pieces of another tokenizer than the chat model's: no exact count here, the ceiling holds.
        ceiling = sum(text_ceiling(text) for text in body.texts())
        return PromptCount(ceiling, ceiling)
    if isinstance(body, ChatCompletionRequest):
        parallel = body.parallel_tool_calls is not False
        messages = prompt_messages(body.messages, body.tools, body.tool_choice, parallel)
        estimate = await state.counter.chat_tokens(
            messages, continue_final=body.continue_final_message, owner=key.key_id
        )
        return PromptCount(chat_ceiling(messages), estimate)
    text = body.prompt_text()
    return PromptCount(text_ceiling(text), await state.counter.text_tokens(text, owner=key.key_id))


async def admit(
    state: EdgeState, key: ApiKey, body: Body | EmbeddingRequest, counted: PromptCount | None = None
) -> Admission:
    """Hold the request's worst-case cost and reserve its tokens, or raise the refusal; ``counted``: the
    prompt as an earlier stage counted it (else it is counted here)."""
    if not state.ledger.accepting():
        raise ApiError(
            LEDGER_UNAVAILABLE,
            "Usage cannot be recorded right now (the edge's ledger refuses writes), so nothing is served "
            "unbilled; retry shortly.",
            retry_after_s=5,
        )
    counted = counted or await count_prompt(state, key, body)
    ceiling, estimate = counted.ceiling, counted.estimate
    max_tokens = (
        0 if isinstance(body, EmbeddingRequest) else body.token_limit() or state.config.default_max_tokens
    )
    choices = 1 if isinstance(body, EmbeddingRequest) else body.n
    completion = max_tokens * choices  # each choice may use all of max_tokens
    # An exact count cannot be beaten; an estimate can (digits are about a token a byte): reserve the ceiling.
    prompt = min(estimate, ceiling) if state.counter.exact else ceiling
    tokens = prompt + completion
    if key.tpm and tokens > key.tpm:
        raise ApiError(
            EXCEEDS_LIMIT,
            f"This request may need {tokens} tokens ({prompt} for the prompt at most, {completion} for the "
            f"completion), more than this key's limit of {key.tpm} tokens per minute: it can never be "
            "served. Lower max_tokens or shorten the prompt.",
            param="max_tokens",
        )
    try:
        hold = await state.budget.hold(key, state.prices.worst_case(body.model, prompt, completion))
    except LimiterUnavailable:
        raise ApiError(
            LIMITS_UNAVAILABLE, "Budgets cannot be checked right now; retry shortly.", retry_after_s=1
        ) from None
    try:
        decision = await _reserve(state, key, tokens)
    except BaseException:
        await asyncio.shield(state.budget.settle(hold, key.key_id, 0.0))
        raise
    return Admission(decision, hold, ceiling, min(estimate, ceiling), max_tokens, choices)


async def _reserve(state: EdgeState, key: ApiKey, tokens: int) -> Decision:
    spec = LimitSpec(key.rpm, key.tpm)
    try:
        decision = await state.limiter.admit(key.key_id, spec, tokens)
    except LimiterUnavailable:
        raise ApiError(
            LIMITS_UNAVAILABLE, "Rate limits cannot be checked right now; retry shortly.", retry_after_s=1
        ) from None
    if not decision.allowed:
        state.refusals.note(key.key_id, spec, decision, time.monotonic())
        raise rate_limited(state, decision)
    return decision


def rate_limited(state: EdgeState, decision: Decision) -> ApiError:
    """The 429 for a refusal, counted on /metrics."""
    state.metrics.rate_limited.labels(decision.refused_by or "requests").inc()
    return ApiError(
        RATE_LIMITED,
        f"{decision.reason} Retry after {decision.retry_after_s:.1f}s.",
        retry_after_s=decision.retry_after_s,
        headers=rate_limit_headers(decision),
    )


def refuse_if_standing(state: EdgeState, key: ApiKey) -> None:
    """A key its RPM refused is refused again until that refusal's retry time, before its body is read:
    a key at its limit cannot make the edge read and check bodies it will refuse anyway."""
    if not key.rpm:
        return
    refusal = state.refusals.standing(key.key_id, LimitSpec(key.rpm, key.tpm), time.monotonic())
    if refusal is not None:
        raise rate_limited(state, refusal)


async def count_refused(state: EdgeState, key: ApiKey) -> None:
    """A request the edge refused as the client's mistake (a bad body, an unknown model...) still counts
    against its key's RPM, as OpenAI counts unsuccessful requests: a client that resends a bad request
    in a loop meets its limit (then :func:`refuse_if_standing` spares the edge its bodies). No tokens."""
    if not key.rpm:
        return
    spec = LimitSpec(key.rpm, key.tpm)
    try:
        decision = await state.limiter.admit(key.key_id, spec, 0)
    except LimiterUnavailable:
        return  # nothing to count against: the request was refused anyway
    if not decision.allowed:
        state.refusals.note(key.key_id, spec, decision, time.monotonic())
