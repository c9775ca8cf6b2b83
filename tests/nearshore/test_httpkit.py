"""The aiohttp kit every Nearshore service uses (nearshore/httpkit.py), on real servers on loopback: request
ids (the caller's when sane, the region's way; always the server's own with the caller's kept apart, the
edge's way), every failure leaving OpenAI-shaped with its status and the process serving on, JSON bodies
decoded with their errors' ``param``, and ``serve`` binding, answering and stopping."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import aiohttp
import msgspec
import pytest
from aiohttp import web
from multidict import CIMultiDict

from nearshore.api_runner import ApiRunner
from nearshore.bodies import BROKEN_BODY
from nearshore.httpkit import (
    CLIENT_REQUEST_ID_KEY,
    close_unframed,
    error_response,
    install_uvloop,
    metrics_response,
    minted_request_ids,
    openai_errors,
    read_json,
    request_id_of,
    request_ids,
    serve,
)
from nearshore.listen import BindError
from nearshore.protocol.errors import RATE_LIMITED, ApiError
from nearshore.protocol.headers import CLIENT_REQUEST_ID, PROMETHEUS_CONTENT_TYPE, REQUEST_ID

LIMIT = 2048
TIMEOUT = aiohttp.ClientTimeout(total=10)
HEX32 = re.compile(r"^[0-9a-f]{32}$")


class Body(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    count: Annotated[int, msgspec.Meta(ge=0)] = 0


body_decoder = msgspec.json.Decoder(Body)


async def ids(request: web.Request) -> web.Response:
    return web.json_response(
        {"id": request_id_of(request), "client": request.get(CLIENT_REQUEST_ID_KEY)}, headers={"x-seen": "1"}
    )


async def api_error(request: web.Request) -> web.Response:
    raise ApiError(RATE_LIMITED, "Slow down.", param="model", retry_after_s=1.2, headers={"x-extra": "yes"})


async def broken(request: web.Request) -> web.Response:
    request[BROKEN_BODY] = True  # as read_body marks a body it could not read to its end
    raise ApiError(RATE_LIMITED, "Slow down.")


async def boom(request: web.Request) -> web.Response:
    raise RuntimeError("a secret detail of the server")


async def forbidden(request: web.Request) -> web.Response:
    raise web.HTTPForbidden(text="No entry here.")


async def forbidden_plain(request: web.Request) -> web.Response:
    raise web.HTTPForbidden()


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ids")


async def stream(request: web.Request) -> web.StreamResponse:
    response = close_unframed(request, web.StreamResponse(headers={"x-streamed": "1"}))
    await response.prepare(request)
    await response.write(b"data: 1\n\n")
    await response.write_eof()
    return response


async def decode(request: web.Request) -> web.Response:
    body = await read_json(request, body_decoder)
    return web.json_response({"name": body.name, "count": body.count})


def app_with(*middlewares) -> web.Application:
    app = web.Application(middlewares=list(middlewares), client_max_size=LIMIT)
    app.router.add_get("/ids", ids)
    app.router.add_get("/api-error", api_error)
    app.router.add_get("/broken", broken)
    app.router.add_get("/boom", boom)
    app.router.add_get("/forbidden", forbidden)
    app.router.add_get("/forbidden-plain", forbidden_plain)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/stream", stream)
    app.router.add_post("/json", decode)
    return app


@asynccontextmanager
async def serving(app: web.Application, auto_decompress: bool = False) -> AsyncIterator[str]:
    runner = ApiRunner(app, auto_decompress=auto_decompress, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def region() -> AsyncIterator[str]:
    """The region's middlewares: the caller's request id when sane."""
    async with serving(app_with(request_ids, openai_errors)) as url:
        yield url


@pytest.fixture
async def edge() -> AsyncIterator[str]:
    """The edge's: always an id of its own."""
    async with serving(app_with(minted_request_ids, openai_errors)) as url:
        yield url


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT, auto_decompress=False) as session:
        yield session


