"""Each scope's fair part of the cache's space, once the space is full.

The entries share one folder and one least-recently-used order, so a scope (a tenant, a key or an end user:
the cache's ``scope`` setting) storing answers faster than the others would evict everyone else's: one
tenant's flood of new questions would empty every other tenant's cache. While the entries have room, every
answer is stored. Once they fill their space, a scope may store only while what it stored in the last
``period_s`` (the entries' time to live: nothing stored earlier is still held) stays within its fair part:
the space over the scopes that stored in that time. One scope alone has all of it; two have half each; a
scope past its part stores nothing more until its older writes age out, so the evictions its new answers
cause fall on its own old ones' turn, not on the others'.

What a process counts is what it stored itself (several edges, or workers, each count their own).
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUCKETS = 24  # the period in buckets: a write ages out within 1/24 of the period of its time
# Scopes tracked at once: past it, the one first tracked is forgotten. The sweep at each new bucket reads
# them all on the event loop (10,000: about 5 ms).
MAX_SCOPES = 10_000


class ScopeShares:
    def __init__(
        self,
        capacity_bytes: int,
        period_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_scopes: int = MAX_SCOPES,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.bucket_s = period_s / BUCKETS
        self.clock = clock
        self.max_scopes = max_scopes
        self.refused = 0  # answers not stored because their scope was past its part (for /metrics)
        self._stored: dict[str, dict[int, int]] = {}  # scope -> bucket number -> bytes stored in it
        self._swept = self._bucket()

    def may_store(self, scope: str, nbytes: int, full: bool) -> bool:
        """Whether an answer of ``nbytes`` for ``scope`` may be stored: always while the entries have room
        (``full`` False), else only within the scope's fair part. Count it with :meth:`stored` once it is."""
        if not full:
            return True
        self._sweep_if_due()
        buckets = self._stored.get(scope)
        scopes = len(self._stored) + (buckets is None)
        held = sum(buckets.values()) if buckets else 0
        if held + nbytes > self.capacity_bytes / scopes:
            self.refused += 1
            return False
        return True

    def stored(self, scope: str, nbytes: int) -> None:
        bucket = self._sweep_if_due()
        buckets = self._stored.get(scope)
        if buckets is None:
            if len(self._stored) >= self.max_scopes:
                del self._stored[next(iter(self._stored))]
            buckets = self._stored[scope] = {}
        buckets[bucket] = buckets.get(bucket, 0) + nbytes

    def stored_lately(self, scope: str) -> int:
        """What ``scope`` stored in the last period, in bytes."""
        self._sweep_if_due()
        return sum(self._stored.get(scope, {}).values())

    def _bucket(self) -> int:
        return int(self.clock() // self.bucket_s)

    def _sweep_if_due(self) -> int:
        """Drop the writes that aged out of the period, and the scopes left with none (once a bucket);
        the current bucket."""
        bucket = self._bucket()
        if bucket == self._swept:
            return bucket
        aged = range(self._swept - BUCKETS + 1, bucket - BUCKETS + 1)  # the buckets that left the period
        self._swept = bucket
        if len(aged) >= BUCKETS:
            self._stored.clear()
            return bucket
        for scope in list(self._stored):
            buckets = self._stored[scope]
            for old in aged:
                buckets.pop(old, None)
            if not buckets:
                del self._stored[scope]
        return bucket
