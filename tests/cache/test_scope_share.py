"""Once the cache's entries are full, each scope (tenant) stores within its fair part of them
(cache/scope_share.py): one tenant's flood of new questions may not evict every other tenant's answers."""

from __future__ import annotations

import time

from cache.keys import CacheKey
from cache.response_cache import ResponseCache
from cache.scope_share import BUCKETS, ScopeShares
from cache.store import Entry

HOUR = 3600.0


def test_with_room_every_answer_is_stored_and_counted():
    shares = ScopeShares(capacity_bytes=1_000, period_s=24 * HOUR, clock=lambda: 0.0)
    for _ in range(5):
        assert shares.may_store("acme", 400, full=False)
        shares.stored("acme", 400)
    assert shares.stored_lately("acme") == 2_000 and shares.refused == 0


def test_once_full_a_scope_stores_within_the_space_over_the_scopes_that_store():
    shares = ScopeShares(capacity_bytes=1_000, period_s=24 * HOUR, clock=lambda: 0.0)
    shares.stored("acme", 700)
    assert shares.may_store("acme", 300, full=True)  # alone: all of it
    assert not shares.may_store("acme", 301, full=True)
    # A second scope: each may hold half; acme is past it, globex is not.
    assert shares.may_store("globex", 400, full=True)
    shares.stored("globex", 400)
    assert not shares.may_store("acme", 1, full=True)
    assert shares.may_store("globex", 100, full=True) and not shares.may_store("globex", 101, full=True)
    assert shares.refused == 3


def test_a_scopes_writes_age_out_of_the_period_and_free_its_part():
    now = [0.0]
    shares = ScopeShares(capacity_bytes=1_000, period_s=24 * HOUR, clock=lambda: now[0])
    shares.stored("acme", 600)
    now[0] = 12 * HOUR
    shares.stored("acme", 300)
    shares.stored("globex", 100)
    assert not shares.may_store("acme", 1, full=True)  # 900 of a 500 part
    now[0] = 24 * HOUR  # the first write aged out; the second is still in the period
    assert shares.stored_lately("acme") == 300 and shares.may_store("acme", 200, full=True)
    now[0] = 24 * HOUR + 13 * HOUR  # everything aged out: scopes are forgotten
    assert shares.stored_lately("acme") == 0 and shares.stored_lately("globex") == 0
    now[0] += 100 * HOUR  # a long quiet: a jump past the whole period clears at once
    shares.stored("acme", 1)
    assert shares.stored_lately("acme") == 1
    assert BUCKETS == 24


def test_the_scopes_tracked_are_bounded():
    shares = ScopeShares(capacity_bytes=1_000, period_s=HOUR, clock=lambda: 0.0, max_scopes=3)
    for name in ("a", "b", "c", "d"):
        shares.stored(name, 10)
    assert shares.stored_lately("a") == 0 and shares.stored_lately("d") == 10  # the first tracked went


def make_entry(query: str, scope: str) -> Entry:
    now = time.time()
    return Entry(
        partition=scope * 8,
        query=query,
        kind="chat",
        text="An answer of some length to fill the cache. " * 20,
        finish_reason="stop",
        completion_tokens=200,
        model="m",
        created_s=now,
        expires_s=now + 3600,
        scope=scope,
    )


def key(query: str, scope: str) -> CacheKey:
    return CacheKey(
        partition=scope * 8, exact=f"{hash((query, scope)) & (2**64 - 1):032x}", query=query, scope=scope
    )


async def test_a_tenants_flood_into_a_full_cache_leaves_another_tenants_answers(tmp_path):
    cache = ResponseCache(tmp_path, None, dim=4, size_limit_bytes=2 << 20, threshold=0.5)  # type: ignore[arg-type]
    cache.semantic_off = "exact hits only here"  # nothing to embed
    try:
        kept = [f"globex question {i}" for i in range(100)]
        for q in kept:
            assert await cache.save(key(q, "globex"), make_entry(q, "globex"), None)
        refused = 0
        for i in range(6000):  # far more than the entries' 1 MiB
            cache.store.maintain(recount=True)  # (the store's thread does this every second or so)
            q = f"acme question {i}"
            refused += not await cache.save(key(q, "acme"), make_entry(q, "acme"), None)
            if cache.store.entries_full and refused > 500:
                break
        assert cache.store.entries_full and refused > 500 and cache.shares.refused == refused
        # globex's answers were not evicted for acme's: they were within globex's part.
        assert all(cache.exact(key(q, "globex")) is not None for q in kept)
        assert cache.shares.stored_lately("acme") <= cache.store.entries_capacity  # type: ignore[operator]
    finally:
        cache.store.close()