async def get(session: aiohttp.ClientSession, url: str, **kw) -> tuple[int, CIMultiDict, object]:
    async with session.get(url, allow_redirects=False, **kw) as r:
        body = await r.json() if r.content_type == "application/json" else await r.read()
        return r.status, r.headers.copy(), body


async def post_json(session, url: str, data, content_type: str | None = "application/json", **headers):
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with session.post(url, data=data, headers=headers) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.read())


# --- request ids -----------------------------------------------------------------------------------------


async def test_the_region_keeps_a_sane_caller_id_and_echoes_it(region, client):
    status, headers, body = await get(client, region + "/ids", headers={REQUEST_ID: "edge-1.a:b_c"})
    assert status == 200 and body["id"] == "edge-1.a:b_c" and headers[REQUEST_ID] == "edge-1.a:b_c"


@pytest.mark.parametrize("given", ["", "has space", "x" * 129, "semi;colon", "new\u00e9"])
async def test_the_region_replaces_an_insane_caller_id_with_its_own(region, client, given):
    headers = {REQUEST_ID: given} if given.isascii() else {REQUEST_ID: given.encode().decode("latin-1")}
    status, sent, body = await get(client, region + "/ids", headers=headers)
    assert status == 200 and HEX32.match(body["id"]) and sent[REQUEST_ID] == body["id"]


async def test_the_edge_mints_its_own_id_and_keeps_the_callers_apart(edge, client):
    first = await get(client, edge + "/ids", headers={REQUEST_ID: "mine"})
    second = await get(client, edge + "/ids", headers={REQUEST_ID: "mine"})
    for status, headers, body in (first, second):
        assert status == 200 and HEX32.match(body["id"]) and headers[REQUEST_ID] == body["id"]
        assert body["client"] == "mine" and headers[CLIENT_REQUEST_ID] == "mine"
    assert first[2]["id"] != second[2]["id"]  # two users choosing one id never address each other's requests


async def test_the_edge_prefers_x_client_request_id_and_drops_an_insane_one(edge, client):
    _, headers, body = await get(client, edge + "/ids", headers={CLIENT_REQUEST_ID: "c-1", REQUEST_ID: "r-1"})
    assert body["client"] == "c-1" and headers[CLIENT_REQUEST_ID] == "c-1"
    _, headers, body = await get(client, edge + "/ids", headers={CLIENT_REQUEST_ID: "no good"})
    assert body["client"] == "" and CLIENT_REQUEST_ID not in headers and HEX32.match(headers[REQUEST_ID])


async def test_a_response_already_streaming_is_left_as_it_is(region, edge, client):
    for url in (region, edge):
        status, headers, body = await get(client, url + "/stream")
        assert status == 200 and body == b"data: 1\n\n" and headers["x-streamed"] == "1"
        assert REQUEST_ID not in headers  # too late to add a header: no error either


# --- errors --------------------------------------------------------------------------------------------


async def test_an_api_error_leaves_openai_shaped_with_its_status_headers_and_request_id(region, client):
    status, headers, body = await get(client, region + "/api-error", headers={REQUEST_ID: "rid-7"})
    assert status == 429 and headers["Content-Type"].startswith("application/json")
    assert body == {
        "error": {
            "message": "Slow down.",
            "type": "rate_limit_error",
            "param": "model",
            "code": "rate_limit_exceeded",
        }
    }
    assert headers["Retry-After"] == "2" and headers["x-extra"] == "yes" and headers[REQUEST_ID] == "rid-7"
    assert headers.get("Connection", "").lower() != "close"


async def test_a_request_whose_body_broke_gets_its_error_and_a_closed_connection(region, client):
    status, headers, body = await get(client, region + "/broken")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded"
    assert headers["Connection"].lower() == "close"


