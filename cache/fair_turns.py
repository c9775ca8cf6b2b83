"""Turns at one worker, shared fairly across keys: round-robin by key, each key's turns in arrival order.

A long embedding request is cut into chunks, each a turn (:mod:`cache.embedder_pool`): another key's short
request waits for one chunk of the long one, not for all of it, as the regional scheduler does for prompts.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque


class FairTurns:
    """One holder at a time (:meth:`take`, then :meth:`release` once); waiters served a key at a time, the
    key just served going to the back."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def take(self, key: str) -> None:
        if not self._busy and not self._waiting:
            self._busy = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # given the turn as it was cancelled: pass it on
            else:
                self._forget(key, turn)
            raise

    def release(self) -> None:
        while self._waiting:
            key, queue = next(iter(self._waiting.items()))
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(key)
            else:
                del self._waiting[key]
            if not turn.done():
                turn.set_result(None)
                return
        self._busy = False

    def _forget(self, key: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is None:
            return
        try:
            queue.remove(turn)
        except ValueError:
            return
        if not queue:
            del self._waiting[key]
