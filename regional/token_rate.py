"""Generated tokens per second over a recent window: the ``tokens_per_s`` of a region's load report.

Counted where tokens are produced (the engine's step), read whenever a report is made. Tokens are added to
one-second buckets; each bucket is one tuple replaced whole, so the one writer (the engine's worker thread)
and any reader share it without a lock, and a reader never sees half an update.
"""

from __future__ import annotations


class TokenRate:
    def __init__(self, started_at_s: float, window_s: int = 10) -> None:
        self.window_s = window_s
        self._started_at_s = started_at_s
        self._buckets: list[tuple[int, int]] = [(-1, 0)] * window_s  # (whole second, tokens in it)

    def add(self, num_tokens: int, now_s: float) -> None:
        second = int(now_s)
        i = second % self.window_s
        at, count = self._buckets[i]
        self._buckets[i] = (second, count + num_tokens if at == second else num_tokens)

    def per_s(self, now_s: float) -> float:
        second = int(now_s)
        oldest = second - self.window_s + 1
        total = sum(count for at, count in self._buckets if oldest <= at <= second)
        # The window's whole seconds plus the current one's elapsed part; shorter while the meter is young,
        # never under a second (a first token is not a rate of thousands per second).
        span_s = min(self.window_s - 1 + (now_s - second), now_s - self._started_at_s)
        return total / max(span_s, 1.0)
