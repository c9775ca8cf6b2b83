"""Vectors across a city's edges (cache/city_share.py), with real Redis and the real embedder: an edge
uses only vectors its own model made, and embeds the rest itself, within the residency scope of the
request that stored the entry; an answer stored while its edge's embedder was busy reaches the others for
exact hits at once and for semantic hits once its vector is made (issue 35, item 3)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cache.city_share import CityShare
from cache.embedder import MiniLMEmbedder, limit_blas_threads, load_embedder
from cache.embedder_pool import EmbedderPool
from cache.keys import CacheKey
from cache.response_cache import ResponseCache
from cache.store import CacheStore, Entry
from tests.cache.city_helpers import DIM, stop, unit, until
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

PARTITION = "p" * 32
QUESTION = "What is the capital of France?"
REWORDED = "Tell me the capital of France."  # one the verifier explains


def entry(query: str, text: str = "Paris.") -> Entry:
    now = time.time()
    return Entry(
        partition=PARTITION,
        query=query,
        kind="chat",
        text=text,
        finish_reason="stop",
        completion_tokens=2,
        model="m",
        created_s=now,
        expires_s=now + 600,
    )


def exact_key(n: int) -> str:
    return f"{n:02x}" * 16


async def test_an_edge_uses_its_own_models_vectors_and_embeds_the_rest_within_the_scope(tmp_path: Path):
    """Store to store: B has A's model, C another; C is asked to embed what it cannot use, with the
    storing request's residency scope; a vector that follows reaches B and is not asked of C."""
    with RedisServer(tmp_path / "redis") as redis:
        asked: dict[str, list[tuple[str, frozenset[str] | None]]] = {"b": [], "c": []}
        stores, shares = {}, {}
        for name, kind in (("a", "model-1"), ("b", "model-1"), ("c", "model-2")):
            stores[name] = CacheStore(tmp_path / name, DIM, 1 << 24)
            wanted = asked.get(name)
            reindex = None if wanted is None else (lambda k, _e, r, w=wanted: w.append((k, r)))
            folder = tmp_path / name
            shares[name] = CityShare(redis.url, stores[name], DIM, folder, kind=kind, reindex=reindex)
        tasks = [asyncio.create_task(s.run()) for s in shares.values()]
        a, b, c = shares["a"], stores["b"], stores["c"]
        try:
            # Embedded through A for a request that may be embedded only in eu-west.
            a.stored(exact_key(1), entry("q1"), unit(1), False, regions=frozenset({"eu-west"}))
            await until(lambda: c.peek(exact_key(1)) is not None and b.peek(exact_key(1)) is not None)
            # The entry lands before its index row (a worker thread writes both): wait for the row too.
            await until(lambda: bool(b.nearest(PARTITION, unit(1), 1, 0.99)))
            assert b.nearest(PARTITION, unit(1), 1, 0.99)[0][1] == exact_key(1)
            assert c.vectors(PARTITION) is None  # another model's vector: not used
            await until(lambda: len(asked["c"]) == 1)
            assert asked["c"] == [(exact_key(1), frozenset({"eu-west"}))]

            # Stored while A's embedder was busy: exact everywhere now, the vector follows.
            busy_then = entry("q2")
            a.stored(exact_key(2), busy_then, None, False, regions=None, follows=True)
            await until(lambda: c.peek(exact_key(2)) is not None and b.peek(exact_key(2)) is not None)
            await until(lambda: len(asked["c"]) == 2)
            assert asked["c"][1] == (exact_key(2), None) and asked["b"] == []  # B waits for A's
            a.indexed(exact_key(2), busy_then, unit(2))
            await until(lambda: bool(b.nearest(PARTITION, unit(2), 1, 0.99)))
            # A's edge made no vector and none follows (out of its scope, say): B embeds it itself.
            a.stored(exact_key(3), entry("q3"), None, False, regions=frozenset())
            await until(lambda: len(asked["b"]) == 1)
            assert asked["b"] == [(exact_key(3), frozenset())]
            assert c.vectors(PARTITION) is None  # C never took a model-1 row
        finally:
            await stop(tasks)
            for store in stores.values():
                store.close()


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    limit_blas_threads(1)
    return load_embedder(backend="onnxruntime")


async def test_an_answer_stored_while_the_embedder_is_busy_becomes_a_semantic_hit_on_the_others(
    tmp_path: Path, embedder: MiniLMEmbedder
):
    """Two edges' caches with the real embedder: A stores while its embedder is full; B serves the
    exact hit at once and a paraphrase once A's vector arrives; an edge of another model (C) embeds the
    entry itself and serves the paraphrase too."""
    pool = EmbedderPool(lambda: embedder, source="test", max_waiting=2)
    await pool.start()
    caches: dict[str, ResponseCache] = {}
    tasks: list[asyncio.Task] = []
    with RedisServer(tmp_path / "redis") as redis:
        try:
            for name, kind in (("a", "minilm"), ("b", "minilm"), ("c", "another build")):
                cache = ResponseCache(tmp_path / name, pool, dim=384, size_limit_bytes=10**8, threshold=0.5)
                cache.share = CityShare(
                    redis.url, cache.store, 384, tmp_path / name, kind=kind, reindex=cache.index_later
                )
                caches[name] = cache
                tasks.append(asyncio.create_task(cache.share.run()))
            a, b, c = caches["a"], caches["b"], caches["c"]
            key = CacheKey(PARTITION, exact_key(9), QUESTION)
            long_batch = [f"a sentence to keep the embedder busy, number {i}" for i in range(64)]
            busy = [asyncio.create_task(pool.embed(long_batch)) for _ in range(2)]
            await asyncio.sleep(0)  # both slots are taken now
            assert await a.save(key, entry(QUESTION), None)
            await until(lambda: b.exact(key) is not None)  # exact on B at once

            await asyncio.gather(*busy)
            await a.deferred.wait_idle()
            assert a.deferred.indexed == 1
            reworded = CacheKey(PARTITION, exact_key(10), REWORDED)

            async def semantic_hit(cache: ResponseCache) -> bool:
                return (await cache.semantic(reworded)).hit is not None

            async with asyncio.timeout(30):
                while not (await semantic_hit(b) and await semantic_hit(c)):
                    await asyncio.sleep(0.05)
            assert b.deferred.indexed == 0 and c.deferred.indexed == 1  # B used A's vector, C made its own
        finally:
            await stop(tasks)
            for cache in caches.values():
                cache.close()
            await pool.close()
