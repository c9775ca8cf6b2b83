"""aiohttp pieces every Nearshore service uses: OpenAI-shaped errors, request ids, JSON bodies, startup."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import HttpVersion11, web

from nearshore.api_runner import ApiRunner
from nearshore.bodies import BROKEN_BODY, check_json_depth, read_body
from nearshore.listen import Address, listen
from nearshore.listen import serve as listen_and_serve
from nearshore.protocol.errors import (
    INTERNAL,
    UNSUPPORTED_MEDIA_TYPE,
    ApiError,
    from_validation_error,
    kind_for_status,
)
from nearshore.protocol.headers import CLIENT_REQUEST_ID, PROMETHEUS_CONTENT_TYPE, REQUEST_ID

log = logging.getLogger("nearshore.http")
T = TypeVar("T")
R = TypeVar("R", bound=web.StreamResponse)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REQUEST_ID_KEY = web.RequestKey("request_id", str)
CLIENT_REQUEST_ID_KEY = web.RequestKey("client_request_id", str)
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(request: web.Request) -> str:
    return request[REQUEST_ID_KEY]


SERVER_NAME = "nearshore"


async def name_the_server(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` handler: every answer says ``Server: nearshore``, not the Python and
    aiohttp versions aiohttp puts there (a version is a map of which published flaws apply)."""
    response.headers["Server"] = SERVER_NAME


def metrics_response(body: bytes) -> web.Response:
    """A Prometheus scrape's answer."""
    return web.Response(body=body, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


def close_unframed(request: web.BaseRequest, response: R) -> R:
    """``response``, an answer of unknown length (an event stream), closed with its connection when the
    client speaks HTTP/1.0: without chunked framing the connection's end is the answer's end. aiohttp would
    keep a keep-alive client's connection open after it, and the client would wait for an end never sent."""
    if request.version < HttpVersion11:
        response.force_close()
    return response


def error_response(error: ApiError, request_id: str | None = None) -> web.Response:
    headers = error.headers()
    if request_id:
        headers[REQUEST_ID] = request_id
    return web.Response(
        status=error.status, body=error.to_json(), content_type="application/json", headers=headers
    )


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Take the caller's ``x-request-id`` when it is sane, else make one; echo it on the response."""
    incoming = request.headers.get(REQUEST_ID, "")
    request[REQUEST_ID_KEY] = incoming if _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex
    response = await handler(request)
    if not response.prepared:
        response.headers[REQUEST_ID] = request[REQUEST_ID_KEY]
    return response


@web.middleware
async def minted_request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request gets an id of the server's own, unique, whatever the caller sent (two users choosing the
    same ``x-request-id`` must never address each other's requests). The caller's id, from
    ``x-client-request-id`` (or ``x-request-id``) when sane, is kept and echoed as ``x-client-request-id``."""
    request[REQUEST_ID_KEY] = os.urandom(16).hex()  # 128 random bits, as a uuid4's hex, cheaper
    given = request.headers.get(CLIENT_REQUEST_ID) or request.headers.get(REQUEST_ID, "")
    client_id = given if _VALID_REQUEST_ID.match(given) else ""
    request[CLIENT_REQUEST_ID_KEY] = client_id
    response = await handler(request)
    if not response.prepared:
        response.headers[REQUEST_ID] = request[REQUEST_ID_KEY]
        if client_id:
            response.headers[CLIENT_REQUEST_ID] = client_id
    return response


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as ``{"error": {...}}`` with its status; the process keeps serving."""
    request_id = request.get(REQUEST_ID_KEY)
    try:
        return await handler(request)
    except ApiError as exc:
        response = error_response(exc, request_id)
        if request.get(BROKEN_BODY):
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = kind_for_status(exc.status)
        message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        if exc.status == 413:
            message = f"Request body too large: {message}"
        return error_response(ApiError(kind, message), request_id)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(
            ApiError(INTERNAL, "The server had an error processing your request."), request_id
        )


async def read_json(request: web.Request, decoder: msgspec.json.Decoder[T]) -> T:
    """Decode a JSON body with a msgspec decoder; 415 for other media types or encodings, 400 for a body
    that is not its Content-Encoding, 413 past the size limit (decoded bytes, checked while inflating), 400
    past the nesting limit (checked before decoding, which recurses once per level)."""
    if request.content_type != "application/json":
        raise ApiError(
            UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type must be application/json, got {request.content_type or 'none'!r}",
        )
    raw = await read_body(request)
    check_json_depth(raw)
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation_error(exc) from None


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_ready: Callable[[int], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    runner: web.AppRunner | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run ``app`` on ``host:port`` (``--port``) until SIGTERM or SIGINT, or until ``stop`` is set (HTTPS with
    ``ssl_context``): bound as the edge and the region bind (:mod:`nearshore.listen`), so a port that cannot
    be taken is one :class:`~nearshore.listen.BindError` line. The default runner cancels a handler when its
    client disconnects; pass another to tune the server."""
    listener = listen(Address("--port", host, port))
    if runner is None:
        runner = ApiRunner(app, handler_cancellation=True, access_log=None)
    await listen_and_serve(runner, listener, on_ready=on_ready, ssl_context=ssl_context, stop=stop)
