"""Server-sent events as OpenAI streams them: ``data: {...}\\n\\n`` chunks, then ``data: [DONE]``."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import msgspec

from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import json_encoder

DONE = b"data: [DONE]\n\n"
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: msgspec.Struct) -> bytes:
    return b"data: " + json_encoder.encode(payload) + b"\n\n"


def error(exc: ApiError) -> bytes:
    """An error as a stream's event, once its head (status 200) has gone: ``data: {"error": {...}}``."""
    return b"data: " + exc.to_json() + b"\n\n"


def comment(text: str = "") -> bytes:
    """An SSE comment: clients ignore it; it keeps idle hops from timing out."""
    return b": " + text.encode() + b"\n\n"


async def iter_data(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's ``data`` payload (``[DONE]`` included) from a byte stream split into lines."""
    data: list[bytes] = []
    async for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if field == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)
