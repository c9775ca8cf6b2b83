"""Per-key spending budgets, held like TPM reservations: the worst case up front, the real cost at the end.

A request on a budgeted key holds its worst-case cost (every prompt token at the input price, every
``max_tokens`` token at the output price) until it settles; a request is admitted only if what the key has
spent plus everything held plus its own worst case stays within the budget. So many requests at once can never
overspend it together, as they could when only the spend so far was checked.

Two books keep the same rules. :class:`BudgetBook` keeps them in this process: what a key has spent is read
from the ledger once, then kept up to date as requests settle. :class:`SharedBudgets` keeps them in Redis
(through the Redis limiter's connection) for edges and workers that share limits: one Lua script per hold,
seeded from the ledger the first time a key is seen, so several processes can never overspend a key together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from edge.keys import ApiKey
from edge.limits import LimiterUnavailable
from edge.limits_redis import RedisLimiter, Script
from nearshore.protocol.errors import EXCEEDS_LIMIT, QUOTA_EXCEEDED, ApiError

_ALLOWED, _SPENT, _TOO_LARGE, _NOT_NOW, _UNSEEDED = 0, 1, 2, 3, -1


@dataclass(frozen=True, slots=True)
class Hold:
    key_id: str
    usd: float
    shared: bool = False  # held in Redis (else in this process)


class Budgets(Protocol):
    async def hold(self, key: ApiKey, worst_usd: float) -> Hold | None: ...

    async def settle(self, hold: Hold | None, key_id: str, cost_usd: float) -> None: ...


def refusal(verdict: int, spent: float, held: float, budget: float, worst_usd: float) -> ApiError | None:
    """The OpenAI-shaped answer to a hold the budget cannot take, or None when it can."""
    if verdict == _SPENT:
        return ApiError(QUOTA_EXCEEDED, f"This key has used its budget (${spent:.6f} of ${budget:.6f}).")
    if verdict == _TOO_LARGE:
        return ApiError(
            EXCEEDS_LIMIT,
            f"This request could cost up to ${worst_usd:.6f}, more than this key's whole budget of "
            f"${budget:.6f}: lower max_tokens or shorten the prompt.",
            param="max_tokens",
        )
    if verdict == _NOT_NOW:
        return ApiError(
            QUOTA_EXCEEDED,
            f"This request could cost up to ${worst_usd:.6f}; this key has ${budget - spent - held:.6f} "
            "of its budget left after the requests in flight.",
            retry_after_s=1,
        )
    return None


def verdict_of(spent: float, held: float, budget: float, worst_usd: float) -> int:
    if spent >= budget:
        return _SPENT
    if worst_usd > budget:
        return _TOO_LARGE
    if spent + held + worst_usd > budget:
        return _NOT_NOW
    return _ALLOWED


class BudgetBook:
    """Budgets held in this process."""

    def __init__(self, spent_of: Callable[[str], float]) -> None:
        self.spent_of = spent_of  # blocking: a ledger query, run in a thread
        self.spent: dict[str, float] = {}
        self.held: dict[str, float] = {}
        self._loading: dict[str, asyncio.Future[float]] = {}

    async def hold(self, key: ApiKey, worst_usd: float) -> Hold | None:
        """Hold ``worst_usd`` against the key's budget, or raise the OpenAI-shaped refusal."""
        budget = key.budget_usd
        if budget is None:
            return None
        if key.key_id not in self.spent:
            self.spent.setdefault(key.key_id, await self.spent_once(key.key_id))
        # From here to the end nothing awaits: the check and the hold are one step for this event loop.
        spent, held = self.spent[key.key_id], self.held.get(key.key_id, 0.0)
        if error := refusal(verdict_of(spent, held, budget, worst_usd), spent, held, budget, worst_usd):
            raise error
        self.held[key.key_id] = held + worst_usd
        return Hold(key.key_id, worst_usd)

    async def spent_once(self, key_id: str) -> float:
        """The key's spend from the ledger, read once however many of its requests ask at the same time."""
        loading = self._loading.get(key_id)
        if loading is None:
            loading = asyncio.ensure_future(asyncio.to_thread(self.spent_of, key_id))
            self._loading[key_id] = loading
            loading.add_done_callback(lambda _done: self._loading.pop(key_id, None))
        return await asyncio.shield(loading)

    async def settle(self, hold: Hold | None, key_id: str, cost_usd: float) -> None:
        """Release the hold (if any) and add the real cost to what the key has spent."""
        if hold is not None:
            left = self.held.get(hold.key_id, 0.0) - hold.usd
            if left > 1e-12:
                self.held[hold.key_id] = left
            else:
                self.held.pop(hold.key_id, None)
        if key_id in self.spent:
            self.spent[key_id] += cost_usd


