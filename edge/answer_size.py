"""How many bytes a region's answer to one request may take: what the forward stage checks an embeddings
request against before sending it, and what the relay reads or relays at most (in all, and in one event)."""

from __future__ import annotations

from edge.journey import Journey
from nearshore.protocol.schemas import CompletionRequest, EmbeddingRequest

# The most bytes one log-probability alternative takes in JSON (chat's shape: name, logprob, bytes list).
LOGPROB_ALTERNATIVE_BYTES = 160
# An embedding's numbers in JSON ("-0.012345678901234567," at most) or base64 (4 bytes as 5.33), its object's
# own keys, and the dimensions assumed for a model the config does not list.
JSON_NUMBER_BYTES = 26
BASE64_NUMBER_BYTES = 6
VECTOR_OVERHEAD_BYTES = 256
DEFAULT_DIMENSIONS = 4096


def response_budget(journey: Journey) -> int:
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None
    if isinstance(body, EmbeddingRequest):
        # One vector per input, of the model's dimensions: the bound follows from the request.
        dims = up.embedding_dimensions.get(journey.model) or body.dimensions or DEFAULT_DIMENSIONS
        per_number = BASE64_NUMBER_BYTES if body.encoding_format == "base64" else JSON_NUMBER_BYTES
        return up.response_base_bytes + len(body.texts()) * (VECTOR_OVERHEAD_BYTES + dims * per_number)
    per_token, tokens = up.response_bytes_per_token, admission.completion_tokens
    if (alternatives := body.top_logprobs_asked()) is not None:
        # Each scored token carries its alternatives; with echo, every prompt token is scored too.
        per_token += LOGPROB_ALTERNATIVE_BYTES * (alternatives + 1)
        if isinstance(body, CompletionRequest) and body.echo:
            tokens += admission.prompt_ceiling
    return up.response_base_bytes + per_token * tokens


def event_budget(journey: Journey) -> int:
    """How many bytes one event of a streamed answer may take: ``max_event_bytes``, and with ``echo`` and
    ``logprobs`` the prompt's scores on top, which a region sends in one event (its echoed text), however
    long the prompt (340 tokens at logprobs=20 came to 172 kB)."""
    up, admission, body = journey.state.config.upstream, journey.admission, journey.body
    assert admission is not None
    echoed = isinstance(body, CompletionRequest) and body.echo
    if not echoed or (alternatives := body.top_logprobs_asked()) is None:
        return up.max_event_bytes
    return up.max_event_bytes + LOGPROB_ALTERNATIVE_BYTES * (alternatives + 1) * admission.prompt_ceiling
