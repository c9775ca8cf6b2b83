"""The body a region gets: the request as validated, with what the edge decided said outright."""

from __future__ import annotations

import msgspec

from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamOptions,
    json_encoder,
)

Body = ChatCompletionRequest | CompletionRequest | EmbeddingRequest


def region_body(body: Body, max_tokens: int, model: str = "") -> bytes:
    """``body`` for the region: a stream asks for the usage chunk (the edge always wants it; the client gets
    it only if it asked too); a completion carries the ``max_tokens`` the edge reserved, so a region whose
    own default differs never produces more or less than was reserved; ``model`` replaces the model (a
    fallback serves it)."""
    changes: dict[str, object] = {}
    if model and model != body.model:
        changes["model"] = model
    if isinstance(body, ChatCompletionRequest):
        if body.token_limit() is None:
            changes["max_tokens"] = max_tokens
    elif isinstance(body, CompletionRequest) and body.max_tokens is None:
        changes["max_tokens"] = max_tokens
    if not isinstance(body, EmbeddingRequest) and body.stream:
        changes["stream_options"] = StreamOptions(include_usage=True)
    return json_encoder.encode(msgspec.structs.replace(body, **changes) if changes else body)
