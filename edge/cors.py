"""Cross-origin requests from browsers (CORS), for the origins ``server.cors_origins`` names.

A chat page served from another origin calls the edge from the user's browser: the browser first asks
whether it may (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-*``, no key), then sends the
request and lets the page read the answer only if it names the page's origin. With ``cors_origins`` empty
(the default) none of this is installed and the edge answers no preflight: nothing is added to a request's
path. An origin is ``scheme://host[:port]`` as the browser sends it, or ``*`` for any. Credentials
(cookies) are never allowed: a browser sends the API key itself, in a header, which the preflight allows.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from aiohttp import hdrs, web

from nearshore.protocol.errors import METHOD_NOT_ALLOWED, PERMISSION_DENIED, ApiError

# What a page may read of an answer besides the simple headers: the ids, the limits, where it was served.
EXPOSED = ", ".join(
    [
        "x-request-id",
        "x-client-request-id",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "retry-after",
        "server-timing",
        "x-nearshore-region",
        "x-nearshore-cache",
    ]
)
METHODS = "GET, POST, DELETE, OPTIONS"
MAX_AGE_S = 600  # how long a browser may keep a preflight's answer
_PREFLIGHT_HEADERS_MAX = 1024  # a page asks for a handful; a longer list is refused, not echoed


class Cors:
    """The allowed origins, and the two things they change: the preflight's answer and every answer's
    headers."""

    def __init__(self, origins: list[str]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o for o in origins if o != "*")

    def allowed(self, origin: str) -> bool:
        return bool(origin) and (self.any or origin in self.origins)

    def install(self, app: web.Application) -> None:
        app.router.add_route(hdrs.METH_OPTIONS, "/{path:.*}", self.preflight)
        app.on_response_prepare.append(self.on_answer)

    async def preflight(self, request: web.Request) -> web.Response:
        origin = request.headers.get(hdrs.ORIGIN, "")
        if not origin:
            raise ApiError(METHOD_NOT_ALLOWED, "OPTIONS is a browser's preflight: it needs an Origin.")
        if not self.allowed(origin):
            raise ApiError(PERMISSION_DENIED, "This origin may not call the API from a browser.")
        asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
        if len(asked) > _PREFLIGHT_HEADERS_MAX:
            raise ApiError(PERMISSION_DENIED, "The preflight asks for too many headers.")
        headers: dict[str, str] = {hdrs.ACCESS_CONTROL_ALLOW_METHODS: METHODS}
        self._name_origin(headers, origin)
        if asked:
            headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = asked  # any header: the key is one of them
        headers[hdrs.ACCESS_CONTROL_MAX_AGE] = str(MAX_AGE_S)
        return web.Response(status=204, headers=headers)

    async def on_answer(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        origin = request.headers.get(hdrs.ORIGIN, "")
        if request.method != hdrs.METH_OPTIONS and self.allowed(origin):
            self._name_origin(response.headers, origin)
            response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED

    def _name_origin(self, headers: MutableMapping[str, str], origin: str) -> None:
        if self.any:
            headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = "*"
            return
        headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        # The answer depends on the asking origin: a cache between must keep one per origin.
        vary = headers.get(hdrs.VARY)
        headers[hdrs.VARY] = f"{vary}, {hdrs.ORIGIN}" if vary else hdrs.ORIGIN
