"""``/v1/responses/{id}``: a stored response fetched, its input items listed, or deleted, by its tenant only.

Creating one is a journey (``POST /v1/responses``, edge/responses_turn.py); these read the store
(edge/response_store.py) under the key's tenant, so another tenant's id is not found, as an unknown one.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from edge.admission import authenticate
from edge.response_store import Stored
from edge.state import EDGE
from nearshore.protocol.errors import NOT_FOUND, ApiError
from nearshore.protocol.response_events import new_id
from nearshore.protocol.schemas import json_encoder


def add_routes(app: web.Application, prefix: str = "/v1") -> None:
    app.router.add_get(prefix + "/responses/{response_id}", retrieve)
    app.router.add_get(prefix + "/responses/{response_id}/input_items", list_input_items)
    app.router.add_delete(prefix + "/responses/{response_id}", delete)


async def retrieve(request: web.Request) -> web.Response:
    stored = await _stored(request)
    return _json(stored.response)


async def list_input_items(request: web.Request) -> web.Response:
    """The conversation the response answered, newest first as OpenAI lists it (``order=asc``: oldest
    first); every item, in one page."""
    stored = await _stored(request)
    items = [{**msgspec.to_builtins(item), "id": item.id or new_id("item")} for item in stored.inputs]
    if request.query.get("order", "desc") != "asc":
        items.reverse()
    first, last = (items[0]["id"], items[-1]["id"]) if items else (None, None)
    return _json({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False})


async def delete(request: web.Request) -> web.Response:
    state = request.app[EDGE]
    key = authenticate(request, state)
    response_id = request.match_info["response_id"]
    if not await state.responses.adelete(key.tenant, response_id):
        raise _not_found(response_id)
    return _json({"id": response_id, "object": "response", "deleted": True})


async def _stored(request: web.Request) -> Stored:
    state = request.app[EDGE]
    key = authenticate(request, state)
    response_id = request.match_info["response_id"]
    stored = await state.responses.aget(key.tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> ApiError:
    return ApiError(NOT_FOUND, f"Response with id '{response_id}' not found.", param="response_id")


def _json(payload: object) -> web.Response:
    return web.Response(body=json_encoder.encode(payload), content_type="application/json")
