"""A small HTTP/1.1 client for the edge's upstreams: keep-alive connections (pooled by edge/h1_pool.py),
one request at a time on each, a strict bounded response parser, and bodies delivered either pulled
(``read``) or pushed to a sink straight from ``data_received`` (a stream's events go to the client without
a coroutine wake-up each).

Why not aiohttp's client: per request it builds URL, header and trace objects the edge never needs, and per
body chunk it wakes a coroutine; for a proxy that relays thousands of small SSE events a second both add up.
The parser is strict on purpose (a region is trusted for nothing): a malformed head, chunk line or framing
fails the response with :class:`MalformedResponse` at once.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Protocol

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 1024
_STATUS_LINE_PREFIX = (b"HTTP/1.1 ", b"HTTP/1.0 ")
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class UpstreamClosed(ConnectionError):
    """The connection ended before the response did."""


class MalformedResponse(Exception):
    """The region answered something that is not HTTP/1.1 as this client speaks it."""


class ConnectionPool(Protocol):
    """What a connection needs of its pool (edge/h1_pool.py)."""

    def put_back(self, connection: H1Connection) -> None: ...

    def forget(self, connection: H1Connection) -> None: ...

    def refill(self) -> None: ...


class BodySink(Protocol):
    def data(self, chunk: bytes) -> None: ...

    def flush(self) -> None:
        """What the pieces of one read made is sent on now (a sink may gather them into one write)."""

    def end(self) -> None: ...

    def error(self, exc: BaseException) -> None: ...


class Response:
    """One response: its head at once, its body pulled with :meth:`read` or pushed with :meth:`push_to`."""

    def __init__(self, connection: H1Connection, status: int, headers: dict[str, str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers
        self.connect_s = 0.0  # time spent opening a new connection for this request (0: a pooled one)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
        self._ended = False
        self._exc: BaseException | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None else None

    @property
    def at_eof(self) -> bool:
        return self._ended and not self._chunks

    @property
    def complete(self) -> bool:
        """The whole body has arrived (it may not have been read yet)."""
        return self._ended

    # --- fed by the connection ------------------------------------------------------------------------

    def _feed(self, chunk: bytes) -> None:
        if self._sink is not None:
            self._sink.data(chunk)
        else:
            self._chunks.append(chunk)
            self._wake()
            if len(self._chunks) > 64:
                self.pause()  # the reader is behind: do not buffer without bound

    def _end(self) -> None:
        self._ended = True
        if self._sink is not None:
            self._sink.end()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._ended or self._exc is not None:
            return
        self._exc = exc
        if self._sink is not None:
            self._sink.error(exc)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- the caller's side ------------------------------------------------------------------------------

    async def read(self) -> bytes:
        """The next piece of the body; b"" at its end. Raises what broke it."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        if len(self._chunks) < 16:
            self._connection.resume_reading()  # in case a backlog paused it
        return chunk

    def push_to(self, sink: BodySink) -> None:
        """Deliver the rest of the body to ``sink`` as it arrives (what was already read first)."""
        self._sink = sink
        while self._chunks:
            sink.data(self._chunks.popleft())
        sink.flush()
        if self._exc is not None:
            sink.error(self._exc)
        elif self._ended:
            sink.end()

    def pause(self) -> None:
        self._connection.pause_reading()

    def resume(self) -> None:
        self._connection.resume_reading()

    def abort(self, exc: BaseException) -> None:
        """Fail the body with ``exc`` (a timeout, say) and drop the connection."""
        self._fail(exc)
        self._connection.close()

    def close(self) -> None:
        """Done with it: the connection returns to its pool once the body has ended, else it is dropped."""
        self._sink = None
        self._chunks.clear()
        if not self._ended:
            healthy = self._exc is None and not self._connection.closed  # we stop reading; it did not fail
            self._connection.close()
            if healthy:
                self._connection.pool.refill()

    async def finish(self, seconds: float) -> None:
        """Done with it, but its end may still be on the way (a chunked terminator trailing the last event):
        wait up to ``seconds`` for it, so the connection returns to its pool, then drop it if it did not."""
        self._sink = None
        self._chunks.clear()
        if not self._ended and self._exc is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(seconds):
                    while not self._ended and self._exc is None:
                        await self._waiter
                        self._waiter = asyncio.get_running_loop().create_future()
            except TimeoutError:
                pass
            finally:
                self._waiter = None
        self.close()


