"""Browsers on an allowed origin may call the edge (CORS, edge/cors.py); others get no leave to read it.

An edge over a pacer with ``server.cors_origins`` set, asked as a browser asks: the preflight (OPTIONS with
Origin and Access-Control-Request-*, no key), then the request with its Origin. The edge without the
setting answers no preflight: tests/edge/test_proxy.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from edge.cors import Cors
from tests.edge_fixtures import Edge, edge_over_pacer

PAGE = "https://chat.example"
CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    folder: Path = tmp_path_factory.mktemp("cors")
    e = edge_over_pacer(folder, "cors-pacer", {"server": {"cors_origins": [PAGE]}}, tokens=2, interval_ms=1)
    yield e
    e.stop()


async def ask(edge: Edge, method: str, path: str, headers: dict[str, str], body: dict | None = None):
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.request(method, edge.url + path, headers=headers, data=json.dumps(body) if body else None) as r,
    ):
        return r.status, r.headers.copy(), await r.read()


def preflight(origin: str | None, asked: str = "authorization, content-type") -> dict[str, str]:
    headers = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked}
    return headers | ({"Origin": origin} if origin else {})


@pytest.mark.slow
async def test_the_preflight_of_an_allowed_origin_grants_the_method_and_headers_without_a_key(edge: Edge):
    status, headers, body = await ask(edge, "OPTIONS", "/v1/chat/completions", preflight(PAGE))
    assert status == 204 and body == b""
    assert headers["Access-Control-Allow-Origin"] == PAGE and "Origin" in headers["Vary"]
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert int(headers["Access-Control-Max-Age"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize(("origin", "status"), [("https://elsewhere.example", 403), (None, 405)])
async def test_another_origin_or_no_origin_gets_no_leave(edge: Edge, origin: str | None, status: int):
    got, headers, body = await ask(edge, "OPTIONS", "/v1/chat/completions", preflight(origin))
    assert got == status and "Access-Control-Allow-Origin" not in headers
    assert json.loads(body)["error"]["message"]


@pytest.mark.slow
async def test_answers_name_the_allowed_origin_streams_and_errors_too(edge: Edge):
    key = edge.new_key()
    asked = {"Origin": PAGE, "Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for body in (CHAT, {**CHAT, "stream": True}):
        status, headers, answer = await ask(edge, "POST", "/v1/chat/completions", asked, body)
        assert status == 200 and headers["Access-Control-Allow-Origin"] == PAGE
        assert "x-request-id" in headers["Access-Control-Expose-Headers"]
        assert "x-ratelimit-remaining-requests" in headers["Access-Control-Expose-Headers"]
        assert b"token" in answer
    # An error is readable by the page too: it says why.
    status, headers, answer = await ask(
        edge, "POST", "/v1/chat/completions", {**asked, "Authorization": ""}, CHAT
    )
    assert status == 401 and headers["Access-Control-Allow-Origin"] == PAGE
    assert json.loads(answer)["error"]["type"] == "authentication_error"
    # Another origin's page is served (a browser is not the only client) but given no leave to read it.
    status, headers, _ = await ask(
        edge, "POST", "/v1/chat/completions", {**asked, "Origin": "https://x.example"}, CHAT
    )
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


async def test_any_origin_is_named_as_any_and_a_vary_already_there_is_kept():
    answer = web.Response(headers={"Vary": "Accept-Encoding"})
    await Cors(["*"]).on_answer(
        make_mocked_request("POST", "/", headers={"Origin": "https://x.example"}), answer
    )
    assert (
        answer.headers["Access-Control-Allow-Origin"] == "*" and answer.headers["Vary"] == "Accept-Encoding"
    )
    answer = web.Response(headers={"Vary": "Accept-Encoding"})
    await Cors([PAGE]).on_answer(make_mocked_request("POST", "/", headers={"Origin": PAGE}), answer)
    assert answer.headers["Access-Control-Allow-Origin"] == PAGE
    assert answer.headers["Vary"] == "Accept-Encoding, Origin"
    unasked = web.Response()
    await Cors([PAGE]).on_answer(make_mocked_request("POST", "/"), unasked)  # not a browser: nothing added
    assert "Access-Control-Allow-Origin" not in unasked.headers
