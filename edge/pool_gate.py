"""Per-pool in-flight limits at the edge, with a bounded queue served by the key's tier.

A pool (large, small, embedding: the pool class of the regions that serve a model) takes at most
``max_inflight`` requests from this edge at once: by default the sum of its replicas' capacities, so the
edge queues what the regions would only queue later, farther away, and serves its best tiers first. A
request that finds the pool full waits in a queue ordered by its key's tier (``tier_order``, first is
served first; unlisted tiers after the listed ones), then by arrival. A full queue, or a wait past
``max_wait_s``, answers 503 ``overloaded`` with ``Retry-After`` at once. Each key's share of the pool is
capped before it queues here (``shares``, :mod:`edge.key_share`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from edge.config import PoolsConfig
from edge.key_share import KeyShares
from geo.route import Replica
from nearshore.protocol.errors import OVERLOADED, ApiError


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class PoolGate:
    """One pool's slots and its queue. All on the event loop: no locks."""

    def __init__(
        self,
        name: str,
        max_inflight: int,
        max_queue: int,
        max_wait_s: float,
        tiers: list[str],
        shares: KeyShares | None = None,
    ) -> None:
        self.name = name
        self.shares = shares  # the per-key caps (None: none)
        self.max_inflight = max_inflight
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self._rank = {tier: i for i, tier in enumerate(tiers)}
        self.inflight = 0
        self.waiting = 0  # live waiters (the heap may still hold some that left)
        self._queue: list[_Waiter] = []
        self._seq = itertools.count()

    async def acquire(self, tier: str) -> float:
        """Take a slot, waiting in tier order if the pool is full; the seconds waited."""
        if self.inflight < self.max_inflight and not self.waiting:
            self.inflight += 1
            return 0.0
        if self.waiting >= self.max_queue:
            raise self._refusal(f"its queue is full ({self.max_queue} waiting)")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(self._rank.get(tier, len(self._rank)), next(self._seq), loop.create_future())
        heapq.heappush(self._queue, waiter)
        self.waiting += 1
        started = loop.time()
        try:
            async with asyncio.timeout(self.max_wait_s):
                await asyncio.shield(waiter.future)
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # it was handed a slot as it left: pass it on
            else:
                waiter.future.cancel()  # skipped when its turn comes
                self.waiting -= 1
            if isinstance(exc, TimeoutError):
                raise self._refusal(f"no slot within {self.max_wait_s:g}s") from None
            raise
        return loop.time() - started

    def release(self) -> None:
        """Give the slot to the next waiter in order, or free it."""
        while self._queue:
            waiter = heapq.heappop(self._queue)
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes on: inflight stays
                self.waiting -= 1
                return
        self.inflight -= 1

    def _refusal(self, why: str) -> ApiError:
        return ApiError(
            OVERLOADED,
            f"The {self.name} pool is at its limit of {self.max_inflight} requests in flight and {why}. "
            "Retry shortly.",
            retry_after_s=1,
        )


POOL_CLASSES = ("large", "small", "embedding")


def make_gates(config: PoolsConfig, replicas: Sequence[Replica]) -> dict[str, PoolGate]:
    gates = {}
    for pool in POOL_CLASSES:
        limits = getattr(config, pool)
        capacity = sum(r.spec.capacity for r in replicas if r.spec.pool == pool)
        shares = KeyShares(pool, config.key_share)
        gates[pool] = PoolGate(
            pool,
            limits.max_inflight or capacity,
            limits.max_queue,
            limits.max_wait_s,
            config.tier_order,
            shares,
        )
    return gates
