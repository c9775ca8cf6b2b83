"""Just enough HTTP/1.1 for the hostile region: read one request, frame a response head and chunks.

The hostile region breaks HTTP on purpose, so it writes raw bytes; this module keeps the part that must
stay correct (reading what the edge sends) small and bounded: a request head fits in
``MAX_HEAD_BYTES`` (the stream reader's limit), a body in ``MAX_BODY_BYTES``, and only Content-Length
bodies are read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
LAST_CHUNK = b"0\r\n\r\n"


@dataclass
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # names in lower case
    body: bytes
    keep_alive: bool


class HttpError(Exception):
    """A request this reader refuses; the connection answers ``status`` and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a connection, or None when the peer closed between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HttpError(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes") from None
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "bad header line")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise HttpError(400, "only Content-Length request bodies are read here")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise HttpError(400, "bad Content-Length")
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise HttpError(400, "request body shorter than its Content-Length") from None
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and "close" not in connection
    return Request(method, target.partition("?")[0], headers, body, keep_alive)


def response_head(status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of chunked transfer encoding."""
    return b"%x\r\n" % len(data) + data + b"\r\n"
