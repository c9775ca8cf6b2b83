"""aiohttp's own answers in the API's error shape: a request it cannot parse as HTTP gets the 400 that every
other refusal gets, not aiohttp's plain text.

aiohttp answers such a request before any handler or middleware runs, with a ``text/plain`` body that quotes
the request's bytes (a header line, the start of an over-long one). :class:`ApiRunner` serves an app with
:class:`ApiRequestHandler`, whose answer is ``{"error": {...}}`` with the parse error's fixed words
(:func:`nearshore.http_log.parse_error_words`), never the client's bytes. The edge's guarded handler
(edge/guard.py) is one too.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from nearshore.http_log import parse_error_words
from nearshore.protocol.errors import ApiError, kind_for_status


class ApiRequestHandler(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if the answer had begun
        if isinstance(exc, HttpProcessingError):
            text = f"The request is not valid HTTP/1.1: {parse_error_words(exc)}."
        else:
            text = "internal error" if status >= 500 else "The request could not be read."
        error = ApiError(kind_for_status(status), text)
        response = web.Response(status=status, body=error.to_json(), content_type="application/json")
        response.force_close()  # what the parser saw last cannot be trusted to end where it says
        return response


class _ApiServer(Server):
    def __call__(self) -> ApiRequestHandler:
        return ApiRequestHandler(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """An app runner whose connections answer unparseable requests in the API's error shape."""

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _ApiServer
        return server
