"""Request bodies under a size limit, whatever their ``Content-Encoding`` claims.

A body whose bytes are not the encoding it names is the client's error (400, never a 500 with a traceback);
an encoding we do not decode is 415; a body that inflates past the limit is 413, found while inflating it
in pieces of at most the limit, so a small "bomb" never costs its inflated size in memory.

Both Nearshore servers run with ``auto_decompress=False`` and hand us the raw bytes, which we inflate. A
server on aiohttp's default (it inflates gzip and deflate itself, bounded per read since aiohttp 3.12) is
served too: its ``ContentEncodingError`` becomes the same 400.
"""

from __future__ import annotations

import zlib

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
