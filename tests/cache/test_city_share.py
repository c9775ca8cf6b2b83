"""The city share's stream against a real Redis, store to store (cache/city_share.py): a put, a replace
and an eviction reach another edge's store with the vector; a vector of another size, a malformed or an
expired change are skipped and the follower goes on; a replica restarted resumes from its position, and
one whose folder is new rebuilds from the stream's start."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from redis.asyncio import Redis

from cache.city_share import STREAM, CityShare
from cache.store import CacheStore, Entry
from nearshore.children import nearshore_argv
from tests.cache.city_helpers import DIM, stop, unit, until
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

# Exact keys are hex digests, as the cache makes them.
KEY = {name: f"{i:02x}" * 16 for i, name in enumerate(("k1", "k2", "k3", "k4"), start=1)}


def entry(text: str, partition: str = "p1", ttl_s: float = 3600) -> Entry:
    now = time.time()
    return Entry(
        partition=partition,
        query="q",
        kind="chat",
        text=text,
        finish_reason="stop",
        completion_tokens=1,
        model="m",
        created_s=now,
        expires_s=now + ttl_s,
    )


def replica(folder: Path, url: str, dim: int = DIM) -> tuple[CacheStore, CityShare]:
    store = CacheStore(folder, dim, 1 << 24)
    return store, CityShare(url, store, dim, folder)


async def test_changes_reach_the_other_stores_and_bad_ones_are_skipped(tmp_path: Path):
    with RedisServer(tmp_path / "redis") as redis:
        store_a, share_a = replica(tmp_path / "a", redis.url)
        store_b, share_b = replica(tmp_path / "b", redis.url)
        tasks = [asyncio.create_task(s.run()) for s in (share_a, share_b)]
        try:
            share_a.stored(KEY["k1"], entry("first"), unit(1), replace=False)
            # The entry lands before its index row (a worker thread writes both): wait for the row.
            await until(lambda: bool(store_b.nearest("p1", unit(1), 1, 0.99)))
            assert store_b.peek(KEY["k1"]).text == "first"
            assert store_b.nearest("p1", unit(1), 1, 0.99)[0][1] == KEY["k1"]  # the vector came with it

            share_a.stored(KEY["k1"], entry("fresh"), None, replace=True)  # Cache-Control: no-cache
            await until(lambda: store_b.peek(KEY["k1"]).text == "fresh")
            share_b.evicted(KEY["k1"])  # the audit found it wrong on B
            await until(lambda: store_a.peek(KEY["k1"]) is None)

            # Planted junk and a vector of another size: skipped, and the follower goes on.
            client = Redis.from_url(redis.url)
            await client.xadd(STREAM, {"op": "put", "exact": "ab" * 16, "entry": b"\x00", "origin": "x"})
            await client.xadd(STREAM, {"op": "put", "exact": "abcd", "entry": b"\x00", "origin": "x"})
            await client.aclose()
            share_a.stored(KEY["k2"], entry("wrong size"), np.ones(DIM + 1, np.float32), replace=False)
            share_a.stored(KEY["k3"], entry("gone", ttl_s=-1), unit(3), replace=False)
            share_a.stored(KEY["k4"], entry("last"), unit(4), replace=False)
            await until(lambda: bool(store_b.nearest("p1", unit(4), 1, 0.99)))
            assert store_b.peek("ab" * 16) is None and store_b.peek(KEY["k3"]) is None
            assert store_b.peek(KEY["k2"]).text == "wrong size"  # an exact hit only
            assert [k for _, k in store_b.nearest("p1", unit(4), 5, 0.5)] == [KEY["k4"]]
        finally:
            await stop(tasks)

        # B restarted: it resumes after what it applied; a new folder rebuilds from the stream's start.
        again = CityShare(redis.url, store_b, DIM, tmp_path / "b")
        assert again.last_id == share_b.last_id != "0"
        store_c, share_c = replica(tmp_path / "c", redis.url)
        task = asyncio.create_task(share_c.run())
        try:
            await until(lambda: store_c.peek(KEY["k4"]) is not None)
            assert store_c.peek(KEY["k1"]) is None  # put, replaced, then evicted: in order
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for store in (store_a, store_b, store_c):
            store.close()


async def test_a_clear_on_one_edge_clears_the_others_in_order(tmp_path: Path):
    """`nearshore cache clear --config` on an edge that shares its cache: the same clear on every edge,
    applied between the stores around it (what came after it stays)."""
    with RedisServer(tmp_path / "redis") as redis:
        store_a, share_a = replica(tmp_path / "a", redis.url)
        store_b, share_b = replica(tmp_path / "b", redis.url)
        tasks = [asyncio.create_task(s.run()) for s in (share_a, share_b)]
        try:
            for name, stored in (
                ("k1", entry("p1's", partition="p1")),
                ("k2", entry("p2's", partition="p2")),
            ):
                store_a.put(KEY[name], stored, unit(1), replace=False)  # as the edge stores, then shares
                share_a.stored(KEY[name], stored, unit(1), replace=False)
            await until(lambda: store_b.peek(KEY["k2"]) is not None)
            config = tmp_path / "edge.toml"
            config.write_text(
                f'[cache]\nfolder = "{tmp_path / "a"}"\nshare_redis_url = "{redis.url}"\n'
                '[[regions]]\nname = "r"\nurl = "http://127.0.0.1:9"\n'
            )
            done = await asyncio.to_thread(
                subprocess.run,
                nearshore_argv("cache", "clear", "--config", str(config), "--partition", "p1"),
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0 and "the city's other edges" in done.stdout, done.stderr
            share_a.stored(KEY["k3"], entry("after the clear", partition="p1"), unit(3), replace=False)
            await until(lambda: store_b.peek(KEY["k3"]) is not None)
            assert store_b.peek(KEY["k1"]) is None and store_b.peek(KEY["k2"]).text == "p2's"
        finally:
            await stop(tasks)
        for store in (store_a, store_b):
            store.close()


async def test_an_audit_verdict_on_one_edge_holds_on_the_others(tmp_path: Path):
    """Wrong semantic hits found by A's live audit: B's book records them too, so the partition stops
    serving semantic hits on B and the entry's raised threshold holds there; B's own totals stay B's."""
    from cache.audit import AuditBook
    from cache.embedder_pool import EmbedderPool
    from cache.response_cache import Hit, ResponseCache

    with RedisServer(tmp_path / "redis") as redis:
        caches = {}
        for name in ("a", "b"):
            cache = ResponseCache(
                tmp_path / name, EmbedderPool(lambda: None, source="none"), DIM, 1 << 24, threshold=0.5
            )
            cache.audit = AuditBook(target=0.01, first_hits=5)
            cache.share = CityShare(redis.url, cache.store, DIM, tmp_path / name, learn=cache.learn)
            caches[name] = cache
        a, b = caches["a"], caches["b"]
        tasks = [asyncio.create_task(c.share.run()) for c in (a, b)]
        try:
            wrong = Hit(entry("an answer to another question"), "semantic", 0.8, KEY["k1"], judged=0.9)
            for _ in range(3):
                a.audited(wrong, "p1", "disagree", "sampled")
            a.audited(wrong, "p1", "unsure", "sampled")  # undecided: not told
            assert not a.audit.serves_semantic("p1")
            # The first verdict already closes p1 on B: wait for B's book to hold all three, not the first.
            await until(lambda: b.audit.rate("p1").audited == 3)
            assert not b.audit.serves_semantic("p1") and b.share.applied == 3
            assert b.audit.threshold_for(KEY["k1"]) == pytest.approx(0.81)
            assert b.audit.audited == 0 and not b.audit.counts
            assert b.audit.serves_semantic("p2")  # another partition is untouched
        finally:
            await stop(tasks)
            for cache in caches.values():
                cache.close()
