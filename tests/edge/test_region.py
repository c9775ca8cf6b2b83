"""The edge in front of real regional nodes: the official openai client over HTTPS, cancellation, mTLS."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from nearshore import tls
from nearshore.protocol.sse import iter_data
from tests.conftest import MODEL, Node
from tests.edge_fixtures import Edge, start_edge
from tests.nearshore.test_tls import start_tls_region
from tests.regional.test_api import aborted_count, wait_for_one_abort

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("edge-region"), [("london", region.url)])
    yield e
    e.stop()


def client(edge: Edge, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=edge.url + "/v1",
        api_key=key,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=edge.ssl_context()),
    )


def test_openai_client_over_https_streamed_and_not(edge: Edge):
    c = client(edge, edge.new_key())
    answer = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city in Nigeria."}],
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens == 8
    pieces, usage = [], None
    for chunk in c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city in Nigeria."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
        pieces += [ch.delta.content or "" for ch in chunk.choices]
    assert "".join(pieces) == answer.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 8
    text = c.completions.create(model=MODEL, prompt="Lagos is", max_tokens=4, temperature=0)
    assert text.usage.completion_tokens == 4


def test_openai_client_gets_typed_errors(edge: Edge):
    with pytest.raises(openai.AuthenticationError):
        client(edge, "ns-000000000000-" + "x" * 43).models.list()
    limited = client(edge, edge.new_key(rpm=1))
    limited.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    with pytest.raises(openai.RateLimitError) as raised:
        limited.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert raised.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.BadRequestError):
        client(edge, edge.new_key()).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=5
        )
    with pytest.raises(openai.BadRequestError) as too_long:  # the region's own 400 passes through unchanged
        client(edge, edge.new_key()).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 700}]
        )
    assert too_long.value.code == "context_length_exceeded"


async def test_a_prompt_the_region_refuses_still_costs_its_sender(edge: Edge):
    """A region's 400 (too long for its context) keeps the request in the RPM window and its prompt's
    share of the TPM window, so refused prompts cannot be sent for free (issue 7, item 3)."""
    key = edge.new_key(rpm=10, tpm=50_000)
    headers = {"Authorization": f"Bearer {key}"}
    too_long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 700}], "max_tokens": 8}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context())) as s:
        async with s.post(edge.url + "/v1/chat/completions", json=too_long, headers=headers) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "context_length_exceeded"
        await asyncio.sleep(0.2)  # settled just after the answer
        small = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        async with s.post(edge.url + "/v1/chat/completions", json=small, headers=headers) as r:
            assert r.status == 200
            assert r.headers["x-ratelimit-remaining-requests"] == "8"
            held = 50_000 - int(r.headers["x-ratelimit-remaining-tokens"])
    # The refused prompt (~1,200 tokens by the edge's estimate) still counts; its max_tokens does not.
    assert held > 1000


async def test_request_id_travels_to_the_region(edge: Edge):
    key = edge.new_key()
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context())) as s,
        s.post(
            edge.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}", "x-request-id": "lagos-trace-42"},
        ) as r,
    ):
        body = await r.json()
    # The edge's own id, unique, travels to the region; the client's is kept beside it and echoed.
    edge_id = r.headers["x-request-id"]
    assert edge_id != "lagos-trace-42" and r.headers["x-client-request-id"] == "lagos-trace-42"
    assert body["id"] == f"chatcmpl-{edge_id}"  # the region built its id from the propagated one
    assert "prefill;dur=" in r.headers["Server-Timing"]  # the region's timing rides along


async def test_client_leaving_cancels_the_region_decode(edge: Edge, region: Node):
    aborted = await aborted_count(region)
    key = edge.new_key()
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 400,
        "stream": True,
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context())) as s:
        r = await s.post(
            edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
        )
        seen = 0
        async for _ in iter_data(r.content):
            seen += 1
            if seen == 3:
                break
        r.close()
    await wait_for_one_abort(region, aborted)


async def test_edge_reaches_an_mtls_region_that_refuses_everyone_else(tmp_path):
    ca_dir, certs = tmp_path / "ca", tmp_path / "certs"
    ca, _ = tls.create_cluster_ca(ca_dir)
    node_cert = tls.issue_certificate(ca_dir, "london", certs, server=True)
    edge_cert = tls.issue_certificate(ca_dir, "lagos-edge", certs, client=True)
    (tmp_path / "region").mkdir()
    node = start_tls_region(
        tmp_path / "region", ca, tls_cert=str(node_cert[0]), tls_key=str(node_cert[1]), client_ca=str(ca)
    )
    edge = start_edge(
        tmp_path / "edge",
        [("london", node.url)],
        upstream={"ca": str(ca), "client_cert": str(edge_cert[0]), "client_key": str(edge_cert[1])},
    )
    try:
        key = edge.new_key()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context())) as s:
            async with s.post(
                edge.url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            ) as r:
                assert r.status == 200, await r.text()
            # Straight to the region without the edge's certificate: refused.
            direct = aiohttp.TCPConnector(ssl=tls.client_context(ca=ca))
            async with (
                aiohttp.ClientSession(connector=direct) as d,
                d.post(node.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}) as r,
            ):
                assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
    finally:
        edge.stop()
        node.process.stop()
