"""The rate limiter edges share through Redis: each key's window a sorted set and a hash, changed by one Lua
script per admission (so concurrent edges cannot overshoot), with the in-process limiter as its fallback
while Redis is unreachable. The algorithm and its guarantees: :mod:`edge.limits`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from edge.limits import (
    FIT_SCAN_ENTRIES,
    UNLIMITED,
    WINDOW_S,
    Decision,
    LimiterUnavailable,
    LimitSpec,
    check_tokens,
    decision_of,
    local_share,
)
from edge.limits_memory import MemoryLimiter
from edge.redis_scripts import Script, ScriptRunner, StoreReset

log = logging.getLogger("nearshore.edge.limits")


# KEYS: the key's zset (entry -> admitted at, ms), hash (entry -> tokens, "_sum" -> their total) and set of
# the processes that admitted its requests in the window. ARGV: window_ms, rpm, tpm, tokens, entry id, this
# process's id, "1" when it admitted some of the key's requests in the window. Returns {verdict, count, used,
# reset_ms, retry_ms}; verdict -1: Redis does not know this process's part of the window (it restarted
# empty): put it back first (_RESTORE), then ask again.
_ADMIT_LUA = """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes, on Redis < 5
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window, rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local zset, hash, admitters = KEYS[1], KEYS[2], KEYS[3]
if ARGV[7] == '1' and redis.call('SISMEMBER', admitters, ARGV[6]) == 0 then return {-1, 0, 0, 0, 0} end
local function expiry(score) return math.max(0, tonumber(score) + window - now) end

-- 1. trim, in batches (unpack has a stack limit)
while true do
  local gone = redis.call('ZRANGEBYSCORE', zset, '-inf', string.format('%.3f', now - window), 'LIMIT', 0, 500)
  if #gone == 0 then break end
  local freed = 0
  for _, amount in ipairs(redis.call('HMGET', hash, unpack(gone))) do
    freed = freed + (tonumber(amount) or 0)
  end
  redis.call('ZREM', zset, unpack(gone))
  redis.call('HDEL', hash, unpack(gone))
  redis.call('HINCRBY', hash, '_sum', -freed)
end
local count, used = redis.call('ZCARD', zset), 0
if count == 0 then redis.call('DEL', hash) else used = tonumber(redis.call('HGET', hash, '_sum') or 0) end

-- 2. check
local verdict, retry = 0, 0
if rpm > 0 and count >= rpm then
  verdict = 1
  retry = expiry(redis.call('ZRANGE', zset, count - rpm, count - rpm, 'WITHSCORES')[2])
end
if tpm > 0 and tokens > tpm then
  verdict, retry = 3, window
elseif tpm > 0 and used + tokens > tpm then
  if verdict == 0 then verdict = 2 end
  -- The oldest @FIT_SCAN_ENTRIES@ entries at most: when they leaving is not enough, the retry is when the
  -- last of them leaves (edge/limits.py FIT_SCAN_ENTRIES).
  local oldest = redis.call('ZRANGE', zset, 0, @FIT_SCAN_ENTRIES@ - 1, 'WITHSCORES')
  local freed, fits_at = 0, nil
  if #oldest > 0 then
    local ids = {}
    for i = 1, #oldest, 2 do ids[#ids + 1] = oldest[i] end
    for i, amount in ipairs(redis.call('HMGET', hash, unpack(ids))) do
      freed = freed + (tonumber(amount) or 0)
      fits_at = oldest[2 * i]
      if used - freed + tokens <= tpm then break end
    end
  end
  retry = math.max(retry, fits_at and expiry(fits_at) or window)
end

-- 3. record
if verdict == 0 then
  redis.call('ZADD', zset, string.format('%.3f', now), ARGV[5])
  redis.call('HSET', hash, ARGV[5], tokens)
  redis.call('HINCRBY', hash, '_sum', tokens)
  redis.call('PEXPIRE', zset, math.ceil(window))
  redis.call('PEXPIRE', hash, math.ceil(window))
  redis.call('SADD', admitters, ARGV[6])
  redis.call('PEXPIRE', admitters, math.ceil(window))
  count, used = count + 1, used + tokens