async def test_an_unhandled_exception_is_a_500_that_tells_nothing_and_the_server_serves_on(
    region, client, caplog
):
    with caplog.at_level(logging.ERROR, logger="nearshore.http"):
        status, headers, body = await get(client, region + "/boom", headers={REQUEST_ID: "rid-9"})
    assert status == 500 and headers[REQUEST_ID] == "rid-9"
    assert body == {
        "error": {
            "message": "The server had an error processing your request.",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret detail" not in str(body)
    record = next(r for r in caplog.records if r.name == "nearshore.http")
    assert record.getMessage() == "unhandled error in GET /boom" and record.exc_info is not None
    assert (await get(client, region + "/ids"))[0] == 200


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"GET /ids HTTP/1.1\r\nHost: x\r\nX-Key: ns-secret\x00\r\n\r\n", "Invalid header value char"),
        (b"GET /ids HTTP/1.1\r\nX-Big: " + b"ns-secret" * 2000 + b"\r\n\r\n", "Got more than"),
        (b"POST /json HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", "can't be"),
    ],
)
async def test_a_request_that_is_not_http_gets_the_apis_400_without_its_bytes(region, raw, words):
    """aiohttp refuses it before any handler or middleware runs; the runner answers in the API's shape."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(region.rsplit(":", 1)[1]))
    try:
        writer.write(raw)
        answer = await asyncio.wait_for(reader.read(), 30)  # the connection is closed after it
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert (
        head.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        and b"content-type: application/json" in head.lower()
    )
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"]
    assert b"ns-secret" not in answer
    async with aiohttp.ClientSession() as session:  # and it serves on
        assert (await get(session, region + "/ids"))[0] == 200


async def test_a_stream_to_an_http10_client_ends_with_its_connection(region):
    """HTTP/1.0 has no chunked framing, so a stream's end is its connection's end, even for a client that
    asked to keep it alive; an HTTP/1.1 client keeps its connection for the next request."""
    port = int(region.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /stream HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)  # to the end: the server closed it
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"\r\n\r\ndata: 1\n\n")
        assert b"keep-alive" not in answer.lower()
    finally:
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(2):
            writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
            assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 30)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("method", "path", "status", "kind", "message"),
    [
        ("GET", "/nowhere", 404, ("invalid_request_error", "not_found"), "Not Found"),
        ("POST", "/ids", 405, ("invalid_request_error", "method_not_allowed"), "Method Not Allowed"),
        ("GET", "/forbidden", 403, ("permission_error", "permission_denied"), "No entry here."),
        ("GET", "/forbidden-plain", 403, ("permission_error", "permission_denied"), "Forbidden"),
    ],
)
async def test_aiohttps_own_errors_leave_openai_shaped(region, client, method, path, status, kind, message):
    async with client.request(method, region + path) as r:
        body = await r.json()
    assert r.status == status and (body["error"]["type"], body["error"]["code"]) == kind
    assert body["error"]["message"] == message and HEX32.match(r.headers[REQUEST_ID])


async def test_a_redirect_is_not_an_error(region, client):
    status, headers, _ = await get(client, region + "/redirect")
    assert status == 302 and headers["Location"] == "/ids"


def test_error_response_builds_the_envelope_and_the_headers():
    response = error_response(ApiError(RATE_LIMITED, "Wait.", retry_after_s=0.2), "rid")
    assert response.status == 429 and response.content_type == "application/json"
    assert response.headers["Retry-After"] == "1" and response.headers[REQUEST_ID] == "rid"
    assert msgspec.json.decode(response.body)["error"]["message"] == "Wait."
    assert REQUEST_ID not in error_response(ApiError(RATE_LIMITED, "Wait.")).headers


def test_a_metrics_response_is_prometheus_text():
    response = metrics_response(b"# HELP x\nx 1\n")
    assert response.headers["Content-Type"] == PROMETHEUS_CONTENT_TYPE and response.body == b"# HELP x\nx 1\n"


# --- JSON bodies ---------------------------------------------------------------------------------------


async def test_a_json_body_is_decoded_into_its_struct(region, client):
    assert await post_json(client, region + "/json", b'{"name": "a", "count": 2}') == (
        200,
        {"name": "a", "count": 2},
    )
    assert await post_json(client, region + "/json", b'{"name": "b"}', "application/json; charset=utf-8") == (
        200,
        {"name": "b", "count": 0},
    )


async def test_a_gzip_json_body_is_inflated_first(region, client):
    body = gzip.compress(b'{"name": "zipped"}')
    status, answer = await post_json(client, region + "/json", body, **{"Content-Encoding": "gzip"})
    assert status == 200 and answer["name"] == "zipped"


async def test_another_media_type_is_a_415_naming_it(region, client):
    status, body = await post_json(client, region + "/json", b'{"name": "a"}', "text/plain")
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    assert body["error"]["message"] == "Content-Type must be application/json, got 'text/plain'"


async def test_a_body_with_no_media_type_is_a_415_naming_what_http_takes_it_for(region):
    host, port = region.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, raw = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 415 ")
    body = msgspec.json.decode(raw)
    assert body["error"]["message"] == "Content-Type must be application/json, got 'application/octet-stream'"


@pytest.mark.parametrize(
    ("raw", "code", "param", "message"),
    [
        (b'{"name": ', "invalid_json", None, "Request body is not valid JSON: Input data was truncated"),
        (b'{"name": "a", "count": -1}', None, "count", "Invalid request: Expected `int` >= 0"),
        (b'{"count": 1}', None, None, "Invalid request: Object missing required field `name`"),
        (
            b'{"name": "a", "colour": "red"}',
            None,
            "colour",
            "Unrecognized request argument supplied: colour",
        ),
    ],
)
async def test_a_bad_json_body_is_a_400_naming_its_param(region, client, raw, code, param, message):
    status, body = await post_json(client, region + "/json", raw)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert (body["error"]["code"], body["error"]["param"], body["error"]["message"]) == (code, param, message)


async def test_a_body_past_the_limit_is_a_413_in_openai_shape(region, client):
    status, body = await post_json(client, region + "/json", b'{"name": "' + b"a" * LIMIT + b'"}')
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert body["error"]["message"].startswith("Request body too large: ")


async def test_on_aiohttps_default_decompression_a_broken_body_closes_the_connection(client):
    async with serving(app_with(request_ids, openai_errors), auto_decompress=True) as url:
        async with client.post(
            url + "/json",
            data=b"not gzip",
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        ) as r:
            body = await r.json()
        assert r.status == 400 and body["error"]["code"] == "invalid_content_encoding"
        assert r.headers["Connection"].lower() == "close"
        assert await post_json(client, url + "/json", b'{"name": "next"}') == (
            200,
            {"name": "next", "count": 0},
        )


# --- serve ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def signals_restored() -> AsyncIterator[None]:
    """serve() installs SIGTERM and SIGINT handlers on the loop; the test suite's loop gets its own back."""
    loop = asyncio.get_running_loop()
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def test_serve_binds_answers_and_stops_when_told(client):
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    async with signals_restored():
        task = asyncio.create_task(
            serve(app_with(request_ids, openai_errors), "127.0.0.1", 0, on_ready=ready.set_result, stop=stop)
        )
        port = await asyncio.wait_for(ready, 10)
        assert port > 0
        status, _, body = await get(client, f"http://127.0.0.1:{port}/ids", headers={REQUEST_ID: "r"})
        assert status == 200 and body["id"] == "r"
        stop.set()
        await asyncio.wait_for(task, 10)
    with socket.socket() as s:  # nothing listens there any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


async def test_serve_on_a_port_taken_is_one_bind_error_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        called: list[int] = []
        with pytest.raises(BindError) as caught:
            await serve(app_with(), "127.0.0.1", port, on_ready=called.append)
    message = str(caught.value)
    assert message.startswith(f"--port: cannot listen on 127.0.0.1:{port}: ")
    assert "\n" not in message and called == []


def test_install_uvloop_sets_uvloops_policy():
    uvloop = pytest.importorskip("uvloop")
    before = asyncio.get_event_loop_policy()
    try:
        install_uvloop()
        assert isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)
    finally:
        asyncio.set_event_loop_policy(before)
