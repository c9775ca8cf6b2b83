"""Server-sent events as OpenAI streams them: ``data: {...}\\n\\n`` chunks, then ``data: [DONE]``.

Framing (the producers' side) and :class:`SseParser`, the one reader of such streams. It reads SSE as the
spec does, except that only ``\\n`` and ``\\r\\n`` end a line: a lone ``\\r`` stays in its line (no OpenAI
server sends one).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import msgspec

from nearshore.protocol.errors import ApiError
from nearshore.protocol.schemas import json_encoder

DONE = b"data: [DONE]\n\n"
DONE_DATA = b"[DONE]"  # the last event's data
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: msgspec.Struct) -> bytes:
    return b"data: " + json_encoder.encode(payload) + b"\n\n"


def error(exc: ApiError) -> bytes:
    """An error as a stream's event, once its head (status 200) has gone: ``data: {"error": {...}}``."""
    return b"data: " + exc.to_json() + b"\n\n"


def comment(text: str = "") -> bytes:
    """An SSE comment: clients ignore it; it keeps idle hops from timing out."""
    return b": " + text.encode() + b"\n\n"


# --- reading ------------------------------------------------------------------------------------------


def event_data(block: bytes) -> bytes | None:
    """The data of one event (its lines, ``\\n``-ended, without the blank line that ends it): its ``data``
    lines joined by ``\\n``, one space after the colon taken off; None when it has no data line (a comment,
    or only ``event:``/``id:``/``retry:`` fields, which OpenAI never sends)."""
    if block.startswith(b"data:") and b"\n" not in block:  # nearly every event: one data line
        return block[6:] if block[5:6] == b" " else block[5:]
    data = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if field == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


def odd_line(block: bytes) -> bytes | None:
    """The first line of an event that is none of the fields a stream may carry (data, event, id, retry
    or a comment), for a reader that distrusts its source; None when every line is one."""
    for line in block.split(b"\n"):
        if line.strip() and not line.startswith((b"data:", b":", b"event:", b"id:", b"retry:")):
            return line
    return None


class SseParser:
    """Reads one SSE body fed in pieces as they arrive, cut anywhere (mid-line, mid-``\\r\\n``): each
    :meth:`feed` returns what the events the piece completed hold. An event ends at a blank line, so the
    body's last one may be left unfinished: the spec drops it, and so does a caller that stops at the last
    feed; :meth:`close` gives it to a caller that reads leniently."""

    __slots__ = ("_buffer", "_cr")

    def __init__(self) -> None:
        self._buffer = bytearray()  # the unfinished event, its line ends made ``\n``
        self._cr = False  # the last piece ended in ``\r``: half of a ``\r\n``, perhaps

    @property
    def pending(self) -> int:
        """Bytes of the unfinished event (for a reader that bounds an event's size)."""
        return len(self._buffer)

    @property
    def idle(self) -> bool:
        """Nothing unfinished is held: the next piece starts a new event (its lines need no earlier bytes)."""
        return not self._buffer and not self._cr

    def one_line_data(self, piece: bytes) -> bytes | None:
        """The data of ``piece``, stripped, when it is one whole event of one ``data:`` line and nothing
        unfinished is held: nearly every piece of a stream, read without a split or a copy of the piece.
        None when it is anything else (:meth:`blocks` reads it then)."""
        if not self.idle or not piece.startswith(b"data:"):
            return None
        if piece.find(b"\n") != len(piece) - 2 or not piece.endswith(b"\n\n"):
            return None
        return piece[5:-2].strip()  # the optional space after the colon, and a CR, go with the strip

    def blocks(self, piece: bytes) -> list[bytes]:
        """The events ``piece`` completed, each as its lines (``\\n``-ended, the blank line left off)."""
        if self._cr:
            piece, self._cr = b"\r" + piece, False
        if b"\r" in piece:
            if piece.endswith(b"\r"):
                piece, self._cr = piece[:-1], True
            piece = piece.replace(b"\r\n", b"\n")
        buffer = self._buffer
        if not buffer and piece.endswith(b"\n\n"):  # whole events, as a region writes them: no copy
            return piece[:-2].split(b"\n\n")
        start = max(len(buffer) - 1, 0)  # a blank line may begin at the end of what came before
        buffer += piece
        end = buffer.rfind(b"\n\n", start)
        if end < 0:
            return []
        whole = bytes(buffer[:end])
        del buffer[: end + 2]
        return whole.split(b"\n\n")

    def feed(self, piece: bytes) -> list[bytes]:
        """The data of each event ``piece`` completed (``[DONE]`` included), in order."""
        found = []
        for block in self.blocks(piece):
            if block.startswith(b"data: ") and b"\n" not in block:  # event_data's commonest case, inline
                found.append(block[6:])
            elif (data := event_data(block)) is not None:
                found.append(data)
        return found

    def close(self) -> bytes | None:
        """The data of the event the body ended in, without its blank line; None when there is none."""
        rest = bytes(self._buffer)  # a last ``\r`` held back ends the body's last line: dropped
        self._buffer.clear()
        self._cr = False
        return event_data(rest) if rest else None


def parse(body: bytes) -> list[bytes]:
    """The data of every event of a whole body, an unfinished last one included."""
    parser = SseParser()
    found = parser.feed(body)
    if (last := parser.close()) is not None:
        found.append(last)
    return found


async def iter_data(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's ``data`` payload (``[DONE]`` included) from a byte stream in any pieces (lines,
    as aiohttp's ``response.content`` yields them, or reads); an unfinished last event too."""
    parser = SseParser()
    async for piece in chunks:
        for data in parser.feed(piece):
            yield data
    if (last := parser.close()) is not None:
        yield last
