"""The in-process rate limiter: each key's sliding-window log kept in this process (one edge, or the
fallback of the shared one while Redis is down). The algorithm and its guarantees: :mod:`edge.limits`."""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from edge.limits import (
    ALLOWED,
    BY_REQUESTS,
    BY_TOKENS,
    FIT_SCAN_ENTRIES,
    TOO_LARGE,
    UNLIMITED,
    WINDOW_S,
    Decision,
    LimitSpec,
    check_tokens,
    decision_of,
)


@dataclass(slots=True)
class _Entry:
    at: float
    tokens: int


class _Log:
    """One key's admissions in the window, oldest first (the clock never goes back), and their tokens."""

    __slots__ = ("entries", "used")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.used = 0

    def trim(self, cutoff: float) -> None:
        while self.entries and next(iter(self.entries.values())).at <= cutoff:
            _, entry = self.entries.popitem(last=False)
            self.used -= entry.tokens

    def oldest_at(self, rank: int) -> float:
        """The time of the entry ``rank`` places from the oldest, read from the nearer end (a key whose RPM
        was lowered can hold far more entries than its RPM, and is refused at the RPM-th newest)."""
        size = len(self.entries)
        if not 0 <= rank < size:
            raise IndexError(rank)
        if rank < size // 2:
            entries, steps = iter(self.entries.values()), rank
        else:
            entries, steps = reversed(self.entries.values()), size - 1 - rank
        return next(itertools.islice(entries, steps, None)).at

    def time_tokens_fit(self, tokens: int, tpm: int) -> float:
        """When enough of the oldest entries are gone for ``tokens`` more to fit, read from at most
        FIT_SCAN_ENTRIES of them; else when the last one read is gone (see edge/limits.py)."""
        freed = 0
        at = 0.0
        for entry in itertools.islice(self.entries.values(), FIT_SCAN_ENTRIES):
            freed += entry.tokens
            at = entry.at
            if self.used - freed + tokens <= tpm:
                break
        return at


class MemoryLimiter:
    """Limits kept in this process: one edge on its own, or the fallback while Redis is unreachable."""

    settles_in_memory = True

    def __init__(self, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._logs: dict[str, _Log] = {}
        self._next_sweep = clock() + window_s
        # An admission's id: unique across processes (a random prefix; the ids may reach Redis when it
        # comes back) without a system call per request (os.urandom's cost is on every admission).
        self._member_prefix = os.urandom(8).hex() + "-"
        self._members = itertools.count()

    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision:
        check_tokens(tokens)
        if not spec.rpm and not spec.tpm:
            return UNLIMITED
        now = self._clock()
        self._sweep(now)
        history = self._logs.setdefault(key_id, _Log())
        history.trim(now - self.window_s)
        count, used = len(history.entries), history.used

        def expiry(at: float) -> float:
            return max(0.0, at + self.window_s - now)

        verdict, retry = ALLOWED, 0.0
        if spec.rpm and count >= spec.rpm:
            verdict, retry = BY_REQUESTS, expiry(history.oldest_at(count - spec.rpm))
        if spec.tpm and tokens > spec.tpm:
            verdict, retry = TOO_LARGE, self.window_s
        elif spec.tpm and used + tokens > spec.tpm:
            verdict = verdict or BY_TOKENS
            retry = max(retry, expiry(history.time_tokens_fit(tokens, spec.tpm)))

        member = ""
        if verdict == ALLOWED:
            member = f"{self._member_prefix}{next(self._members):x}"
            history.entries[member] = _Entry(now, tokens)
            history.used += tokens
            count, used = count + 1, used + tokens
        reset = expiry(history.oldest_at(0)) if history.entries else 0.0
        return decision_of(spec, tokens, self.window_s, verdict, count, used, reset, retry, member)

    def record(self, key_id: str, member: str, tokens: int) -> None:
        """Note an admission made elsewhere (the shared limiter's, through Redis) in this key's log: what
        this process admitted, should Redis lose it or go away."""
        now = self._clock()
        self._sweep(now)
        history = self._logs.setdefault(key_id, _Log())
        history.trim(now - self.window_s)
        history.entries[member] = _Entry(now, tokens)
        history.used += tokens

    def has_recent(self, key_id: str) -> bool:
        """Whether this key has an entry in the window (no list built: the shared limiter asks this on every
        admission)."""
        history = self._logs.get(key_id)
        if history is None:
            return False
        history.trim(self._clock() - self.window_s)
        return bool(history.entries)

    def logged_keys(self) -> list[str]:
        """The keys with a log (some may hold no entry left in the window)."""
        return list(self._logs)

    def recent(self, key_id: str) -> list[tuple[str, int, int]]:
        """This key's entries in the window: (id, age in ms, tokens), oldest first."""
        history = self._logs.get(key_id)
        if history is None:
            return []
        now = self._clock()
        history.trim(now - self.window_s)
        return [(m, int((now - e.at) * 1000), e.tokens) for m, e in history.entries.items()]

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None:
        check_tokens(actual_tokens)
        history = self._logs.get(key_id)
        entry = history.entries.get(reservation) if history else None
        if history is None or entry is None:
            return  # expired, or never ours: nothing to refund
        history.used += actual_tokens - entry.tokens
        entry.tokens = actual_tokens

    def backend_up(self) -> bool:
        return True

    def store_resets(self) -> int:
        return 0  # nothing shared to lose

    async def close(self) -> None:
        self._logs.clear()

    def _sweep(self, now: float) -> None:
        """Forget keys idle for a whole window, so that memory follows active keys only."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.window_s
        cutoff = now - self.window_s
        idle = [
            k
            for k, w in self._logs.items()
            if not w.entries or next(reversed(w.entries.values())).at <= cutoff
        ]
        for key_id in idle:
            del self._logs[key_id]
