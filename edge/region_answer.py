"""Reading a region's non-streamed answer (or its refusal) without trusting it.

The body is read with a size bound and a deadline, then its shape is checked: a 200 must be a chat or
completion object with choices; a refusal must be an OpenAI error object with a status worth passing on.
Anything else becomes an :class:`UpstreamFault`, which the edge answers with a typed 502 or 504.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Literal

import msgspec

from edge.h1 import MalformedResponse, Response
from nearshore.protocol.errors import (
    UPSTREAM_BAD_RESPONSE,
    UPSTREAM_TIMEOUT,
    ApiError,
    ErrorBody,
    ErrorKind,
)
from nearshore.protocol.schemas import Usage, json_encoder

# Region refusals a client may see as they are (its own request was wrong); any other status is the region's
# problem, not the client's: a 401 from a region would tell the client its API key is bad.
PASSED_ON = frozenset({400, 404, 413, 415, 422})
MAX_ERROR_BYTES = 16 * 1024
# No tokenizer's token spells more than this many bytes (the longest are runs of spaces or symbols).
MAX_TOKEN_TEXT_BYTES = 256


class UpstreamFault(Exception):
    """The region answered something the edge will not pass on; ``error`` is what the client gets."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error

    @classmethod
    def bad(cls, message: str) -> UpstreamFault:
        return cls(ApiError(UPSTREAM_BAD_RESPONSE, message))

    @classmethod
    def timeout(cls, message: str) -> UpstreamFault:
        return cls(ApiError(UPSTREAM_TIMEOUT, message))


async def read_bounded(response: Response, max_bytes: int, deadline_s: float) -> bytes:
    """The whole body, or an :class:`UpstreamFault` past ``max_bytes``, ``deadline_s`` or a broken body."""
    if response.content_length is not None and response.content_length > max_bytes:
        raise UpstreamFault.bad(f"the region's answer is too large ({response.content_length} bytes)")
    parts: list[bytes] = []
    size = 0
    # A body that came whole with its head has no wait to bound: no timer for it.
    deadline = contextlib.nullcontext() if response.complete else asyncio.timeout(deadline_s)
    try:
        async with deadline:
            while data := await response.read():
                size += len(data)
                if size > max_bytes:
                    raise UpstreamFault.bad(f"the region's answer is larger than {max_bytes} bytes")
                parts.append(data)
    except TimeoutError:
        raise UpstreamFault.timeout(f"the region's answer did not finish within {deadline_s:g}s") from None
    except MalformedResponse as exc:
        raise UpstreamFault.bad(f"the region's answer is not HTTP: {exc}") from None
    except OSError as exc:
        raise UpstreamFault.bad(f"the region's answer was cut short ({type(exc).__name__})") from None
    return b"".join(parts)


# A Raw field cannot be optional in msgspec: an absent (or null) usage reads as this.
NO_USAGE = msgspec.Raw(b"null")


def with_usage(payload: bytes, usage: Usage) -> bytes:
    """``payload`` (a JSON object) with its ``usage`` replaced by the figure the edge billed."""
    data = msgspec.json.decode(payload)
    data["usage"] = usage
    return json_encoder.encode(data)


def usage_bytes(raw: msgspec.Raw) -> bytes | None:
    data = bytes(raw)
    return None if data == b"null" else data


class _Message(msgspec.Struct):
    content: str | None = None


class _ChatChoice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class _TextChoice(msgspec.Struct):
    text: str
    finish_reason: str | None = None


class _ChatAnswer(msgspec.Struct):
    choices: list[_ChatChoice]
    usage: msgspec.Raw = NO_USAGE


class _TextAnswer(msgspec.Struct):
    choices: list[_TextChoice]
    usage: msgspec.Raw = NO_USAGE


_ANSWERS = {
    "chat": msgspec.json.Decoder(_ChatAnswer),
    "completions": msgspec.json.Decoder(_TextAnswer),
}


class _ProviderError(msgspec.Struct):
    """An error object as providers write it: OpenAI's, or with a null type and a numeric code (Azure's
    content filter, some gateways'); anything beyond these fields is dropped."""

    message: str = ""
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class _ProviderEnvelope(msgspec.Struct):
    error: _ProviderError


