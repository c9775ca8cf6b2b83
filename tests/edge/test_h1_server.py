"""The lean HTTP/1.1 server core (edge/h1_server.py): plainly framed requests on hot routes are its own;
anything else goes, bytes untouched, to aiohttp's server on the same connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from edge.h1_server import Exchange, H1Server, Handler, Limits, parse_head

HOT = "/v1/hot"


def test_a_plain_head_parses():
    request = parse_head(b"POST /v1/hot?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Key:  v ")
    assert request is not None
    assert (request.method, request.target, request.length, request.keep_alive) == (
        "POST",
        "/v1/hot?x=1",
        5,
        True,
    )
    assert request.headers["x-key"] == "v" and request.headers["HOST"] == "a"


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"POST / HTTP/1.1\r\nHost: a\r\nConnection: close", False),
        (b"POST / HTTP/1.0", False),  # 1.0 gets its answer and the connection closes
        (b"POST / HTTP/1.0\r\nConnection: keep-alive", False),
        (b"POST / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive", True),
    ],
)
def test_keep_alive_follows_the_version_and_connection(head: bytes, keep_alive: bool):
    request = parse_head(head)
    assert request is not None and request.keep_alive is keep_alive


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5",  # two lengths
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue",
        b"POST / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket",
        b"POST / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded",
        b"POST / HTTP/1.1\r\nHost: a\r\nBad Name: 1",
        b"POST / HTTP/1.1\r\nHost: a\r\nX-A: 1\nX-B: 2",  # a bare LF
        b"POST / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b",
        b"POST http://elsewhere/ HTTP/1.1",
        b"POST / HTTP/2.0",
        b"POST /  HTTP/1.1",
        b"P(ST / HTTP/1.1",
        b"POST / HTTP/1.1\r\nContent-Length: 0",  # no Host
    ],
)
def test_what_the_lean_path_does_not_judge_goes_to_aiohttp(head: bytes):
    assert parse_head(head) is None


# --- a real server on loopback ------------------------------------------------------------------------------


class Served:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()


async def _echo(exchange: Exchange) -> None:
    body = json.dumps(
        {"key": exchange.headers.get("x-key"), "size": len(exchange.body), "query": exchange.query}
    )
    exchange.reply(200, {"Content-Type": "application/json", "Served-By": "lean"}, body.encode())


async def _stream(exchange: Exchange) -> None:
    exchange.start(200, {"Content-Type": "text/event-stream"})
    for i in range(3):
        exchange.write(b"data: %d\n\n" % i)
        await asyncio.sleep(0)
    exchange.end(b"data: [DONE]\n\n")


async def _fail(exchange: Exchange) -> None:
    raise RuntimeError("a handler's bug")


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Served]]:
    served = Served()

    async def hang(exchange: Exchange) -> None:
        served.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            served.cancelled.set()
            raise

    async def by_aiohttp(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"size": len(body)}, headers={"Served-By": "aiohttp"})

    app = web.Application(client_max_size=1024)
    app.router.add_route("*", "/{tail:.*}", by_aiohttp)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    handlers: dict[str, Handler] = {HOT: _echo, "/v1/stream": _stream, "/v1/fail": _fail, "/v1/hang": hang}

    def route(method: str, path: str) -> Handler | None:
        return handlers.get(path) if method == "POST" else None

    assert runner.server is not None
    fallback = runner.server
    limits = Limits(max_body_bytes=512, head_timeout_s=0.2)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: H1Server(route, fallback, limits), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", served
    listener.close()
    await runner.cleanup()


async def test_a_hot_route_is_served_by_the_lean_path_and_the_rest_by_aiohttp(server):
    url, _ = server
    async with aiohttp.ClientSession() as session:
        async with session.post(url + HOT + "?a=b", data=b"12345", headers={"X-Key": "k"}) as r:
            assert r.status == 200 and r.headers["Served-By"] == "lean"
            assert await r.json() == {"key": "k", "size": 5, "query": "a=b"}
        # the same kept-alive connection, a route that is not hot: aiohttp answers it
        async with session.get(url + "/elsewhere") as r:
            assert r.status == 200 and r.headers["Served-By"] == "aiohttp"
    # a new connection: the last one is aiohttp's now
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/stream", data=b"{}") as r:
        assert r.headers["Transfer-Encoding"] == "chunked"
        assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


async def _raw(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)  # its last request asks to close: the answer ends with the connection
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


async def test_pipelined_requests_are_answered_in_order_and_the_connection_hands_over_once(server):
    url, _ = server
    hot = b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nX-Key: %s\r\nContent-Length: 2\r\n\r\n{}"
    other = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
    answer = await _raw(
        url,
        hot % b"one"
        + hot % b"two"
        + other
        + hot % b"three"
        + b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    heads = [part for part in answer.split(b"HTTP/1.1 ") if part]
    assert len(heads) == 5
    assert b'"key": "one"' in heads[0] and b'"key": "two"' in heads[1]
    assert b"Served-By: lean" in heads[0] and b"Served-By: lean" in heads[1]
    # from the first request it does not take, aiohttp has the connection: the hot route too
    assert all(b"Served-By: aiohttp" in part for part in heads[2:])


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        # chunked: aiohttp decodes it
        (
            b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n",
            b"200",
        ),
        # a body past the limit: aiohttp says 413
        (
            b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2000\r\n\r\n"
            + b"x" * 2000,
            b"413",
        ),
        # two lengths: aiohttp refuses the request
        (b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", b"400"),
        # a malformed head
        (b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\nContent-Length: 2\r\n\r\n{}", b"400"),
    ],
)
async def test_what_the_lean_path_hands_over_aiohttp_answers(server, request_bytes: bytes, status: bytes):
    url, _ = server
    answer = await _raw(url, request_bytes)
    assert answer.split(b" ", 2)[1] == status
    assert b"Served-By: lean" not in answer


async def test_a_client_that_leaves_cancels_its_handler(server):
    url, served = server
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/hang HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    await asyncio.wait_for(served.entered.wait(), 30)
    writer.transport.abort()
    await asyncio.wait_for(served.cancelled.wait(), 30)


async def test_a_failing_handler_answers_500_and_the_server_serves_on(server):
    url, _ = server
    answer = await _raw(url, b"POST /v1/fail HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500") and b"Connection: close" in answer
    assert b'"code":"internal_error"' in answer
    async with aiohttp.ClientSession() as session, session.post(url + HOT, data=b"{}") as r:
        assert r.status == 200


async def test_a_head_that_never_ends_is_cut_off(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/hot HTTP/1.1\r\nHost: a\r\nX-Slow: ")
    assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server, nothing answered
    writer.close()
