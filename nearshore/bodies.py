"""Request bodies under a size limit, whatever their ``Content-Encoding`` claims, and JSON bodies under a
nesting limit.

A body whose bytes are not the encoding it names is the client's error (400, never a 500 with a traceback);
an encoding we do not decode is 415; a body that inflates past the limit is 413, found while inflating it
in pieces of at most the limit, so a small "bomb" never costs its inflated size in memory.

Both Nearshore servers run with ``auto_decompress=False`` and hand us the raw bytes, which we inflate. A
server on aiohttp's default (it inflates gzip and deflate itself, bounded per read since aiohttp 3.12) is
served too: its ``ContentEncodingError`` becomes the same 400.

A JSON body nested deeper than :data:`MAX_JSON_DEPTH` is the client's 400 too, found on its bytes before
anything decodes it: decoding recurses once per level, and past about 1,000 levels it ran out of Python's
recursion limit (a 500 with a traceback for every such request, issue 34, N5).
"""

from __future__ import annotations

import operator
import re
import zlib
from itertools import accumulate, count

import msgspec
from aiohttp import hdrs, web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError

from nearshore.protocol.errors import (
    INVALID_CONTENT_ENCODING,
    INVALID_REQUEST,
    REQUEST_TOO_LARGE,
    UNSUPPORTED_MEDIA_TYPE,
    ApiError,
)

IDENTITY = frozenset({"", "identity"})
# Set on a request whose body could not be read to its end: its answer closes the connection, because
# whatever follows on the wire is not the start of a next request (keeping it alive hung the next one).
BROKEN_BODY = web.RequestKey("broken_body", bool)
# "x-gzip" is gzip (RFC 9110, 8.4.1.3).
DECODED = ("gzip", "x-gzip", "deflate")
# How deep a JSON body may nest its arrays and objects, the body itself being level 1. A request needs few:
# a tool's parameters schema starts at level 5, and a schema nested dozens of levels deeper is still served.
# Decoding, the schema checks and the grammar compiler all recurse once per level; at 64 none comes near
# Python's recursion limit (1,000 frames).
MAX_JSON_DEPTH = 64

_NOT_A_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_OPENING_AS_2 = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded, at most ``request.client_max_size`` bytes."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    # An empty body comes as aiohttp's EmptyStreamReader, which has no such counter.
    inflated_by_aiohttp = getattr(request.content, "total_compressed_bytes", None) is not None
    if encoding in IDENTITY or inflated_by_aiohttp:
        try:
            return await request.read()  # raises 413 past client_max_size
        except (ContentEncodingError, RequestPayloadError) as exc:
            # Mark the broken body read to its end, or aiohttp drains it after our 400 and logs the same
            # error again as an unhandled exception with a traceback.
            request.content.feed_eof()
            request[BROKEN_BODY] = True
            raise _unreadable(exc, encoding) from None
    if encoding not in DECODED:
        raise ApiError(
            UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {encoding!r} is not supported: send the body as identity, gzip or deflate.",
        )
    return await _inflate(request, encoding, request.client_max_size)


async def _inflate(request: web.Request, encoding: str, limit_bytes: int) -> bytes:
    inflater: zlib._Decompress | None = None
    body = bytearray()
    received_bytes = 0
    try:
        async for chunk in request.content.iter_any():
            received_bytes += len(chunk)
            if received_bytes > limit_bytes:  # already past the limit before inflating anything
                raise _too_large(limit_bytes)
            if inflater is None:
                inflater = zlib.decompressobj(_window_bits(encoding, chunk))
            pending = chunk
            while pending:
                if inflater.eof:  # bytes after the end of a compressed stream
                    if encoding == "deflate":
                        raise _not_encoded_as(encoding)
                    # gzip allows several members one after another (RFC 1952): inflate the next.
                    inflater = zlib.decompressobj(_window_bits(encoding, pending))
                # Never inflate more than one byte past the limit: that byte is enough to refuse.
                body += inflater.decompress(pending, limit_bytes + 1 - len(body))
                if len(body) > limit_bytes:
                    raise _too_large(limit_bytes)
                pending = inflater.unconsumed_tail or inflater.unused_data
    except zlib.error:
        raise _not_encoded_as(encoding) from None
    if inflater is None or not inflater.eof:  # empty, or cut short
        raise _not_encoded_as(encoding)
    return bytes(body)


