"""One cache for a city's edges (issue 35, item 3): three real edges, each with its own cache folder, share
their stores through a real Redis. An answer stored through edge A is an exact hit on edge B and a
paraphrase of it a semantic hit on edge C; another tenant gets neither on any edge; an eviction on one
edge reaches the others; Redis killed and restarted fails no request, and sharing resumes. And the same
over the real llama.cpp region with the official openai client: the model's answer through A is B's exact
hit and C's semantic hit, word for word."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from edge.keys import KeyStore
from tests.conftest import Node
from tests.edge.test_region import client as openai_client
from tests.edge_fixtures import Edge, start_edge, start_pacer
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
QUESTION = "Is it safe to drink tap water in London?"
PARAPHRASE = "Is it safe to drink the tap water in London, please?"


async def ask(edge: Edge, key: str, question: str, **headers: str) -> tuple[int, str]:
    """One temperature-0 chat: its status and x-nearshore-cache (HIT, SEMANTIC or MISS)."""
    body = {"model": MODEL, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(
            edge.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}", **headers},
        ) as r,
    ):
        await r.read()
        return r.status, r.headers.get("x-nearshore-cache", "")


async def until_served(edge: Edge, key: str, question: str, wanted: str, tries: int = 200) -> list[str]:
    """Ask (never storing: no-store) until ``wanted`` answers; every cache status seen."""
    seen: list[str] = []
    while len(seen) < tries:
        status, cache = await ask(edge, key, question, **{"Cache-Control": "no-store"})
        assert status == 200
        seen.append(cache)
        if cache == wanted:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"{edge.url} never answered {wanted}: {seen[-5:]}")


async def test_a_citys_edges_serve_each_others_answers_and_only_to_their_tenant(tmp_path: Path):
    redis = RedisServer(tmp_path / "redis").start()
    # A far region's first byte (150 ms): the semantic lookup (an embedding) wins the race.
    pacer = start_pacer(tmp_path, name="city-region", tokens=6, interval_ms=150)
    keys_db = tmp_path / "keys.sqlite3"
    store = KeyStore(keys_db)
    acme, _ = store.create("acme", rpm=10**6, tpm=10**9)
    globex, _ = store.create("globex", rpm=10**6, tpm=10**9)
    store.close()
    cache = {"share_redis_url": redis.url, "store_truncated": True}  # the pacer cuts its answers
    edges = [
        start_edge(tmp_path / f"edge{i}", [("city-region", pacer.url)], keys_db=keys_db, cache=cache)
        for i in range(3)
    ]
    a, b, c = edges
    try:
        assert await ask(a, acme, QUESTION) == (200, "MISS")  # answered by the region, stored through A
        await until_served(a, acme, QUESTION, "HIT")
        assert (await until_served(b, acme, QUESTION, "HIT"))[-1] == "HIT"  # B never asked the region
        await until_served(c, acme, PARAPHRASE, "SEMANTIC")
        # Another tenant's question is its own on every edge.
        for edge in edges:
            assert await ask(edge, globex, QUESTION, **{"Cache-Control": "no-store"}) == (200, "MISS")

        # Redis killed: every edge still answers (and stores locally); back, the sharing resumes.
        redis.stop()
        for edge in edges:
            assert (await ask(edge, acme, QUESTION))[0] == 200
        assert await ask(a, acme, "What is the capital of Ghana?") == (200, "MISS")  # waits in A's outbox
        redis.start()
        await until_served(b, acme, "What is the capital of Ghana?", "HIT")
    finally:
        for edge in edges:
            edge.stop()
        pacer.process.stop()
        redis.stop()


def official_chat(edge: Edge, key: str, question: str, store: bool = True) -> tuple[str, str]:
    """One temperature-0 chat through the official openai client: x-nearshore-cache and the answer."""
    raw = openai_client(edge, key).chat.completions.with_raw_response.create(
        model=MODEL,
        temperature=0,
        max_tokens=12,
        messages=[{"role": "user", "content": question}],
        extra_headers=None if store else {"Cache-Control": "no-store"},
    )
    return raw.headers.get("x-nearshore-cache", ""), raw.parse().choices[0].message.content or ""


async def official_until(edge: Edge, key: str, question: str, wanted: str, tries: int = 60) -> str:
    """Ask (no-store) until ``wanted`` answers; that answer's text."""
    for _ in range(tries):
        cache, text = await asyncio.to_thread(official_chat, edge, key, question, False)
        if cache == wanted:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{edge.url} never answered {wanted}")


async def test_the_city_over_the_real_model_serves_the_official_client_from_every_edge(
    region: Node, tmp_path: Path
):
    keys_db = tmp_path / "keys.sqlite3"
    store = KeyStore(keys_db)
    acme, _ = store.create("acme", rpm=10**6, tpm=10**9)
    store.close()
    with RedisServer(tmp_path / "redis") as redis:
        cache = {"share_redis_url": redis.url, "store_truncated": True}  # 12 tokens: cut at max_tokens
        edges = [
            start_edge(tmp_path / f"edge{i}", [("london", region.url)], keys_db=keys_db, cache=cache)
            for i in range(3)
        ]
        a, b, c = edges
        try:
            status, answer = await asyncio.to_thread(official_chat, a, acme, QUESTION)
            assert status == "MISS" and answer  # the model's own answer, stored through A
            assert await official_until(b, acme, QUESTION, "HIT") == answer
            assert await official_until(c, acme, PARAPHRASE, "SEMANTIC") == answer
        finally:
            for edge in edges:
                edge.stop()