_error_decoder = msgspec.json.Decoder(_ProviderEnvelope)
# The type OpenAI gives an error of this status, for an error object that names none.
_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class Answer:
    body: bytes
    usage: bytes | None  # the region's ``usage`` JSON, still to be audited
    text: str = ""  # the answer's content
    finish_reason: str = ""
    texts: tuple[str, ...] = ()  # every choice's content: what the client gets (billed on a usage lie)


def check_answer(
    kind: Literal["chat", "completions"],
    response: Response,
    body: bytes,
    max_text_bytes: int,
) -> Answer:
    """The region's 200 answer, checked: JSON, the right object, and no more text than its tokens allow."""
    if response.content_type != "application/json":
        raise UpstreamFault.bad(f"the region answered {response.content_type or 'no content type'}, not JSON")
    try:
        answer = _ANSWERS[kind].decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UpstreamFault.bad(f"the region's answer is not a {kind} completion: {exc}") from None
    if not answer.choices:
        raise UpstreamFault.bad("the region's answer has no choices")
    texts = [c.message.content or "" if isinstance(c, _ChatChoice) else c.text for c in answer.choices]
    if sum(len(t.encode()) for t in texts) > max_text_bytes:
        raise UpstreamFault.bad("the region's answer holds more text than max_tokens tokens can")
    finish_reason = answer.choices[0].finish_reason or ""
    return Answer(body, usage_bytes(answer.usage), texts[0], finish_reason, tuple(texts))


class _Vector(msgspec.Struct):
    index: int
    embedding: list[float] | str


class _EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int


class _EmbeddingAnswer(msgspec.Struct):
    data: list[_Vector]
    usage: _EmbeddingUsage


_embedding_answer = msgspec.json.Decoder(_EmbeddingAnswer)
# The most bytes one vector may take in JSON (a 4096-dim float vector at ~24 bytes a number).
MAX_VECTOR_BYTES = 96 * 1024


def check_embeddings(response: Response, body: bytes, num_inputs: int) -> Answer:
    """The region's /v1/embeddings answer, checked: JSON, one vector per input, and a usage (billed as
    prompt tokens: an embedding generates nothing)."""
    if response.content_type != "application/json":
        raise UpstreamFault.bad(f"the region answered {response.content_type or 'no content type'}, not JSON")
    try:
        answer = _embedding_answer.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UpstreamFault.bad(f"the region's answer is not an embedding list: {exc}") from None
    if sorted(v.index for v in answer.data) != list(range(num_inputs)):
        raise UpstreamFault.bad(
            f"the region's answer does not hold one vector for each of the {num_inputs} inputs"
        )
    prompt = answer.usage.prompt_tokens
    usage = json_encoder.encode({"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt})
    return Answer(body, usage)


def refusal_code(body: bytes) -> str | None:
    """The ``code`` of an OpenAI-shaped error body (None when it is not one or names none)."""
    try:
        code = _error_decoder.decode(body).error.code
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return str(code)[:200] if code is not None else None


async def read_refusal(response: Response) -> tuple[ApiError, bool]:
    """A region's non-200, non-retryable answer as the error the client gets, and whether it is the
    region's own refusal of the request (passed on) rather than a 502 for a region that misbehaved."""
    try:
        body = await read_bounded(response, MAX_ERROR_BYTES, deadline_s=10)
    except UpstreamFault as fault:
        return fault.error, False
    status = response.status
    if status not in PASSED_ON:
        return ApiError(UPSTREAM_BAD_RESPONSE, f"the region refused the request with HTTP {status}"), False
    try:
        envelope = _error_decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        message = f"the region answered HTTP {status} without an error object"
        return ApiError(UPSTREAM_BAD_RESPONSE, message), False
    error = envelope.error
    body_of = ErrorBody(
        message=error.message[:2000] or f"the region refused the request (HTTP {status})",
        type=error.type or _TYPE_OF_STATUS.get(status, "invalid_request_error"),
        param=error.param,
        code=str(error.code)[:200] if error.code is not None else None,
    )
    return passed_on(body_of, status), True


def passed_on(error: ErrorBody, status: int) -> ApiError:
    """The region's error as the edge's own: same status, type, code and param; re-encoded, never raw."""
    kind = ErrorKind(status, error.type, error.code)
    return ApiError(kind, error.message, param=error.param)
