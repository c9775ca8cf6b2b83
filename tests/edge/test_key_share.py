"""One API key's share of a pool at the edge (edge/key_share.py): caps on requests and tokens in flight that
bind while other keys use the pool, a short wait in arrival order, then a 429 that says what to do."""

from __future__ import annotations

import asyncio

import pytest

from edge.config import KeyCaps, KeyShareConfig
from edge.key_share import CONCURRENCY_LIMITED, KeyShares
from edge.keys import ApiKey, share_key
from nearshore.protocol.errors import ApiError

A = ApiKey(key_id="aaaaaaaaaaaa", tenant="flood")
B = ApiKey(key_id="bbbbbbbbbbbb", tenant="victim")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shares(clock: Clock | None = None, **settings: object) -> KeyShares:
    config = KeyShareConfig(**{"max_concurrent": 2, "max_tokens_in_flight": 1000, **settings})
    return KeyShares("large", config, clock or Clock())


async def test_a_key_alone_is_never_held_back():
    s = shares()
    for _ in range(10):  # five times its caps, and nobody else here
        assert await s.acquire(A, 500) == 0.0
    assert s.in_flight(A.key_id) == (10, 5000)


async def test_while_another_key_uses_the_pool_a_key_over_its_cap_waits_for_its_own_requests():
    s = shares()
    await s.acquire(B, 10)  # the victim's chat is in flight
    await s.acquire(A, 400)
    await s.acquire(A, 400)
    third = asyncio.create_task(s.acquire(A, 100))  # over the request cap: it waits
    await asyncio.sleep(0)
    assert not third.done()
    assert await s.acquire(B, 10) == 0.0  # the other key is not held back by it
    s.release(B.key_id, 10)
    await asyncio.sleep(0)
    assert not third.done()  # another key's request ending frees nothing of A's
    s.release(A.key_id, 400)
    assert await third >= 0.0
    assert s.in_flight(A.key_id) == (2, 500)


async def test_the_token_cap_counts_prompts_and_max_tokens_and_a_big_request_still_runs_alone():
    s = shares()
    await s.acquire(B, 10)
    assert await s.acquire(A, 5000) == 0.0  # bigger than the cap: alone in flight, it runs
    waiting = asyncio.create_task(s.acquire(A, 1))
    await asyncio.sleep(0)
    assert not waiting.done()
    s.release(A.key_id, 5000)
    await waiting
    await s.acquire(A, 900)  # 901 tokens in flight
    over = asyncio.create_task(s.acquire(A, 200))
    await asyncio.sleep(0)
    assert not over.done() and s.in_flight(A.key_id) == (2, 901)
    s.release(A.key_id, 1)
    await asyncio.sleep(0)
    assert not over.done()  # 900 + 200 is still over 1000
    s.release(A.key_id, 900)
    await over


async def test_a_recent_other_key_still_counts_and_then_it_does_not():
    clock = Clock()
    s = shares(clock, shared_within_s=60)
    await s.acquire(B, 10)
    s.release(B.key_id, 10)  # the victim's chat ended: it chats again soon
    await s.acquire(A, 10)
    await s.acquire(A, 10)
    third = asyncio.create_task(s.acquire(A, 10))
    await asyncio.sleep(0)
    assert not third.done()
    third.cancel()
    clock.now += 61  # the victim has gone quiet: A may use the whole pool
    assert await s.acquire(A, 10) == 0.0


async def test_over_the_cap_a_full_queue_or_a_long_wait_is_a_429_with_retry_after():
    s = shares(max_queue=1, max_wait_s=0.2)
    await s.acquire(B, 10)
    await s.acquire(A, 10)
    await s.acquire(A, 10)
    waiting = asyncio.create_task(s.acquire(A, 10))
    await asyncio.sleep(0)
    with pytest.raises(ApiError) as full:
        await s.acquire(A, 10)
    error = full.value
    assert error.kind is CONCURRENCY_LIMITED and error.status == 429 and error.retry_after_s == 1.0
    assert error.kind.type == "rate_limit_error" and error.kind.code == "concurrency_limit_exceeded"
    assert "has 2 requests (20 tokens: prompts and max_tokens) in flight in the large pool" in error.message
    assert "1 more of its requests wait" in error.message
    with pytest.raises(ApiError, match=r"none ended within 0.2s"):
        await waiting
    assert s.in_flight(A.key_id) == (2, 20)  # the refused took nothing


async def test_a_waiter_that_leaves_takes_nothing_and_the_next_gets_its_turn():
    s = shares()
    await s.acquire(B, 10)
    await s.acquire(A, 10)
    await s.acquire(A, 10)
    leaver = asyncio.create_task(s.acquire(A, 10))
    stayer = asyncio.create_task(s.acquire(A, 10))
    await asyncio.sleep(0)
    leaver.cancel()  # the client left while it waited
    with pytest.raises(asyncio.CancelledError):
        await leaver
    s.release(A.key_id, 10)
    await stayer
    assert s.in_flight(A.key_id) == (2, 20)
    for _ in range(2):
        s.release(A.key_id, 10)
    s.release(B.key_id, 10)
    assert s.in_flight(A.key_id) == (0, 0) and not s._held  # nothing left behind


async def test_tiers_and_keys_have_caps_of_their_own():
    config = {
        "tiers": {"batch": KeyCaps(max_concurrent=8)},
        "keys": {A.key_id: KeyCaps(max_tokens_in_flight=0)},
    }
    s = shares(**config)
    batch = ApiKey(key_id="cccccccccccc", tenant="t", tier="batch")
    assert (s.caps(batch).max_concurrent, s.caps(batch).max_tokens_in_flight) == (8, 1000)
    assert (s.caps(A).max_concurrent, s.caps(A).max_tokens_in_flight) == (2, 0)
    assert (s.caps(B).max_concurrent, s.caps(B).max_tokens_in_flight) == (2, 1000)


async def test_the_caps_can_bind_always():
    s = shares(shared_only=False, max_wait_s=0)
    await s.acquire(A, 10)
    await s.acquire(A, 10)
    with pytest.raises(ApiError, match=r"at its limit of 2 requests and 1000 tokens in flight\. Retry"):
        await s.acquire(A, 10)


def test_the_share_key_a_region_sees_names_neither_the_key_nor_its_id():
    value = share_key(A.key_id)
    assert value == share_key(A.key_id) != share_key(B.key_id)  # the same from every edge
    assert A.key_id not in value and len(value) == 24 and value.isalnum()
