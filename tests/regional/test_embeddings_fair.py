"""Embeddings share the node fairly by key (issue 34 N16), on a real regional node: while one key's four
large embedding requests run, another key's one-input request is answered after a chunk of theirs, not after
all of them (it used to wait behind the whole queue)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from nearshore.protocol.headers import SHARE_KEY
from tests.conftest import Node, start_region

pytestmark = pytest.mark.slow

EMBEDDER = "all-minilm-l6-v2"
INPUTS = 384  # per flood request: twelve chunks of the embedder's fair turns


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    region = start_region(
        tmp_path_factory.mktemp("embed-fair"),
        engine={"max_sequences": 2, "kv_cache_tokens": 2048, "context_window": 512},
        embeddings={"load": "eager", "max_request_tokens": 100_000},
    )
    yield region
    region.process.stop()


async def embed(s: aiohttp.ClientSession, node: Node, texts: list[str], key: str) -> float:
    """When the answer arrived (perf_counter)."""
    payload = {"model": EMBEDDER, "input": texts}
    async with s.post(node.url + "/v1/embeddings", json=payload, headers={SHARE_KEY: key}) as r:
        body = await r.json()
        assert r.status == 200, body
        assert len(body["data"]) == len(texts)
    return time.perf_counter()


async def test_a_short_embedding_is_not_held_behind_another_keys_flood(node: Node):
    flood = [
        [f"Flood request {i}, sentence {n} about the weather in Lagos." for n in range(INPUTS)]
        for i in range(4)
    ]
    async with aiohttp.ClientSession() as s:
        running = [asyncio.create_task(embed(s, node, texts, "key-a")) for texts in flood]
        await asyncio.sleep(0.3)  # the four are read and queued
        short_done = await embed(s, node, ["Where is the nearest pharmacy?"], "key-b")
        flood_done = await asyncio.gather(*running)
    # B's turns went between A's chunks (a few of them), not after A's requests: none of those had ended.
    assert all(done > short_done for done in flood_done)
