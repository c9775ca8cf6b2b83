"""Every answer of the edge, on both listeners, names the server ``nearshore`` and no software version
(aiohttp's default ``Server`` header names Python's and aiohttp's: a map of which published flaws apply)."""

from __future__ import annotations

import aiohttp
import pytest

from nearshore.httpkit import SERVER_NAME
from tests.edge_fixtures import Edge, edge_over_pacer


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    edge = edge_over_pacer(tmp_path_factory.mktemp("server-header"), "pacer", tokens=2, interval_ms=1)
    yield edge
    edge.stop()


async def test_every_kind_of_answer_names_nearshore_and_no_version(edge: Edge):
    key = edge.new_key()
    chat = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    auth = {"Authorization": f"Bearer {key}"}
    asks = [
        ("POST", edge.url + "/v1/chat/completions", chat, auth, 200),  # a whole answer
        ("POST", edge.url + "/v1/chat/completions", {**chat, "stream": True}, auth, 200),  # a stream
        ("POST", edge.url + "/v1/chat/completions", chat, {}, 401),  # an error
        ("GET", edge.url + "/v1/models", None, auth, 200),
        ("GET", edge.url + "/health", None, {}, 200),
        ("GET", edge.url + "/no/such/path", None, {}, 404),  # aiohttp's router's own refusal
        ("GET", edge.metrics_url + "/health", None, {}, 200),  # the operator's listener
    ]
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with aiohttp.ClientSession(connector=connector) as s:
        for method, url, body, headers, status in asks:
            async with s.request(method, url, json=body, headers=headers) as r:
                await r.read()
                assert r.status == status, (url, r.status)
                assert r.headers.getall("Server") == [SERVER_NAME], (url, r.headers.getall("Server"))
