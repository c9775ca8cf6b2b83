"""/v1/embeddings through the edge: routed to a region that serves the embedding model, checked, billed."""

from __future__ import annotations

import sqlite3

import aiohttp
import openai
import pytest

from tests.conftest import Node
from tests.edge_fixtures import Edge, start_edge

pytestmark = pytest.mark.slow
MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node):
    e = start_edge(tmp_path_factory.mktemp("embeddings"), [("london", region.url)])
    yield e
    e.stop()


async def test_the_official_client_gets_the_regions_vectors_through_the_edge(edge: Edge, region: Node):
    key = edge.new_key()
    client = openai.AsyncOpenAI(
        base_url=edge.url + "/v1",
        api_key=key,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=edge.ssl_context()),
    )
    texts = ["Is it safe to drink tap water in Lagos?", "Jollof rice"]
    through = await client.embeddings.create(model=MODEL, input=texts)
    async with (
        aiohttp.ClientSession() as s,
        s.post(region.url + "/v1/embeddings", json={"model": MODEL, "input": texts}) as r,
    ):
        direct = await r.json()
    assert [d.embedding for d in through.data] == [d["embedding"] for d in direct["data"]]
    assert through.usage.prompt_tokens == direct["usage"]["prompt_tokens"] > 0
    db = sqlite3.connect(edge.ledger_db)
    try:
        model, region_name, prompt, completion, cost = db.execute(
            "SELECT model, region, prompt_tokens, completion_tokens, cost_usd"
            " FROM usage ORDER BY ts DESC LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    assert (model, region_name, prompt, completion) == (MODEL, "london", through.usage.prompt_tokens, 0)
    assert cost == pytest.approx(prompt * 0.01 / 1e6)


async def test_bad_embedding_requests_are_refused_at_the_edge(edge: Edge):
    key = edge.new_key()
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with aiohttp.ClientSession(connector=connector) as s:
        for payload, status, param in (
            ({"model": MODEL, "input": "x", "dimensions": 64}, 400, "dimensions"),
            ({"model": MODEL, "input": []}, 400, "input"),
            ({"model": "no-such-model", "input": "x"}, 404, "model"),
            ({"model": MODEL, "input": [1, 2, 3]}, 400, "input[0]"),  # token ids: strings only
        ):
            async with s.post(
                edge.url + "/v1/embeddings", json=payload, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                body = await r.json()
                assert r.status == status and body["error"]["param"] == param, (payload, body)


async def test_the_cache_can_embed_its_questions_at_a_region(tmp_path, region: Node):
    """``cache.embed = "region"``: an edge without the model still answers a paraphrase from its cache."""
    edge = start_edge(
        tmp_path / "edge",
        [("london", region.url)],
        cache={"embed": "region", "store_truncated": True},
    )
    try:
        key = edge.new_key()
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with aiohttp.ClientSession(connector=connector) as s:

            async def ask(content: str) -> str:
                payload = {
                    "model": "gemma-3-270m",
                    "messages": [{"role": "user", "content": content}],
                    "temperature": 0,
                    "max_tokens": 24,
                }
                async with s.post(
                    edge.url + "/v1/chat/completions",
                    json=payload,
                    headers={"Authorization": f"Bearer {key}"},
                ) as r:
                    assert r.status == 200, await r.text()
                    return r.headers["x-nearshore-cache"]

            assert await ask("What is the capital city of Nigeria?") == "MISS"
            for _ in range(40):  # stored off the request's path
                if await ask("What's the capital city of Nigeria, please?") == "SEMANTIC":
                    break
            else:
                raise AssertionError("the paraphrase never hit")
        assert "loaded from" not in (edge.folder / "edge.log").read_text()  # the edge never held the model
    finally:
        edge.stop()


async def test_the_largest_request_the_schema_allows_is_answered_whole(edge: Edge):
    """2,048 inputs: the region's answer (about 16 MB of JSON) is bounded by the request, not by the 8 MiB
    bound of a completion, so it reaches the client and is billed."""
    key = edge.new_key(tpm=1_000_000)
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    texts = [f"w{i}" for i in range(2048)]
    timeout = aiohttp.ClientTimeout(total=240)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
        s.post(
            edge.url + "/v1/embeddings",
            json={"model": MODEL, "input": texts},
            headers={"Authorization": f"Bearer {key}"},
        ) as r,
    ):
        assert r.status == 200, (await r.read())[:300]
        answer = await r.json()
    assert len(answer["data"]) == 2048 and answer["usage"]["prompt_tokens"] > 2048


async def test_a_request_whose_answer_may_pass_the_edges_bound_is_refused_before_it_is_sent(
    tmp_path, region: Node
):
    edge = start_edge(tmp_path / "edge", [("london", region.url)], upstream={"max_embeddings_bytes": 100_000})
    try:
        key = edge.new_key()
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(
                edge.url + "/v1/embeddings",
                json={"model": MODEL, "input": ["a"] * 40},
                headers={"Authorization": f"Bearer {key}"},
            ) as r,
        ):
            assert r.status == 400
            error = (await r.json())["error"]
        assert error["param"] == "input" and "fewer inputs" in error["message"]
    finally:
        edge.stop()