def _window_bits(encoding: str, first_chunk: bytes) -> int:
    if encoding != "deflate":
        return 16 + zlib.MAX_WBITS  # gzip framing
    # "deflate" means the zlib format (RFC 1950), but some clients send raw deflate; accept both,
    # as aiohttp does: a zlib stream's first byte names compression method 8.
    return zlib.MAX_WBITS if first_chunk[0] & 0x0F == 8 else -zlib.MAX_WBITS


def _unreadable(exc: Exception, encoding: str) -> ApiError:
    # aiohttp wraps its parser's errors in RequestPayloadError, with the cause attached.
    cause = exc.__cause__ if isinstance(exc, RequestPayloadError) else exc
    if isinstance(cause, ContentEncodingError) or "content-encoding" in str(exc).lower():
        return _not_encoded_as(encoding)
    return ApiError(INVALID_REQUEST, "The request body could not be read: it was malformed or cut short.")


def _not_encoded_as(encoding: str) -> ApiError:
    return ApiError(
        INVALID_CONTENT_ENCODING,
        f"The request body is not valid {encoding} data, as its Content-Encoding: {encoding} says.",
    )


def _too_large(limit_bytes: int) -> ApiError:
    return ApiError(
        REQUEST_TOO_LARGE,
        f"Request body too large: the decoded body may be at most {limit_bytes} bytes.",
    )


def json_depth(text: bytes) -> int:
    """How deeply the arrays and objects of JSON ``text`` nest (0 for a scalar), read without decoding it
    (so without recursion): brackets inside strings do not count. All of it runs in C, with no object per
    string or bracket: a body of many small parts (25,000 content parts in 800 KB) took 20 ms on the event
    loop when each string was matched on its own."""
    brackets = _brackets_outside_strings(text)
    # Up to the limit, level by level: each pass takes out every innermost pair (one kind of bracket for
    # both, so "{[]}" loses one level a pass, not two).
    pairs = brackets.translate(_ONE_KIND)
    for depth in range(MAX_JSON_DEPTH + 1):
        if not pairs:
            return depth
        inner = pairs.replace(b"[]", b"")
        if len(inner) == len(pairs):
            break  # brackets that do not pair up: counted below
        pairs = inner
    # Deeper (or unbalanced): an opening bracket as 2, a closing one as 0; after the first i of them, the
    # running sum less i is the depth there (openings less closings).
    steps = brackets.translate(_OPENING_AS_2)
    return max(map(operator.sub, accumulate(steps), count(1)), default=0)


def _brackets_outside_strings(text: bytes) -> bytes:
    """The brackets of JSON ``text`` outside its strings, in order. Escapes go first (escaped backslashes,
    then escaped quotes), so each quote left opens or closes a string; then all but quotes and brackets; then
    every two adjacent quotes (an empty string, or one string's end touching the next one's start: nothing
    outside a string lies between them). What is left between two quotes is a string's."""
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = unescaped.translate(None, _NOT_A_BRACKET_OR_QUOTE).replace(b'""', b"")
    if b'"' not in marks:
        return marks
    return b"".join(marks.split(b'"')[::2])


def check_json_depth(body: bytes) -> None:
    """Refuse (400) a JSON body nested deeper than :data:`MAX_JSON_DEPTH`, naming the body's field that
    holds the deepest part (``guided_json``, ``tools``, ``response_format``, ...) as ``param``."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:  # most bodies: too few brackets to nest so
        return
    depth = json_depth(body)
    if depth <= MAX_JSON_DEPTH:
        return
    field = _too_deep_field(body)
    where = f" in `{field}`" if field else ""
    raise ApiError(
        INVALID_REQUEST,
        f"The request body's JSON nests {depth} levels deep{where}; at most {MAX_JSON_DEPTH} are accepted.",
        param=field,
    )


def _too_deep_field(body: bytes) -> str | None:
    """The top-level field under which ``body`` first nests past the limit; None for a top-level array."""
    depth, key, in_object = 0, b"", False
    for match in _JSON_TOKEN.finditer(body):
        token = match.group()
        if token[0] == 0x22:  # a string: at level 1 of an object, the last one before a value is its key
            if depth == 1:
                key = token
        elif token in (b"[", b"{"):
            depth += 1
            in_object = in_object or (depth == 1 and token == b"{")
            if depth > MAX_JSON_DEPTH:
                break
        else:
            depth -= 1
    if not in_object or not key:
        return None
    try:
        return msgspec.json.decode(key, type=str)
    except msgspec.DecodeError:
        return None
