"""Turns at one worker, round-robin across keys (cache/fair_turns.py)."""

from __future__ import annotations

import asyncio

import pytest

from cache.fair_turns import FairTurns


async def test_turns_go_round_robin_across_keys_and_in_order_within_one():
    turns = FairTurns()
    order: list[str] = []

    async def one(name: str, key: str) -> None:
        await turns.take(key)
        order.append(name)
        await asyncio.sleep(0)
        turns.release()

    await turns.take("held")  # the worker is busy: everyone below waits
    waiting = [asyncio.create_task(one(f"a{i}", "a")) for i in range(3)]
    waiting.append(asyncio.create_task(one("b0", "b")))
    waiting.append(asyncio.create_task(one("c0", "c")))
    await asyncio.sleep(0)
    assert turns.waiting == 5
    turns.release()
    await asyncio.gather(*waiting)
    assert order == ["a0", "b0", "c0", "a1", "a2"]
    assert turns.waiting == 0


async def test_a_cancelled_waiter_leaves_and_a_cancelled_holder_passes_its_turn_on():
    turns = FairTurns()
    await turns.take("a")
    gone = asyncio.create_task(turns.take("b"))
    after = asyncio.create_task(turns.take("c"))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert turns.waiting == 1
    turns.release()
    await asyncio.wait_for(after, 1.0)  # c has it: the cancelled waiter was skipped
    turns.release()
    await asyncio.wait_for(turns.take("d"), 1.0)  # free again
