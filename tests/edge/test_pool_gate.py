"""The per-pool gate: slots, a bounded queue served by tier then arrival, refusals with Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from edge.pool_gate import PoolGate
from nearshore.protocol.errors import ApiError


def gate(max_inflight: int = 1, max_queue: int = 8, max_wait_s: float = 5.0) -> PoolGate:
    return PoolGate("large", max_inflight, max_queue, max_wait_s, ["enterprise", "pro"])


async def test_queued_requests_are_served_by_tier_then_arrival():
    g = gate()
    assert await g.acquire("free") == 0.0
    order: list[str] = []

    async def wait(name: str, tier: str) -> None:
        await g.acquire(tier)
        order.append(name)

    tasks = []
    for name, tier in [("free-1", "free"), ("pro-1", "pro"), ("free-2", "other"), ("ent-1", "enterprise")]:
        tasks.append(asyncio.create_task(wait(name, tier)))
        await asyncio.sleep(0)
    assert g.waiting == 4 and g.inflight == 1
    for _ in range(4):
        g.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["ent-1", "pro-1", "free-1", "free-2"]  # unlisted tiers after listed, then by arrival
    g.release()
    assert (g.inflight, g.waiting) == (0, 0)


async def test_a_full_queue_and_a_long_wait_are_refused_with_retry_after():
    g = gate(max_queue=1, max_wait_s=0.2)
    await g.acquire("pro")
    waiting = asyncio.create_task(g.acquire("pro"))
    await asyncio.sleep(0)
    with pytest.raises(ApiError) as full:
        await g.acquire("pro")
    assert (
        full.value.status == 503 and full.value.retry_after_s and "queue is full" in str(full.value.message)
    )
    with pytest.raises(ApiError, match="no slot within"):
        await waiting
    assert (g.inflight, g.waiting) == (1, 0)
    g.release()
    assert await g.acquire("pro") == 0.0  # nothing left behind


async def test_a_waiter_that_leaves_gives_up_its_place_and_no_slot_is_lost():
    g = gate()
    await g.acquire("pro")
    leaver = asyncio.create_task(g.acquire("enterprise"))
    stayer = asyncio.create_task(g.acquire("pro"))
    await asyncio.sleep(0)
    leaver.cancel()
    await asyncio.sleep(0)
    g.release()
    await asyncio.wait_for(stayer, 1)
    assert (g.inflight, g.waiting) == (1, 0)
    g.release()
    assert g.inflight == 0
