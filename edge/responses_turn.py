"""One ``POST /v1/responses`` over the edge's chat journey.

The parse stage reads the Responses request (:func:`read_responses`): the stored conversation it continues
(``previous_response_id``, the key's tenant's only), its instructions and input become one chat request,
which every later stage handles as any chat request (limits, the cache, routing, failover, continuation,
the bill). The :class:`ResponsesTurn` it leaves on the journey says the chat answer as a response: a unary
body once, a stream's bytes as they pass (``response.created`` ... ``response.completed``), and keeps the
response (``store``) before the client sees its end, so a client that has the end can fetch it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from edge.admission import read_body
from edge.journey import Journey
from edge.response_store import OverQuota, ResponseStore
from edge.usage_audit import AuditedUsage
from nearshore.protocol.errors import INVALID_REQUEST, NOT_FOUND, ApiError
from nearshore.protocol.response_events import ResponseEvents, ResponseFrame, new_id, whole_response
from nearshore.protocol.responses import (
    FunctionCallItem,
    FunctionCallOutput,
    Item,
    Message,
    ResponsesRequest,
    chat_request,
    input_items,
    responses_request_decoder,
)
from nearshore.protocol.schemas import ChatCompletionRequest, json_encoder

log = logging.getLogger("nearshore.edge.responses")
_ID_PREFIXES = {Message: "msg", FunctionCallItem: "fc", FunctionCallOutput: "fco"}


async def read_responses(journey: Journey) -> ChatCompletionRequest:
    """The chat request a ``/v1/responses`` body asks for; the turn that answers it goes on the journey."""
    state, key = journey.state, journey.key
    assert key is not None
    request = await read_body(journey.request, state, responses_request_decoder)
    earlier: list[Item] = []
    if request.previous_response_id is not None:
        stored = await state.responses.aget(key.tenant, request.previous_response_id)
        if stored is None:  # another tenant's is not found either: no one learns that it exists
            raise ApiError(
                NOT_FOUND,
                f"Previous response with id '{request.previous_response_id}' not found.",
                param="previous_response_id",
            )
        limit = state.config.responses.max_conversation_bytes
        if stored.size > limit:
            raise ApiError(
                INVALID_REQUEST,
                f"The conversation up to '{request.previous_response_id}' is {stored.size} bytes, more than "
                f"this edge continues ({limit}): start a new one, sending what it needs as input.",
                param="previous_response_id",
            )
        earlier = stored.conversation()
    items = input_items(request)
    for item in items:  # ids that stay: input_items lists them, and a later turn keeps them
        item.id = item.id or new_id(_ID_PREFIXES[type(item)])
    body = chat_request(request, earlier, items)
    journey.dialect = ResponsesTurn(state.responses, key.tenant, request, [*earlier, *items])
    return body


class ResponsesTurn:
    """The chat answer said as a response (edge.journey.Dialect), and kept when the request asks."""

    def __init__(
        self, store: ResponseStore, tenant: str, request: ResponsesRequest, inputs: list[Item]
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.request = request
        self.inputs = inputs
        self.frame = ResponseFrame(request, request.model)
        self.events = ResponseEvents(self.frame) if request.stream else None

    @property
    def recode(self) -> Callable[[bytes], bytes] | None:
        return self.events.recode if self.events is not None else None

    async def whole(self, body: bytes) -> bytes:
        response = whole_response(self.frame, body)
        await self._keep(response)
        return json_encoder.encode(response)

    async def ending(self, audited: AuditedUsage | None) -> None:
        if self.events is None or self.events.failure is not None:
            return
        await self._keep(self.events.conclude(audited.usage if audited is not None else None))

    async def _keep(self, response: dict[str, Any]) -> None:
        if not self.request.store:
            return
        try:
            await self.store.aput(self.tenant, response, self.inputs)
        except (sqlite3.Error, OSError, OverQuota) as exc:  # the answer goes out, saying it was not kept
            log.warning("response %s not stored: %s", response["id"], exc)
            response["store"] = False
