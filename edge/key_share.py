"""One API key's share of a pool at the edge: caps on its requests and tokens in flight.

The regions of a pool hold every running sequence's prompt and completion budget in KV memory; one key's
four long prompts can fill it and make every other key's short chat wait behind them. So, in each pool, a
key may have at most ``max_concurrent`` requests and ``max_tokens_in_flight`` tokens (each request's prompt
estimate plus its max_tokens) in flight, or its tier's or its own caps (``pools.key_share`` in the config).

What a user of a gateway expects: a burst is smoothed, a refusal says what to do. A request over its key's
cap waits (in arrival order, at most ``max_wait_s``, at most ``max_queue`` of them per key) for that key's own
earlier requests to end; then it is refused with 429 ``rate_limit_error`` / ``concurrency_limit_exceeded``
and ``Retry-After``. Work-conserving by default (``shared_only``): the caps bind only while another key uses
the pool (a request in flight or waiting there, or one that ended within ``shared_within_s``), so a key alone
(a demo, a benchmark) is never held back. A request bigger than the token cap on its own still runs once its
key has nothing else in flight. Counts are per edge process: each worker keeps its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edge.config import KeyShareConfig
from edge.keys import ApiKey
from nearshore.protocol.errors import CONCURRENCY_LIMITED, ApiError

RETRY_AFTER_S = 1.0  # the key's own earlier requests are what must end


@dataclass(frozen=True, slots=True)
class Caps:
    max_concurrent: int  # 0: no cap
    max_tokens_in_flight: int  # 0: no cap


@dataclass(eq=False, slots=True)
class _Waiter:
    tokens: int
    caps: Caps
    future: asyncio.Future[None]


@dataclass(eq=False, slots=True)
class _Held:
    """One key's requests and tokens in flight in the pool, and its requests waiting for room."""

    requests: int = 0
    tokens: int = 0
    waiters: deque[_Waiter] = field(default_factory=deque)


class KeyShares:
    """One pool's per-key caps. All on the event loop: no locks."""

    def __init__(
        self, pool: str, config: KeyShareConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pool = pool
        self.config = config
        self._clock = clock
        self._held: dict[str, _Held] = {}  # keys with a request in flight or waiting here
        self._ended: OrderedDict[str, float] = OrderedDict()  # key id -> when its last request here ended

    def caps(self, key: ApiKey) -> Caps:
        """The section's caps, then the key's tier's, then the key's own (each may set one or both)."""
        c = self.config
        concurrent, tokens = c.max_concurrent, c.max_tokens_in_flight
        for own in (c.tiers.get(key.tier), c.keys.get(key.key_id)):
            if own is not None:
                concurrent = concurrent if own.max_concurrent is None else own.max_concurrent
                tokens = tokens if own.max_tokens_in_flight is None else own.max_tokens_in_flight
        return Caps(concurrent, tokens)

    def in_flight(self, key_id: str) -> tuple[int, int]:
        """The key's requests and tokens in flight here."""
        held = self._held.get(key_id)
        return (held.requests, held.tokens) if held is not None else (0, 0)

    async def acquire(self, key: ApiKey, tokens: int) -> float:
        """Take the key's share for a request of ``tokens``, waiting while it is over its caps; the
        seconds waited. Raises the 429 when its queue is full or the wait runs out."""
        key_id, caps = key.key_id, self.caps(key)
        held = self._held.get(key_id)
        if held is None:
            held = self._held[key_id] = _Held()
        if not held.waiters and self._fits(key_id, held, tokens, caps):
            held.requests += 1
            held.tokens += tokens
            return 0.0
        config = self.config
        if len(held.waiters) >= config.max_queue or config.max_wait_s <= 0:
            self._forget_if_idle(key_id, held)
            why = f"{len(held.waiters)} more of its requests wait already" if config.max_wait_s > 0 else ""
            raise self._refusal(held, caps, why)
        waiter = _Waiter(tokens, caps, asyncio.get_running_loop().create_future())
        held.waiters.append(waiter)
        started = self._clock()
        try:
            async with asyncio.timeout(config.max_wait_s):
                await asyncio.shield(waiter.future)
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(key_id, tokens)  # it was handed the share as it left: give it back
            else:
                waiter.future.cancel()
                held.waiters.remove(waiter)
                self._forget_if_idle(key_id, held)
                self._grant(key_id)  # the next of its requests may fit where this one did not
            if isinstance(exc, TimeoutError):
                raise self._refusal(held, caps, f"none ended within {config.max_wait_s:g}s") from None
            raise
        return self._clock() - started

    def release(self, key_id: str, tokens: int) -> None:
        """A request of the key's ended (every exit: answered, failed, left, a cache hit that raced it)."""
        held = self._held.get(key_id)
        assert held is not None and held.requests > 0, f"release without a share ({key_id})"
        held.requests -= 1
        held.tokens -= tokens
        self._ended[key_id] = self._clock()
        self._ended.move_to_end(key_id)
        self._prune()
        self._forget_if_idle(key_id, held)
        # Its own waiters may fit now; others' too, if this key no longer shares the pool with them.
        for waiting in [k for k, h in self._held.items() if h.waiters]:
            self._grant(waiting)

    def _grant(self, key_id: str) -> None:
        """Hand the share to the key's waiters, oldest first, while they fit."""
        held = self._held.get(key_id)
        while held is not None and held.waiters:
            waiter = held.waiters[0]
            if not self._fits(key_id, held, waiter.tokens, waiter.caps):
                return
            held.waiters.popleft()
            held.requests += 1
            held.tokens += waiter.tokens
            waiter.future.set_result(None)

    def _fits(self, key_id: str, held: _Held, tokens: int, caps: Caps) -> bool:
        if held.requests == 0:
            return True  # alone in flight, whatever its size: else a big request could never run
        over = (caps.max_concurrent and held.requests >= caps.max_concurrent) or (
            caps.max_tokens_in_flight and held.tokens + tokens > caps.max_tokens_in_flight
        )
        return not over or not self._shared(key_id)

    def _shared(self, key_id: str) -> bool:
        """Whether another key uses the pool: a request in flight or waiting, or one ended lately."""
        if not self.config.shared_only or len(self._held) > 1 or key_id not in self._held:
            return True
        self._prune()
        return len(self._ended) > (1 if key_id in self._ended else 0)

    def _prune(self) -> None:
        """Forget the keys whose last request here ended more than shared_within_s ago."""
        horizon = self._clock() - self.config.shared_within_s
        ended = self._ended
        while ended and next(iter(ended.values())) < horizon:
            ended.popitem(last=False)

    def _forget_if_idle(self, key_id: str, held: _Held) -> None:
        if held.requests == 0 and not held.waiters and self._held.get(key_id) is held:
            del self._held[key_id]

    def _refusal(self, held: _Held, caps: Caps, why: str) -> ApiError:
        limits = []
        if caps.max_concurrent:
            limits.append(f"{caps.max_concurrent} requests")
        if caps.max_tokens_in_flight:
            limits.append(f"{caps.max_tokens_in_flight} tokens")
        shared = " while other keys use the pool" if self.config.shared_only else ""
        why = f", and {why}" if why else ""
        return ApiError(
            CONCURRENCY_LIMITED,
            f"This API key has {held.requests} requests ({held.tokens} tokens: prompts and max_tokens) in "
            f"flight in the {self.pool} pool, at its limit of {' and '.join(limits)} in flight{shared}{why}. "
            f"Retry after {RETRY_AFTER_S:g}s, or send fewer requests at once.",
            retry_after_s=RETRY_AFTER_S,
        )
