"""The pair judge is loaded in the background by the cache's first semantic lookup, not by the lookup that
first needs it (a load of a second or two there lost that lookup's race to the region)."""

from __future__ import annotations

import threading

import pytest

from cache.decision import SemanticCheck
from cache.embedder import MiniLMEmbedder, load_embedder
from cache.embedder_pool import EmbedderPool
from cache.response_cache import ResponseCache
from tests.cache.test_deferred_index import QUESTION, key


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return load_embedder(backend="onnxruntime")


async def test_the_first_semantic_lookup_loads_the_judge_once_in_the_background(
    tmp_path, embedder: MiniLMEmbedder
):
    loads: list[str] = []
    released = threading.Event()

    def load_judge():
        loads.append(threading.current_thread().name)
        released.wait(timeout=30)  # a slow load: the lookup must not wait for it
        return lambda pairs: [0.0] * len(pairs)

    pool = EmbedderPool(lambda: embedder, source="test")
    await pool.start()
    check = SemanticCheck(load_judge, threshold=0.9)
    cache = ResponseCache(tmp_path, pool, dim=384, size_limit_bytes=10**8, threshold=0.5, check=check)
    try:
        first = await cache.semantic(key(QUESTION))  # an empty cache: a miss, the judge loading meanwhile
        assert first.hit is None and not check.judge_loaded
        await cache.semantic(key("Which city is the capital of France?"))
        released.set()
        await cache.wait_background()
        assert check.judge_loaded and len(loads) == 1 and loads[0] != threading.main_thread().name
    finally:
        released.set()
        cache.close()
        await pool.close()


async def test_a_cache_without_a_judge_loads_none(tmp_path, embedder: MiniLMEmbedder):
    pool = EmbedderPool(lambda: embedder, source="test")
    await pool.start()
    cache = ResponseCache(tmp_path, pool, dim=384, size_limit_bytes=10**8, threshold=0.5)
    try:
        await cache.semantic(key(QUESTION))
        await cache.wait_background()
        assert not cache.check.judge_loaded
    finally:
        cache.close()
        await pool.close()
