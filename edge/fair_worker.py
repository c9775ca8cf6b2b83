"""One worker thread whose jobs take turns between their owners: a tenant's flood waits behind itself.

Blocking work that must not run on the event loop (the exact tokenizer on a long prompt: up to 0.4 s for
1 MiB) goes to one thread, so an edge on a small VM keeps a core for its loop. A plain queue there would be
first come, first served: one key sending a hundred long prompts would put every other key's long prompt
behind all of them. Here each owner (an API key) has its own line, and the thread takes one job from each
owner with work in turn, so another key's job waits for at most one job of each other owner.

Everything but the job itself runs on the event loop's thread; a job whose caller left (cancelled) before
its turn is dropped, one already running finishes and its result is discarded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class FairWorker(Generic[T]):
    def __init__(self, name: str) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._lines: dict[str, deque[tuple[Callable[[], T], asyncio.Future[T]]]] = {}
        self._turns: deque[str] = deque()  # owners with jobs waiting, whose turn comes in this order
        self._busy = False

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    async def run(self, owner: str, job: Callable[[], T]) -> T:
        """``job()``'s result, computed on the worker thread when ``owner``'s turn comes."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        line = self._lines.get(owner)
        if line is None:
            line = self._lines[owner] = deque()
            self._turns.append(owner)
        line.append((job, waiter))
        self._next()
        return await waiter

    def close(self) -> None:
        # A job under way finishes; none start.
        self._thread.shutdown(wait=False, cancel_futures=True)
        for line in self._lines.values():
            for _, waiter in line:
                waiter.cancel()
        self._lines.clear()
        self._turns.clear()

    def _next(self) -> None:
        while not self._busy and self._turns:
            owner = self._turns.popleft()
            line = self._lines[owner]
            job, waiter = line.popleft()
            if line:
                self._turns.append(owner)  # its next job after every other owner's
            else:
                del self._lines[owner]
            if waiter.done():  # its caller left while it waited
                continue
            self._busy = True
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(self._thread, job)
            running.add_done_callback(lambda done, waiter=waiter: self._finished(done, waiter))

    def _finished(self, done: asyncio.Future[T], waiter: asyncio.Future[T]) -> None:
        self._busy = False
        if not waiter.done():
            if done.cancelled():
                waiter.cancel()
            elif (exc := done.exception()) is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(done.result())
        self._next()
