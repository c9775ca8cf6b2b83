"""The edge's HTTP/1.1 client against scripted servers: framing, pooling, and refusing what is not HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from edge.h1 import MalformedResponse, UpstreamClosed
from edge.h1_pool import H1Pool


async def scripted(
    answers: list[bytes], close_after: bool = False
) -> AsyncIterator[tuple[H1Pool, list[int]]]:
    """A server that answers each request on a connection with the next scripted bytes."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(answers.pop(0))
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool("127.0.0.1", port, None, max_idle=4, keepalive_s=60, connect_timeout_s=2)
    try:
        yield pool, connections
    finally:
        pool.close()
        server.close()


async def body(pool: H1Pool) -> tuple[int, bytes]:
    response = await asyncio.wait_for(pool.request("POST", "/x", {"a": "b"}, b"{}"), 2)
    parts = []
    while chunk := await asyncio.wait_for(response.read(), 2):
        parts.append(chunk)
    response.close()
    return response.status, b"".join(parts)


async def test_length_and_chunked_bodies_reuse_one_connection():
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    ]
    async for pool, connections in scripted(answers):
        assert await body(pool) == (200, b"hello")
        assert await body(pool) == (200, b"hello world")
        assert pool.idle_connections == 1  # back in the pool after each answer
        assert await body(pool) == (204, b"")
        assert len(connections) == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",  # a bad chunk-size line
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",  # smuggling
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"<html>not http</html>\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",  # no CRLF after data
    ],
)
async def test_what_is_not_http_fails_at_once(answer: bytes):
    async for pool, _ in scripted([answer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]):
        with pytest.raises(MalformedResponse):
            await body(pool)
        assert pool.idle_connections == 0  # that connection is never used again
        assert await body(pool) == (200, b"ok")  # a new one serves the next request


async def test_a_head_without_end_is_bounded():
    async for pool, _ in scripted([b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000]):
        with pytest.raises(MalformedResponse, match="head larger"):
            await body(pool)


async def test_a_body_cut_short_is_an_error_not_a_short_answer():
    async for pool, _ in scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"], close_after=True):
        with pytest.raises(UpstreamClosed):
            await body(pool)


async def test_a_body_until_close_is_read_to_its_end_and_not_pooled():
    async for pool, _ in scripted([b"HTTP/1.1 200 OK\r\n\r\nall of it"], close_after=True):
        assert await body(pool) == (200, b"all of it")
        assert pool.idle_connections == 0


