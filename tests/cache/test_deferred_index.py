"""An answer stored while every embedding slot is taken (issue 34 N10): stored at once for exact hits, its
vector added in the background once the embedder has room; the busy embedder is load shed, not a failure
(no "cache bypassed" on /health), and a lookup that finds it full is a miss."""

from __future__ import annotations

import asyncio
import time

import pytest

from cache.embedder import MiniLMEmbedder, limit_blas_threads, load_embedder
from cache.embedder_pool import EmbedderPool
from cache.keys import CacheKey
from cache.response_cache import ResponseCache
from cache.store import Entry

QUESTION = "What is the capital of France?"
REWORDED = "Which city is the capital of France?"


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    limit_blas_threads(1)
    return load_embedder(backend="onnxruntime")


def key(query: str) -> CacheKey:
    return CacheKey(partition="p" * 32, exact=f"{hash(query) & (2**64 - 1):032x}", query=query)


def entry(query: str) -> Entry:
    now = time.time()
    return Entry(
        partition="p" * 32,
        query=query,
        kind="chat",
        text="Paris.",
        finish_reason="stop",
        completion_tokens=2,
        model="m",
        created_s=now,
        expires_s=now + 600,
    )


async def test_an_answer_stored_while_the_embedder_is_full_is_exact_now_and_semantic_once_embedded(
    tmp_path, embedder: MiniLMEmbedder
):
    pool = EmbedderPool(lambda: embedder, source="test", max_waiting=2)
    await pool.start()
    cache = ResponseCache(tmp_path, pool, dim=384, size_limit_bytes=10**8, threshold=0.5)
    try:
        long_batch = [f"a sentence to keep the embedder busy, number {i}" for i in range(64)]
        busy = [asyncio.create_task(pool.embed(long_batch)) for _ in range(2)]
        await asyncio.sleep(0)  # both slots are taken now
        assert pool.num_waiting == 2

        stored = key(QUESTION)
        assert await cache.save(stored, entry(QUESTION), None)  # not dropped for want of a vector
        assert cache.exact(stored) is not None  # an exact hit at once
        missed = await cache.semantic(key(REWORDED))
        assert missed.hit is None and cache.shed == 1
        assert cache.healthy and not cache.failure  # shed load, not a broken cache
        assert cache.store.vectors(stored.partition) is None  # no row yet

        await asyncio.gather(*busy)
        await cache.deferred.wait_idle()
        assert cache.deferred.indexed == 1
        vectors = cache.store.vectors(stored.partition)
        assert vectors is not None and len(vectors) == 1
        assert cache.store.nearest(stored.partition, (await pool.embed([REWORDED]))[0], 1, 0.5)
    finally:
        cache.close()
        await pool.close()