end
local reset = 0
if count > 0 then reset = expiry(redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')[2]) end
return {verdict, count, used, math.ceil(reset), math.ceil(retry)}
""".replace("@FIT_SCAN_ENTRIES@", str(FIT_SCAN_ENTRIES))

# KEYS: the key's hash. ARGV: entry id, actual tokens. An entry trimmed (or never there) is left alone.
_SETTLE_LUA = """
if ARGV[1] == '_sum' then return 0 end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '_sum', tonumber(ARGV[2]) - tonumber(old))
return 1
"""

# KEYS: the key's zset, hash and set of admitters. ARGV: window_ms, this process's id, then (entry id, age
# ms, tokens) per entry it admitted in the window: put back as admitted that long ago (an entry already there
# is left alone), and the process counted among the key's admitters again.
_RESTORE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = tonumber(ARGV[1])
local added = 0
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('PEXPIRE', KEYS[3], math.ceil(window))
for i = 3, #ARGV, 3 do
  local at = now - tonumber(ARGV[i + 1])
  if at > now - window and redis.call('ZADD', KEYS[1], 'NX', string.format('%.3f', at), ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
    redis.call('HINCRBY', KEYS[2], '_sum', tonumber(ARGV[i + 2]))
    added = added + 1
  end
end
if added > 0 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(window))
  redis.call('PEXPIRE', KEYS[2], math.ceil(window))
end
return added
"""

# Redis is unreachable (refused, timed out, no pooled connection free): not a bug to surface as a 500.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_LOCAL = "local-"  # prefix of reservations made by the fallback while Redis was down


_SETTLE = Script.of(_SETTLE_LUA)
_RESTORE = Script.of(_RESTORE_LUA)


__all__ = ["RedisLimiter", "Script"]  # Script: the budgets' scripts run here too (edge/spend_budget.py)


