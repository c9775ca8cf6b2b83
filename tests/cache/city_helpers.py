"""What the city-share tests have in common: small unit vectors, waiting on a condition, and stopping the
shares' tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import numpy as np

DIM = 8


def unit(seed: int, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def stop(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel the shares' tasks and wait until they have ended."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
