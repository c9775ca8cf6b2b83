"""The parse stage: the body read within its size and time, decoded against the endpoint's schema, and
checked against what the key and the edge allow (edge/admission.py); a clear 400 naming the field, else.
A ``/v1/responses`` body is read as the chat request it asks for (edge/responses_turn.py)."""

from __future__ import annotations

from edge.admission import check_request, read_body
from edge.journey import Journey, Reply
from edge.responses_turn import read_responses
from nearshore.protocol.schemas import (
    chat_request_decoder,
    completion_request_decoder,
    embedding_request_decoder,
)

DECODERS = {
    "chat": chat_request_decoder,
    "completions": completion_request_decoder,
    "embeddings": embedding_request_decoder,
}


async def parse_stage(journey: Journey) -> Reply | None:
    assert journey.key is not None
    if journey.api == "responses":
        journey.body = await read_responses(journey)
    else:
        journey.body = await read_body(journey.request, journey.state, DECODERS[journey.kind])
    check_request(journey.state, journey.key, journey.body)
    return None
