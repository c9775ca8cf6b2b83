"""Rules on a request that its schema cannot say, checked alike by the edge and the region."""

from __future__ import annotations

from nearshore.protocol.errors import INVALID_REQUEST, UNSUPPORTED_PARAMETER, ApiError
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest


def check_supported(body: ChatCompletionRequest | CompletionRequest) -> None:
    """Raise the OpenAI-shaped 400 for what no Nearshore server does: several choices, usage off-stream;
    and for fields that only mean something with another: top_logprobs without logprobs, max_tokens 0
    without echo."""
    if body.n != 1:
        raise ApiError(
            UNSUPPORTED_PARAMETER, "Only n=1 is supported: send one request per choice.", param="n"
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            INVALID_REQUEST, "stream_options is only allowed with stream=true.", param="stream_options"
        )
    if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
        raise ApiError(
            INVALID_REQUEST, "top_logprobs is only allowed with logprobs=true.", param="top_logprobs"
        )
    if isinstance(body, CompletionRequest) and body.max_tokens == 0 and not body.echo:
        raise ApiError(
            INVALID_REQUEST,
            "max_tokens=0 is only allowed with echo=true (it scores the prompt and generates nothing).",
            param="max_tokens",
        )
