"""An embedder off the event loop: one worker thread, a bounded queue, loading at start or on first use.

numpy releases the GIL inside its matrix products, so the event loop keeps serving while a text is
embedded. One thread is enough for requests: the products themselves use the BLAS threads, and a second
thread of equal priority would only contend for the same cores.

Two classes of work: a lookup or a /v1/embeddings call is in the foreground; the live audit's embeddings
(:meth:`EmbedderPool.embed_background`) go one text at a time, only while no foreground call waits, on a
second thread the OS schedules after the others (nice 10, Linux), so a lookup never queues behind them and
on a busy machine they take the CPU that is left.

Loading: ``load = "eager"`` starts it in the worker thread when the pool starts (requests that come
earlier wait for it); ``"lazy"`` loads on the first request. Either way the load time is kept
(``load_s``) and logged. A model that fails to load fails every later request with
:class:`EmbedderLoadError` naming the path; nothing retries it (a broken folder stays broken).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cache.embedder import Embedder, EmbedderLoadError, limit_blas_threads
from cache.fair_turns import FairTurns

log = logging.getLogger("nearshore.embedder")

# A foreground call's texts go to the worker this many at a time, each chunk a turn shared fairly across
# keys (cache/fair_turns.py): another key's short call waits for one chunk of a long one, not all of it.
FAIR_CHUNK = 32

# The background thread's niceness: below a lookup's thread and the event loop, above nothing else.
BACKGROUND_NICE = 10

LoadWhen = Literal["eager", "lazy"]
PoolState = Literal["unloaded", "loading", "ready", "failed"]


class OutOfScope(RuntimeError):
    """No embedder the request may use (a region embeds, and none within its data-residency scope serves
    the model): this request's lookup is a miss; the cache is not broken."""


class EmbedderBusy(RuntimeError):
    """More requests are waiting than the queue holds; try again shortly."""


class TooManyTokens(ValueError):
    """The texts of one call come to more word pieces than its budget (counted before any is embedded)."""

    def __init__(self, num_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"the input comes to {num_tokens} tokens; at most {max_tokens} may be embedded at once"
        )
        self.num_tokens, self.max_tokens = num_tokens, max_tokens


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: np.ndarray  # [n, dim] float32, unit rows
    num_tokens: int  # word pieces embedded, after truncation


