"""One table of API errors, OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

Handlers raise :class:`ApiError`; one middleware per service turns it into a JSON response.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


@dataclass(frozen=True, slots=True)
class ErrorKind:
    status: int
    type: str
    code: str | None


# Named kinds with their HTTP status; the `type` strings are the ones OpenAI's API uses.
INVALID_REQUEST = ErrorKind(400, "invalid_request_error", None)
INVALID_JSON = ErrorKind(400, "invalid_request_error", "invalid_json")
INVALID_CONTENT_ENCODING = ErrorKind(400, "invalid_request_error", "invalid_content_encoding")
CONTEXT_LENGTH_EXCEEDED = ErrorKind(400, "invalid_request_error", "context_length_exceeded")
UNSUPPORTED_PARAMETER = ErrorKind(400, "invalid_request_error", "unsupported_parameter")
INVALID_API_KEY = ErrorKind(401, "authentication_error", "invalid_api_key")
PERMISSION_DENIED = ErrorKind(403, "permission_error", "permission_denied")
MODEL_NOT_FOUND = ErrorKind(404, "invalid_request_error", "model_not_found")
NOT_FOUND = ErrorKind(404, "invalid_request_error", "not_found")
METHOD_NOT_ALLOWED = ErrorKind(405, "invalid_request_error", "method_not_allowed")
REQUEST_TOO_LARGE = ErrorKind(413, "invalid_request_error", "request_too_large")
UNSUPPORTED_MEDIA_TYPE = ErrorKind(415, "invalid_request_error", "unsupported_media_type")
RATE_LIMITED = ErrorKind(429, "rate_limit_error", "rate_limit_exceeded")
QUOTA_EXCEEDED = ErrorKind(429, "insufficient_quota", "insufficient_quota")
REQUEST_TIMEOUT = ErrorKind(408, "invalid_request_error", "request_timeout")
UPSTREAM_UNAVAILABLE = ErrorKind(503, "server_error", "upstream_unavailable")
# One key has its share of a pool in flight (edge/key_share.py): its own earlier requests must end first.
CONCURRENCY_LIMITED = ErrorKind(429, "rate_limit_error", "concurrency_limit_exceeded")
# Every replica (and fallback) that could serve the request limited the rate: the client should wait.
UPSTREAM_RATE_LIMITED = ErrorKind(429, "rate_limit_error", "upstream_rate_limited")
# A region answered something the edge will not pass on (malformed, oversized, cut short): 502.
UPSTREAM_BAD_RESPONSE = ErrorKind(502, "server_error", "bad_upstream_response")
UPSTREAM_TIMEOUT = ErrorKind(504, "server_error", "upstream_timeout")
# The edge's router found no replica that may serve the request now (all down, ejected or none serving the
# model), or none that the request's data-residency policy allows.
NO_REGION_AVAILABLE = ErrorKind(503, "server_error", "no_region_available")
RESIDENCY_UNAVAILABLE = ErrorKind(503, "server_error", "residency_unavailable")
# Every remote region serving the model is unreachable (a cable cut) and nothing on the edge's side of the
# ocean may answer for it (edge/degraded.py): retry later, or ask for a model a local region serves.
CABLE_CUT = ErrorKind(503, "server_error", "cable_cut")
# A request that no wait can make fit (bigger than the key's whole TPM or budget): retrying is pointless.
EXCEEDS_LIMIT = ErrorKind(400, "invalid_request_error", "request_exceeds_limit")
INTERNAL = ErrorKind(500, "server_error", "internal_error")
OVERLOADED = ErrorKind(503, "server_error", "overloaded")
# The node has room for more sequences, but not for all of this request's ``n`` choices: a refusal about one
# request, which says nothing of the node's health (an edge neither counts it against the replica nor
# holds other requests back from it).
NO_ROOM_FOR_CHOICES = ErrorKind(503, "server_error", "no_room_for_choices")
REQUEST_SCOPED_REFUSALS = frozenset({NO_ROOM_FOR_CHOICES.code})
MODEL_LOADING = ErrorKind(503, "server_error", "model_loading")
# The embedding model could not be loaded (the message names its folder); chat may still be served.
EMBEDDER_UNAVAILABLE = ErrorKind(503, "server_error", "embedder_unavailable")
# The engine cannot go on; the process is about to exit so that its supervisor restarts it.
ENGINE_FAILED = ErrorKind(503, "server_error", "engine_failed")
# The edge's shared rate-limit and budget store (Redis) is unreachable and ``[limits] fail_mode = "closed"``
# refuses what it cannot count: the edge's own state, not a provider's outage (retry after Retry-After).
LIMITS_UNAVAILABLE = ErrorKind(503, "server_error", "limits_unavailable")
# The edge cannot record usage (its ledger and the ledger's spool refuse writes): it serves nothing unbilled.
LEDGER_UNAVAILABLE = ErrorKind(503, "server_error", "ledger_unavailable")
# The edge's key store (PostgreSQL, shared by a city's edges) is out of reach, and the presented key is one
# the edge does not know (it may have been created meanwhile) or the edge's copy is older than it may trust.
KEYS_UNAVAILABLE = ErrorKind(503, "server_error", "keys_unavailable")
# The key was revoked (or deleted) while its request was in flight: the edge ended the answer there.
KEY_REVOKED = ErrorKind(401, "authentication_error", "key_revoked")
# The edge is shutting down and the request was still in flight after server.shutdown_timeout_s: ask again
# (another edge, or this one once it is back, answers).
SERVER_SHUTTING_DOWN = ErrorKind(503, "server_error", "server_shutting_down")

_KIND_BY_STATUS = {
    400: INVALID_REQUEST,
    401: INVALID_API_KEY,
    403: PERMISSION_DENIED,
    404: NOT_FOUND,
    405: METHOD_NOT_ALLOWED,
    408: REQUEST_TIMEOUT,
    413: REQUEST_TOO_LARGE,
    415: UNSUPPORTED_MEDIA_TYPE,
    429: RATE_LIMITED,
    503: OVERLOADED,
}


class ApiError(Exception):
    """An error a client should see, with its status, OpenAI error fields and extra headers."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.extra_headers = headers or {}

    @property
    def status(self) -> int:
        return self.kind.status

    def envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(ErrorBody(self.message, self.kind.type, self.param, self.kind.code))

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers

    def to_json(self) -> bytes:
        return msgspec.json.encode(self.envelope())


def kind_for_status(status: int) -> ErrorKind:
    if status in _KIND_BY_STATUS:
        return _KIND_BY_STATUS[status]
    return INTERNAL if status >= 500 else INVALID_REQUEST


def split_error_path(message: str) -> tuple[str, str | None]:
    """msgspec's ``"... - at `$.messages[0].role`"`` as ``("...", "messages[0].role")``; no path: None."""
    text, sep, path = message.partition(" - at `$.")
    return (text, path.rstrip("`")) if sep else (message, None)


def from_validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> ApiError:
    """Map msgspec's message (``... - at `$.messages[0].role```) to an error with ``param``."""
    text, param = split_error_path(str(exc))
    if isinstance(exc, msgspec.ValidationError):
        if text.startswith("Object contains unknown field"):
            field = text.split("`")[1] if "`" in text else param
            unknown = f"{param}.{field}" if param else field
            return ApiError(
                INVALID_REQUEST, f"Unrecognized request argument supplied: {unknown}", param=unknown
            )
        return ApiError(INVALID_REQUEST, f"Invalid request: {text}", param=param)
    return ApiError(INVALID_JSON, f"Request body is not valid JSON: {text}", param=param)
