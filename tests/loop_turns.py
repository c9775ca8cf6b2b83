"""How many times the event loop turned while an awaited thing ran: zero when it ran on the loop to its end
in one turn, more when it ran elsewhere (a thread) and left the loop to the other streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def loop_turns_during(work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``work()``'s result, and how many times the event loop turned while it was awaited."""
    turns, running = 0, True

    async def turn() -> None:
        nonlocal turns
        while running:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(turn())
    await asyncio.sleep(0)
    before = turns
    result = await work()
    running = False
    during = turns - before
    await ticker
    return result, during