async def silent_server(first_bytes: bytes) -> tuple[asyncio.Server, list[int]]:
    """A server that answers each request with ``first_bytes`` and then nothing more (a slow region)."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(first_bytes)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), connections


async def idle_soon(pool: H1Pool, n: int) -> None:
    for _ in range(200):
        if pool.idle_connections >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{pool.idle_connections} idle connections, not {n}")


@pytest.mark.parametrize("abandon", ["before the head", "before the body's end"])
async def test_a_connection_dropped_with_an_abandoned_request_is_replaced(abandon: str):
    head = b"" if abandon == "before the head" else b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nabc"
    server, connections = await silent_server(head)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool("127.0.0.1", port, None, max_idle=4, keepalive_s=60, connect_timeout_s=2, keep_warm=1)
    try:
        if abandon == "before the head":
            request = asyncio.ensure_future(pool.request("POST", "/x", {}, b"{}"))
            await asyncio.sleep(0.05)
            request.cancel()  # a cache hit won the race: the region's request goes
            with pytest.raises(asyncio.CancelledError):
                await request
        else:
            response = await asyncio.wait_for(pool.request("POST", "/x", {}, b"{}"), 2)
            response.close()  # the client left mid-answer
        await idle_soon(pool, 1)  # a spare stands ready: the next request pays no handshake
        assert len(connections) == 2
        pool.refill()  # never more than keep_warm idle
        await asyncio.sleep(0.05)
        assert pool.idle_connections == 1 and len(connections) == 2
    finally:
        pool.close()
        server.close()


async def test_a_connection_the_region_broke_is_not_replaced_in_the_background():
    async for pool, connections in scripted([b"<html>not http</html>\r\n\r\n"]):
        pool.keep_warm = 1
        with pytest.raises(MalformedResponse):
            await body(pool)
        await asyncio.sleep(0.1)
        assert pool.idle_connections == 0 and len(connections) == 1  # the probes judge a broken region


class _Pool:
    def __init__(self) -> None:
        self.back: list[object] = []

    def put_back(self, connection: object) -> None:
        self.back.append(connection)

    def forget(self, connection: object) -> None:
        pass

    def refill(self) -> None:
        pass


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Sink:
    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.flushed_after: list[int] = []  # how many pieces had come at each flush
        self.ended = False
        self.failed: BaseException | None = None

    def data(self, chunk: bytes) -> None:
        self.pieces.append(chunk)

    def flush(self) -> None:
        self.flushed_after.append(len(self.pieces))

    def end(self) -> None:
        self.ended = True

    def error(self, exc: BaseException) -> None:
        self.failed = exc


async def streamed(pieces: list[bytes]) -> tuple[_Sink, _Pool]:
    """A chunked response fed to one connection piece by piece, as a region's stream arrives."""
    from edge.h1 import H1Connection

    pool = _Pool()
    connection = H1Connection(pool)  # type: ignore[arg-type]
    connection.connection_made(_Transport())  # type: ignore[arg-type]
    waiter = connection.send(b"POST / HTTP/1.1\r\n\r\n", b"")
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    sink = _Sink()
    (await waiter).push_to(sink)
    for piece in pieces:
        connection.data_received(piece)
    return sink, pool


async def test_whole_chunks_in_a_piece_are_delivered_one_by_one_and_cut_ones_wait_for_the_rest():
    sink, pool = await streamed(
        [b"5\r\nhello\r\n", b"1\r\n \r\n5\r\nworld\r\n3\r\nab", b"c\r\n2;x=1\r\nde\r\n", b"0\r\n\r\n"]
    )
    assert sink.pieces == [b"hello", b" ", b"world", b"ab", b"c", b"de"] and sink.failed is None
    assert sink.ended and len(pool.back) == 1  # the terminator read: the connection is reusable
    # The sink hears of each read's end once, after that read's whole chunks: it may write them as one.
    assert sink.flushed_after == [0, 1, 4, 6, 6]  # push_to's, then one per read (the last brought none)


@pytest.mark.parametrize(
    "piece",
    [b"5\r\nhelloXX", b"0x5\r\nhello\r\n", b"5\r\nhello\r\n\r\n", b"1_0\r\n" + b"x" * 16 + b"\r\n"],
)
async def test_a_bad_chunk_in_a_piece_fails_the_response(piece: bytes):
    sink, pool = await streamed([piece])
    assert isinstance(sink.failed, MalformedResponse) and not pool.back


async def test_refill_tops_the_spares_up_to_keep_warm_and_replaces_those_lost_or_past_keepalive():
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read()  # until the edge or the test closes it

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool("127.0.0.1", port, None, max_idle=8, keepalive_s=60, connect_timeout_s=2, keep_warm=3)
    try:
        pool.refill()
        await idle_soon(pool, 3)
        pool.refill()  # three stand idle already: nothing more is opened
        await asyncio.sleep(0.05)
        assert pool.idle_connections == 3 and len(writers) == 3
        for writer in writers:  # the region restarted: every connection it held is gone
            writer.close()
        for _ in range(200):
            if pool.idle_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert pool.idle_connections == 0
        pool.refill()
        await idle_soon(pool, 3)
        assert pool.idle_connections == 3 and len(writers) == 6
        pool.keepalive_s = 0.0  # every idle one is now too old for a request to take
        pool.refill()
        await idle_soon(pool, 3)
        assert pool.idle_connections == 3 and len(writers) == 9
    finally:
        pool.close()
        server.close()
