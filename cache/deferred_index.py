"""Answers stored while the embedder was busy: their exact entry is stored at once, their vector follows.

When every embedding slot is taken (``EmbedderBusy``: the edge sheds embedding work rather than queueing
without bound), an answer is still stored for exact hits, and its question waits here to be embedded in the
background, one at a time, behind every lookup (``embed_background``). Bounded: past ``MAX_WAITING`` the
newest answers stay exact-only (counted). An entry evicted, replaced or expired meanwhile gets no row.

The same queue embeds entries that another edge of the city stored without a vector this edge can use
(cache/city_share.py); a vector made here for this edge's own answer is handed to ``on_indexed`` (the city
share), one made for another edge's is not: that edge sends its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cache.embedder_pool import EmbedderBusy, EmbedderPool, OutOfScope
from cache.keys import CacheKey
from cache.store import CacheStore, Entry

log = logging.getLogger("nearshore.cache")

MAX_WAITING = 1024
RETRY_BUSY_S = 0.25  # the embedder is full even for one background text: try again after this


@dataclass(frozen=True, slots=True)
class _Waiting:
    key: CacheKey
    entry: Entry
    regions: frozenset[str] | None
    own: bool  # stored through this edge (its vector is announced), not another edge's entry


class DeferredIndex:
    def __init__(
        self,
        embedder: EmbedderPool,
        store: CacheStore,
        on_indexed: Callable[[str, Entry, np.ndarray], None] | None = None,
    ) -> None:
        self.embedder, self.store = embedder, store
        self.on_indexed = on_indexed
        self.waiting: deque[_Waiting] = deque()
        self.indexed = 0  # vectors added later, since start
        self.dropped = 0  # answers left exact-only: too many were waiting
        self._task: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, key: CacheKey, entry: Entry, regions: frozenset[str] | None, own: bool = True) -> None:
        if len(self.waiting) >= MAX_WAITING:
            self.dropped += 1
            return
        self.waiting.append(_Waiting(key, entry, regions, own))
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def wait_idle(self) -> None:
        """Until nothing waits to be indexed (for tests and an orderly close)."""
        await self._idle.wait()

    async def _run(self) -> None:
        try:
            while self.waiting:
                item = self.waiting[0]
                try:
                    vector = (await self.embedder.embed_background([item.key.query], item.regions))[0]
                except EmbedderBusy:
                    await asyncio.sleep(RETRY_BUSY_S)
                    continue
                except OutOfScope:
                    self.waiting.popleft()
                    continue
                except Exception as exc:  # the model cannot load, a region failed: exact hits only
                    self.waiting.popleft()
                    log.warning("cache: a stored answer's question could not be embedded: %s", exc)
                    continue
                self.waiting.popleft()
                if await asyncio.to_thread(self.store.add_vector, item.key.exact, item.entry, vector):
                    self.indexed += 1
                    if item.own and self.on_indexed is not None:
                        self.on_indexed(item.key.exact, item.entry, vector)
        finally:
            if not self.waiting:
                self._idle.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