class H1Connection(asyncio.Protocol):
    """One connection, one request at a time; its parser is a small state machine over the bytes read."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._head_waiter: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._state = "idle"  # idle, head, length, chunk-size, chunk-data, chunk-crlf, trailers, eof-body
        self._remaining = 0
        self._keep_alive = True
        self._paused = False
        self.idle_since = time.monotonic()

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.closed:  # uvloop's transports are not asyncio.Transport subclasses: no isinstance here
            self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._state == "idle":
            self.close()  # bytes nobody asked for: this connection cannot be trusted with the next request
            return
        response = self._response  # the body's sink hears of the read's end, even if the body ended in it
        if self._state == "chunk-size" and not self._buffer:
            data = self._whole_chunks(data)
        if data:
            self._buffer += data
            try:
                self._parse()
            except MalformedResponse as exc:
                self._fail(exc)
        if response is not None and response._sink is not None:
            response._sink.flush()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.transport = None
        self.pool.forget(self)
        if self._state == "eof-body" and self._response is not None:
            self._response._end()
        elif self._state != "idle":
            self._fail(UpstreamClosed(f"the region closed the connection ({exc or 'EOF'})"))

    # --- requests ---------------------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None and self._state == "idle"
        self._state, self._keep_alive = "head", True
        self._head_waiter = asyncio.get_running_loop().create_future()
        self.transport.write(head + body)
        return self._head_waiter

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()  # no TLS goodbye: the peer may be the reason we leave
        self.pool.forget(self)

    def pause_reading(self) -> None:
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._paused:
            self._paused = False
            self.transport.resume_reading()

    def _fail(self, exc: BaseException) -> None:
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self._response is not None:
            self._response._fail(exc)
        self._state = "failed"
        self.close()

    # --- the parser -------------------------------------------------------------------------------------

    def _parse(self) -> None:
        while self._buffer and self._state not in ("idle", "failed"):
            if self._state == "head":
                if not self._parse_head():
                    return
            elif self._state == "length":
                self._deliver(min(self._remaining, len(self._buffer)))
                if self._remaining == 0:
                    self._finish()
            elif self._state == "eof-body":
                self._deliver(len(self._buffer))
            elif self._state == "chunk-size":
                if not self._parse_chunk_size():
                    return
            elif self._state == "chunk-data":
                self._deliver(min(self._remaining, len(self._buffer)))
                if self._remaining == 0:
                    self._state = "chunk-crlf"
            elif self._state == "chunk-crlf":
                if len(self._buffer) < 2:
                    return
                if self._buffer[:2] != b"\r\n":
                    raise MalformedResponse("a chunk did not end with CRLF")
                del self._buffer[:2]
                self._state = "chunk-size"
            elif self._state == "trailers" and not self._skip_trailers():
                return

    def _deliver(self, n: int) -> None:
        chunk = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._remaining -= n
        if chunk and self._response is not None:
            self._response._feed(chunk)

    def _parse_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise MalformedResponse(f"a response head larger than {MAX_HEAD_BYTES} bytes")
            return False
        head = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        status, headers = _parse_head(head)
        if 100 <= status < 200:
            return True  # an interim response (100 Continue): the real one follows
        self._keep_alive = (
            head.startswith(b"HTTP/1.1") and "close" not in headers.get("connection", "").lower()
        )
        response = Response(self, status, headers)
        self._response = response
        encoding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if encoding is not None:
            if encoding.strip().lower() != "chunked" or length is not None:
                raise MalformedResponse(f"an unsupported framing (Transfer-Encoding: {encoding!r})")
            self._state = "chunk-size"
        elif status in (204, 304):
            self._state, self._remaining = "length", 0
        elif length is not None:
            if not length.isdigit() or len(length) > 18:
                raise MalformedResponse(f"a bad Content-Length: {length!r}")
            self._state, self._remaining = "length", int(length)
        else:
            self._state, self._keep_alive = "eof-body", False
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        if self._state == "length" and self._remaining == 0:
            self._finish()
        return True

    def _whole_chunks(self, data: bytes) -> bytes:
        """A stream's common case, read straight from ``data`` (no round trip through the buffer): whole
        chunks at its front, each with a plain size line, are delivered; the rest (a chunk cut short, the
        last chunk, anything unusual) is returned for the parser, which checks it strictly."""
        pos, n = 0, len(data)
        while self._state == "chunk-size" and not self.closed:
            end = data.find(b"\r\n", pos, pos + 18)
            if end <= pos:
                break
            line = data[pos:end]
            if line.strip(_HEX_DIGITS):  # an extension, a bad digit: the parser's to judge
                break
            size = int(line, 16)
            stop = end + 2 + size
            if size == 0 or stop + 2 > n or data[stop : stop + 2] != b"\r\n":
                break
            pos = stop + 2
            if self._response is not None:
                self._response._feed(data[end + 2 : stop])
        return data[pos:] if pos else data

    def _parse_chunk_size(self) -> bool:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > MAX_CHUNK_LINE:
                raise MalformedResponse("a chunk-size line that never ends")
            return False
        line = bytes(self._buffer[:end]).partition(b";")[0].strip()
        del self._buffer[: end + 2]
        if not line or len(line) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in line):
            raise MalformedResponse(f"a bad chunk-size line: {line[:40]!r}")
        size = int(line, 16)
        if size == 0:
            self._state = "trailers"
        else:
            self._state, self._remaining = "chunk-data", size
        return True

    def _skip_trailers(self) -> bool:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise MalformedResponse("trailers that never end")
            return False
        del self._buffer[: end + 2]
        if end == 0:
            self._finish()
        return True

    def _finish(self) -> None:
        response, self._response = self._response, None
        self._state = "idle"
        reusable = self._keep_alive and not self._buffer
        if response is not None:
            response._end()
        if reusable:
            self.resume_reading()
            self.idle_since = time.monotonic()
            self.pool.put_back(self)
        else:
            self.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(_STATUS_LINE_PREFIX) or len(status_line) < 12:
        raise MalformedResponse(f"not an HTTP/1.1 status line: {status_line[:40]!r}")
    code = status_line[9:12]
    if not code.isdigit():
        raise MalformedResponse(f"a bad status code: {code!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise MalformedResponse(f"a bad header line: {line[:40]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        if key not in headers:
            headers[key] = text
        elif key in ("content-length", "transfer-encoding"):
            if headers[key] != text:
                raise MalformedResponse(f"conflicting {key} headers")
        else:
            headers[key] = f"{headers[key]}, {text}"
    return int(code), headers