class EmbedderPool:
    """``await pool.embed(texts)`` on a worker thread; ``start()`` / ``close()`` around its lifetime."""

    def __init__(
        self,
        load: Callable[[], Embedder],
        *,
        source: str,
        load_when: LoadWhen = "lazy",
        max_waiting: int = 64,
        blas_threads: int = 1,
        yield_to_others: bool = False,
    ) -> None:
        self._load = load
        # Its callers' work runs at the background's low priority too: where another engine shares the
        # cores and must not wait behind it (a region's chat decode), and takes all the idle CPU it leaves.
        self.yield_to_others = yield_to_others
        self.source = source  # the folder (or package) it loads from, for messages
        self.load_when = load_when
        self.max_waiting = max_waiting
        self.blas_threads = blas_threads
        self._executor: ThreadPoolExecutor | None = None
        self._background: ThreadPoolExecutor | None = None
        self._embedder: Embedder | None = None
        self._loading: asyncio.Future[Embedder] | None = None
        self.failure: str | None = None
        self.load_s = 0.0
        self.num_waiting = 0  # calls submitted and not yet finished
        self._foreground = 0  # foreground calls submitted and not yet finished
        self._quiet = asyncio.Event()  # set while no foreground call waits: background work may go
        self._quiet.set()
        self._turns = FairTurns()  # the foreground worker's, by share key

    @property
    def loaded(self) -> Embedder | None:
        return self._embedder

    @property
    def state(self) -> PoolState:
        if self.failure is not None:
            return "failed"
        if self._embedder is not None:
            return "ready"
        return "loading" if self._loading is not None else "unloaded"

    async def start(self) -> None:
        limit_blas_threads(self.blas_threads)  # process-wide: see limit_blas_threads
        low = _yield_the_cpu if self.yield_to_others else None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder", initializer=low)
        self._background = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="embedder-background", initializer=_yield_the_cpu
        )
        if self.load_when == "eager":
            self._begin_load()

    async def close(self) -> None:
        """Drop what still waits and let the text in hand finish, without blocking the event loop."""
        for executor in (self._executor, self._background):
            if executor is not None:
                await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        self._executor = self._background = None

    async def embedder(self) -> Embedder:
        """The loaded embedder, loading it first if needed; :class:`EmbedderLoadError` if it cannot load."""
        if self._embedder is not None:
            return self._embedder
        if self.failure is not None:
            raise EmbedderLoadError(self.failure)
        return await asyncio.shield(self._begin_load())

    async def embed(self, texts: Sequence[str], regions: frozenset[str] | None = None) -> np.ndarray:
        """The texts' vectors (``regions``, where a region embeds, is no concern of a local pool)."""
        return (await self._run(texts, count=False, max_tokens=None)).vectors

    async def embed_counted(
        self, texts: Sequence[str], max_tokens: int | None = None, share_key: str = ""
    ) -> Embedded:
        """The vectors and the number of word pieces they came from (what /v1/embeddings bills);
        :class:`TooManyTokens` past ``max_tokens``, before any work on the vectors. ``share_key``: whose
        call it is (the edge's per-key id): calls share the worker fairly by it, a chunk at a time."""
        return await self._run(texts, count=True, max_tokens=max_tokens, share_key=share_key)

    async def embed_background(
        self, texts: Sequence[str], regions: frozenset[str] | None = None
    ) -> np.ndarray:
        """As :meth:`embed`, for work nobody waits on (the audit): each text waits until no foreground
        call is waiting, and goes alone, so a lookup that comes meanwhile waits for one text at most."""
        rows = []
        for text in texts:
            while self._foreground:
                await self._quiet.wait()
            rows.append((await self._run([text], count=False, max_tokens=None, foreground=False)).vectors)
        return np.concatenate(rows) if rows else np.empty((0, 0), dtype=np.float32)

    async def _run(
        self,
        texts: Sequence[str],
        count: bool,
        max_tokens: int | None,
        foreground: bool = True,
        share_key: str = "",
    ) -> Embedded:
        if self.num_waiting >= self.max_waiting:
            raise EmbedderBusy(f"{self.num_waiting} embedding requests are already waiting")
        self.num_waiting += 1
        if foreground:
            self._foreground += 1
            self._quiet.clear()
        try:
            embedder = await self.embedder()
            loop = asyncio.get_running_loop()
            worker = self._worker(foreground)
            if not foreground:
                return await loop.run_in_executor(worker, _embed, embedder, list(texts), count, max_tokens)
            return await self._in_turns(embedder, list(texts), count, max_tokens, share_key)
        finally:
            self.num_waiting -= 1
            if foreground:
                self._foreground -= 1
                if not self._foreground:
                    self._quiet.set()

    async def _in_turns(
        self, embedder: Embedder, texts: list[str], count: bool, max_tokens: int | None, share_key: str
    ) -> Embedded:
        """The call's tokens counted (and checked) in one turn, then its texts a chunk a turn."""
        loop, worker = asyncio.get_running_loop(), self._worker()
        num_tokens = 0
        if count:
            await self._turns.take(share_key)
            try:
                num_tokens = await loop.run_in_executor(worker, _count, embedder, texts, max_tokens)
            finally:
                self._turns.release()
        rows = []
        for start in range(0, max(len(texts), 1), FAIR_CHUNK):
            await self._turns.take(share_key)
            try:
                chunk = texts[start : start + FAIR_CHUNK]
                rows.append(await loop.run_in_executor(worker, embedder.embed, chunk))
            finally:
                self._turns.release()
        return Embedded(rows[0] if len(rows) == 1 else np.concatenate(rows), num_tokens)

    def _worker(self, foreground: bool = True) -> ThreadPoolExecutor:
        executor = self._executor if foreground else self._background
        if executor is None:
            raise RuntimeError("the embedder pool is not started (or already closed)")
        return executor

    def _begin_load(self) -> asyncio.Future[Embedder]:
        if self._loading is None:
            loop = asyncio.get_running_loop()
            self._loading = asyncio.ensure_future(self._load_now(loop))
            # An eager load may fail before anyone awaits it: its error is kept in self.failure.
            self._loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._loading

    async def _load_now(self, loop: asyncio.AbstractEventLoop) -> Embedder:
        started = time.perf_counter()
        try:
            embedder = await loop.run_in_executor(self._worker(), self._load)
        except EmbedderLoadError as exc:
            self.failure = str(exc)
        except Exception as exc:  # any other failure is still a load failure, and says where from
            self.failure = f"cannot load the embedding model from {self.source}: {exc!r}"
        else:
            self.load_s = time.perf_counter() - started
            self._embedder = embedder
            log.info(
                "embedder %s loaded from %s in %.2fs (%s, %d dims, up to %d tokens a text)",
                embedder.name,
                self.source,
                self.load_s,
                embedder.backend,
                embedder.dim,
                embedder.max_tokens,
            )
            return embedder
        log.error("embedder unavailable: %s", self.failure)
        raise EmbedderLoadError(self.failure)


def _yield_the_cpu() -> None:
    """Lower this thread's priority (Linux schedules threads apart; elsewhere it stays as it was)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


def _count(embedder: Embedder, texts: list[str], max_tokens: int | None) -> int:
    num_tokens = sum(embedder.count_tokens(texts))
    if max_tokens is not None and num_tokens > max_tokens:
        raise TooManyTokens(num_tokens, max_tokens)
    return num_tokens


def _embed(embedder: Embedder, texts: list[str], count: bool, max_tokens: int | None) -> Embedded:
    num_tokens = _count(embedder, texts, max_tokens) if count else 0
    return Embedded(embedder.embed(texts), num_tokens)