class RedisLimiter:
    """Limits shared by every edge that points at the same Redis; one script per admission (sent with the
    others of its loop turn: edge/redis_scripts.py).

    When Redis is unreachable, ``fail_mode`` decides: "open" falls back to local limits (decisions marked
    ``degraded``), "closed" raises :class:`LimiterUnavailable`. Requests then skip Redis altogether while a
    background task pings it every ``retry_interval_s``; when it answers, Redis is used again. The
    ``workers`` processes sharing the Redis (an edge's workers, times the edges: ``[limits] edges``) fall back
    at once, each counting alone: each keeps :func:`local_share` of a key's limits, so that together they
    admit no more than the limit (two each admitted all of it).

    A Redis that comes back empty (restarted without persistence, flushed) would forget the window, and
    every edge could admit a whole limit again. Each process keeps its own record of what it admitted in
    the window and notices the loss on its first admission after it (Redis no longer knows this process's
    own copy of the admission script) or within ``retry_interval_s`` (a marker it refreshes is gone). It
    then puts its part of every key's window back, and its admissions wait ``reset_grace_s`` (long enough
    for every other process to notice and put back its own) before Redis decides them with the whole
    window. What can still exceed a limit: a Redis flushed without a restart keeps the scripts, so only the
    markers tell; for up to one marker interval a process may admit through it, for keys it admitted none
    of in the window.
    """

    settles_in_memory = False

    def __init__(
        self,
        url: str,
        fail_mode: Literal["open", "closed"],
        key_prefix: str = "nearshore:rl:",
        *,
        window_s: float = WINDOW_S,
        socket_timeout_s: float = 0.25,
        connect_timeout_s: float = 1.0,
        retry_interval_s: float = 1.0,
        max_connections: int = 32,
        workers: int = 1,
        reset_grace_s: float | None = None,
    ) -> None:
        if fail_mode not in ("open", "closed"):
            raise ValueError(f"fail_mode must be 'open' or 'closed', got {fail_mode!r}")
        self.fail_mode = fail_mode
        self.workers = workers
        self.key_prefix = key_prefix
        self.window_s = window_s
        self.retry_interval_s = retry_interval_s
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=1.0,  # waiting for a free pooled connection; longer means Redis is not keeping up
            socket_timeout=socket_timeout_s,
            # Opening a connection gets longer than a command: a burst on a cold pool opens dozens at once,
            # and on a busy machine their handshakes queue behind the event loop. A refused connection still
            # fails at once; only an unanswered one (a host gone from the network) costs this, once.
            socket_connect_timeout=max(connect_timeout_s, socket_timeout_s),
            # One immediate retry on a fresh socket covers a connection Redis closed while idle; timeouts are
            # not retried, so a request waits at most about one socket timeout before the fallback decides.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._redis = Redis.from_pool(pool)
        self._scripts = ScriptRunner(self._redis)
        self._fallback = MemoryLimiter(window_s=window_s)  # also this process's record of its admissions
        self._id = os.urandom(8).hex()  # this process, among a key's admitters
        self._members = itertools.count()  # its admissions, numbered
        # This process's own copy of the script (its SHA unknown to Redis until this process loads it), so
        # that each process, not only the first to load it again, learns that Redis lost its scripts.
        self._admit = Script.of(f"{_ADMIT_LUA}-- process {self._id}\n", watches_resets=True)
        self._marker = f"{key_prefix}alive:{self._id}"
        self._marker_ms = math.ceil(max(60.0, 10 * retry_interval_s) * 1000)
        self.reset_grace_s = 2 * retry_interval_s + 1.0 if reset_grace_s is None else reset_grace_s
        self.resets = 0  # times Redis was found to have lost its state
        self._settling_until = 0.0  # admissions wait until then: the other processes put their parts back
        self._up = True
        self._watcher: asyncio.Task[None] | None = None
        # This process's marker is known to be in Redis (the watcher set it): from then on a Redis that
        # loses it is noticed; a loss before the first set cannot be told from a first start.
        self.marked = False
        self._loading: asyncio.Future[Any] | None = None  # this process's admission script, once
        self._admission_loaded = False

    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision:
        check_tokens(tokens)
        if not spec.rpm and not spec.tpm:
            return UNLIMITED
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        for _ in range(2):  # again after a reset's grace
            if self._up and self.settling():
                await asyncio.sleep(self._settling_until - time.monotonic())
            if not self._up:
                break
            try:
                if not self._admission_loaded:
                    await self._load_admission()
                decision = await self._admit_shared(key_id, spec, tokens)
            except StoreReset:
                await self._after_reset("it no longer knew this process's admission script")
                continue
            except _UNREACHABLE as exc:
                self._mark_down(exc)
                break
            if decision.allowed and decision.reservation:  # this edge's own record of it
                self._fallback.record(key_id, decision.reservation, tokens)
            return decision
        if self.fail_mode == "closed" and not self._up:
            raise LimiterUnavailable("the rate-limit store (Redis) is unreachable")
        share = local_share(spec, self.workers)
        # The fallback's log already holds what this edge admitted through Redis in the window: local limits
        # start from what was used, not from nothing.
        decision = await self._fallback.admit(key_id, share, tokens)
        reservation = _LOCAL + decision.reservation if decision.reservation else None
        reason = decision.reason
        if reason and share != spec:  # the numbers in it are this process's part, not the key's limits
            reason += f" (This process's share of the key's limits, 1/{self.workers}, while Redis is away.)"
        return replace(decision, reservation=reservation, degraded=True, reason=reason)

    async def _admit_shared(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision:
        """One admission through Redis; a key whose log Redis lost (a restart, empty) though this edge
        admitted some of its requests in the window gets them back first, so the limits count them (each
        edge puts back its own: together, the key's whole window)."""
        member = f"{self._id}-{next(self._members):x}"  # unique among every process's, with no system call
        window_ms = math.ceil(self.window_s * 1000)
        keys = self._keys(key_id)
        has_mine = self._fallback.has_recent(key_id)
        args = (window_ms, spec.rpm, spec.tpm, tokens, member, self._id, "1" if has_mine else "0")
        verdict, count, used, reset_ms, retry_ms = await self._run(self._admit, keys, args)
        if verdict == -1:  # rare (Redis lost the key's window): only now is this process's part listed
            restored = [str(value) for entry in self._fallback.recent(key_id) for value in entry]
            added = await self._run(_RESTORE, keys, (window_ms, self._id, *restored))
            log.warning("rate-limit store had lost %d of this process's requests for a key: put back", added)
            args = (*args[:6], "0")
            verdict, count, used, reset_ms, retry_ms = await self._run(self._admit, keys, args)
        reset_s, retry_s = reset_ms / 1000, retry_ms / 1000
        return decision_of(spec, tokens, self.window_s, verdict, count, used, reset_s, retry_s, member)

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None:
        check_tokens(actual_tokens)
        if reservation.startswith(_LOCAL):
            await self._fallback.settle(key_id, reservation.removeprefix(_LOCAL), actual_tokens)
            return
        await self._fallback.settle(key_id, reservation, actual_tokens)  # this edge's own record too
        if not self._up:
            return  # the reservation stands until it leaves the window: overcharged, never undercharged
        try:
            await self._run(_SETTLE, self._keys(key_id)[1:2], (reservation, actual_tokens))
        except _UNREACHABLE as exc:
            self._mark_down(exc)

    def backend_up(self) -> bool:
        return self._up

    def store_resets(self) -> int:
        return self.resets

    def settling(self) -> bool:
        """Within a reset's grace: admissions wait while the processes put their parts of the window back."""
        return self._settling_until > time.monotonic()

    async def run_shared(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any | None:
        """Run another shared state's script (budgets) on this Redis; None while it is unreachable."""
        if not self._up:
            return None
        try:
            return await self._run(script, keys, args)
        except _UNREACHABLE as exc:
            self._mark_down(exc)
            return None

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        if self._up:
            with contextlib.suppress(*_UNREACHABLE):
                await self._redis.delete(self._marker)
        await self._scripts.close()
        await self._redis.aclose()
        await self._fallback.close()

    def _keys(self, key_id: str) -> list[str]:
        # The hash tag keeps a key's structures in one Redis Cluster slot, as a script needs.
        base = f"{self.key_prefix}{{{key_id}}}"
        return [base + ":req", base + ":tok", base + ":by"]

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any:
        return await self._scripts.run(script, keys, args)  # with the other requests of this loop turn

    def _mark_down(self, exc: Exception) -> None:
        if self._up:
            then = "using local limits" if self.fail_mode == "open" else "refusing requests"
            log.warning("rate-limit store unreachable (%s: %s); %s", type(exc).__name__, exc, then)
        self._up = False  # requests skip Redis; the watcher tries it every retry_interval_s

    async def _watch(self) -> None:
        """Every ``retry_interval_s``: refresh this process's marker (gone: Redis lost its state), and while
        Redis is away, try it again."""
        first = True
        while True:
            try:
                kept = await self._redis.set(self._marker, b"1", px=self._marker_ms, xx=not first)
                if not kept:
                    await self._redis.set(self._marker, b"1", px=self._marker_ms)
                reset = not kept and not first
                self.marked = True
                if reset:  # (its put-back covers what was admitted locally while Redis was away)
                    await self._after_reset("a marker this process keeps there was gone")
                if not self._up:  # what was admitted locally while it was away goes in first
                    if not reset:
                        await self._put_back()
                    self._up = True
                    log.info("rate-limit store reachable again")
                first = False
            except _UNREACHABLE as exc:
                self._mark_down(exc)
            except Exception:  # the watcher must outlive any surprise: the limits depend on it
                log.exception("rate-limit store watcher")
            await asyncio.sleep(self.retry_interval_s)

    async def _after_reset(self, why: str) -> None:
        if self.settling():
            return  # already noticed (a lookup and the watcher may both find it)
        self.resets += 1
        self._settling_until = time.monotonic() + self.reset_grace_s
        self._admission_loaded = False  # (gone with the rest, if the watcher was first to notice)
        log.warning(
            "rate-limit store lost its state (%s): this process's admissions of the window put back; "
            "admissions wait %.1f s while the other processes put theirs back",
            why,
            self.reset_grace_s,
        )
        try:
            await self._put_back()
        except _UNREACHABLE as exc:
            self._mark_down(exc)

    async def _load_admission(self) -> None:
        """Load this process's admission script (one load for every admission waiting on it; again after a
        failed one)."""
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._redis.script_load(self._admit.source))
        loading = self._loading
        try:
            await asyncio.shield(loading)
            self._admission_loaded = True
        finally:
            if loading.done() and self._loading is loading:
                self._loading = None

    async def _put_back(self) -> None:
        """This process's part of every key's window, back in Redis (an entry Redis still has is left)."""
        window_ms = math.ceil(self.window_s * 1000)
        parts = [(key_id, self._fallback.recent(key_id)) for key_id in self._fallback.logged_keys()]
        calls = [
            self._run(
                _RESTORE, self._keys(key_id), (window_ms, self._id, *(str(v) for e in entries for v in e))
            )
            for key_id, entries in parts
            if entries
        ]
        added = sum(await asyncio.gather(*calls))
        if added:
            log.info("rate-limit store: %d of this process's admissions in the window put back", added)