# KEYS: the key's budget hash (spent, held). ARGV: budget, worst, the ledger's spend ("" when not read yet).
# Returns {verdict, spent, held}; verdict -1 asks for the ledger's spend (the key is new to this Redis).
_HOLD = Script.of("""
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent then
  if ARGV[3] == '' then return {-1, '0', '0'} end
  redis.call('HSET', KEYS[1], 'spent', ARGV[3])
  spent = ARGV[3]
end
spent = tonumber(spent)
local held = tonumber(redis.call('HGET', KEYS[1], 'held') or '0')
local budget, worst = tonumber(ARGV[1]), tonumber(ARGV[2])
local verdict = 0
if spent >= budget then verdict = 1
elseif worst > budget then verdict = 2
elseif spent + held + worst > budget then verdict = 3
else redis.call('HINCRBYFLOAT', KEYS[1], 'held', ARGV[2]) end
return {verdict, tostring(spent), tostring(held)}
""")
# KEYS: the hash. ARGV: the hold to release, the cost to add to what was spent.
_SETTLE = Script.of("""
if redis.call('HEXISTS', KEYS[1], 'spent') == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'spent', ARGV[2])
end
local held = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], 'held', '-' .. ARGV[1]))
if held < 1e-12 then redis.call('HSET', KEYS[1], 'held', '0') end
return 0
""")


class SharedBudgets:
    """Budgets held in Redis, shared by every edge process that shares the Redis limiter.

    While Redis is unreachable the limiter's ``fail_mode`` decides, as for limits: "open" holds locally,
    "closed" refuses with 503.
    """

    def __init__(
        self, limiter: RedisLimiter, local: BudgetBook, key_prefix: str = "nearshore:budget:"
    ) -> None:
        self.limiter = limiter
        self.local = local
        self.key_prefix = key_prefix

    async def hold(self, key: ApiKey, worst_usd: float) -> Hold | None:
        budget = key.budget_usd
        if budget is None:
            return None
        keys = [f"{self.key_prefix}{{{key.key_id}}}"]
        result = await self.limiter.run_shared(_HOLD, keys, (budget, repr(worst_usd), ""))
        if result is not None and int(result[0]) == _UNSEEDED:
            seed = await self.local.spent_once(key.key_id)
            result = await self.limiter.run_shared(_HOLD, keys, (budget, repr(worst_usd), repr(seed)))
        if result is None:  # Redis is unreachable
            if self.limiter.fail_mode == "closed":
                raise LimiterUnavailable("the budget store (Redis) is unreachable")
            return await self.local.hold(key, worst_usd)
        verdict, spent, held = int(result[0]), float(result[1]), float(result[2])
        if error := refusal(verdict, spent, held, budget, worst_usd):
            raise error
        return Hold(key.key_id, worst_usd, shared=True)

    async def settle(self, hold: Hold | None, key_id: str, cost_usd: float) -> None:
        if hold is None or not hold.shared:
            await self.local.settle(hold, key_id, cost_usd)
            return
        keys = [f"{self.key_prefix}{{{key_id}}}"]
        await self.limiter.run_shared(_SETTLE, keys, (repr(hold.usd), repr(cost_usd)))
