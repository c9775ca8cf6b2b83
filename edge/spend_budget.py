"""Per-key spending budgets, held like TPM reservations: the worst case up front, the real cost at the end.

A request on a budgeted key holds its worst-case cost (every prompt token at the input price, every
``max_tokens`` token at the output price) until it settles; a request is admitted only if what the key has
spent plus everything held plus its own worst case stays within the budget. So many requests at once can never
overspend it together, as they could when only the spend so far was checked.

Two books keep the same rules. :class:`BudgetBook` keeps them in this process: what a key has spent is read
from the ledger once, then kept up to date as requests settle. :class:`SharedBudgets` keeps them in Redis
(through the Redis limiter's connection) for edges and workers that share limits: one Lua script per hold,
seeded from what each process knows (the ledger, and the spend it last saw there) the first time it sees a
key's hash, so several processes can never overspend a key together, and a Redis restart does not reset it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edge.keys import ApiKey
from edge.limits import LimiterUnavailable
from edge.lua_script import Script
from nearshore.protocol.errors import EXCEEDS_LIMIT, QUOTA_EXCEEDED, ApiError

if TYPE_CHECKING:  # redis-py is loaded only by an edge that shares its limits
    from edge.limits_redis import RedisLimiter

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


# KEYS: the key's budget hash (spent, held, epoch: made with the hash, so a Redis that restarted empty has a
# new one). ARGV: budget, worst, the epoch this process last saw ("" if none), what it knows the key has
# spent ("" when not read yet). Returns {verdict, spent, held, epoch}; verdict -1 asks for that knowledge:
# the hash is new, or new to this process. Each process raises the spend to what it knows (the most it ever
# saw the fleet's spend at, plus its own since, or its ledger's): never above what was spent, and after a
# restart, what the processes that were counting knew (a restart used to leave one edge's ledger alone).
_HOLD = Script.of("""
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch ~= ARGV[3] or not epoch then
  if ARGV[4] == '' then return {-1, '0', '0', epoch or ''} end
  if not epoch then
    local t = redis.call('TIME')
    epoch = t[1] .. '.' .. t[2]
    redis.call('HSET', KEYS[1], 'epoch', epoch)
  end
  local known = tonumber(ARGV[4])
  if known > tonumber(redis.call('HGET', KEYS[1], 'spent') or '0') then
    redis.call('HSET', KEYS[1], 'spent', ARGV[4])
  end
end
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local held = tonumber(redis.call('HGET', KEYS[1], 'held') or '0')
local budget, worst = tonumber(ARGV[1]), tonumber(ARGV[2])
local verdict = 0
if spent >= budget then verdict = 1
elseif worst > budget then verdict = 2
elseif spent + held + worst > budget then verdict = 3
else redis.call('HINCRBYFLOAT', KEYS[1], 'held', ARGV[2]) end
return {verdict, tostring(spent), tostring(held), epoch}
""")
# KEYS: the hash. ARGV: the hold to release, the cost to add to what was spent. Returns the spend.
_SETTLE = Script.of("""
if redis.call('HEXISTS', KEYS[1], 'epoch') == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'spent', ARGV[2])
end
local held = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], 'held', '-' .. ARGV[1]))
if held < 1e-12 then redis.call('HSET', KEYS[1], 'held', '0') end
return redis.call('HGET', KEYS[1], 'spent') or '0'
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
        # Per key: the hash's epoch this process last saw, and the most it knows the key has spent (what
        # Redis last said, plus this process's own costs since): what it seeds a new hash with.
        self._epochs: dict[str, str] = {}
        self._known: dict[str, float] = {}

    async def hold(self, key: ApiKey, worst_usd: float) -> Hold | None:
        budget = key.budget_usd
        if budget is None:
            return None
        key_id = key.key_id
        keys = [f"{self.key_prefix}{{{key_id}}}"]
        args = (budget, repr(worst_usd), self._epochs.get(key_id, ""))
        result = await self.limiter.run_shared(_HOLD, keys, (*args, ""))
        if result is not None and int(result[0]) == _UNSEEDED:
            known = max(await self.local.spent_once(key_id), self._known.get(key_id, 0.0))
            result = await self.limiter.run_shared(_HOLD, keys, (*args, repr(known)))
        if result is None:  # Redis is unreachable
            if self.limiter.fail_mode == "closed":
                raise LimiterUnavailable("the budget store (Redis) is unreachable")
            return await self.local.hold(key, worst_usd)
        verdict, spent, held = int(result[0]), float(result[1]), float(result[2])
        epoch = result[3]
        self._epochs[key_id] = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
        self._known[key_id] = max(self._known.get(key_id, 0.0), spent)
        if error := refusal(verdict, spent, held, budget, worst_usd):
            raise error
        return Hold(key.key_id, worst_usd, shared=True)

    async def settle(self, hold: Hold | None, key_id: str, cost_usd: float) -> None:
        if hold is None or not hold.shared:
            await self.local.settle(hold, key_id, cost_usd)
            return
        keys = [f"{self.key_prefix}{{{key_id}}}"]
        spent = await self.limiter.run_shared(_SETTLE, keys, (repr(hold.usd), repr(cost_usd)))
        known = self._known.get(key_id, 0.0) + cost_usd
        self._known[key_id] = max(known, float(spent)) if spent is not None else known
