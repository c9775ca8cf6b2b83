"""Per-API-key rate limits: requests per minute (RPM) and tokens per minute (TPM), as exact sliding windows.

Each key keeps a log of its admissions in the last ``window_s`` seconds (60 by default): one entry per
admitted request, holding the time it was admitted and the tokens it reserved. One admission does, atomically:

1. trim: drop the entries that have left the window (admitted ``window_s`` or more ago), and their tokens;
2. check: refuse if the entries already number ``rpm`` or more, or if their tokens plus this request's
   exceed ``tpm`` (a request bigger than ``tpm`` on its own is refused outright: it could never fit);
3. record: add an entry (a random 128-bit hex id, the time, the tokens) and return the id as the reservation.

When the response ends, :meth:`RateLimiter.settle` sets the entry's tokens to what was really used, so the
unused part of the reservation is refunded (or the overrun charged). Because every admission in the window is
counted, "never more than the limit in any window" holds exactly, with no bucket edges. Times reported:

- ``reset_s``: seconds until the oldest entry in the window leaves it (0 when the window is empty), for both
  dimensions; with the requests limit reached, that is when there is room for one more request.
- ``retry_after_s`` (refusals only): seconds until the refusing dimension has room for *this* request: for
  requests, until enough of the oldest entries leave to drop below ``rpm``; for tokens, until enough of them
  leave for ``tokens`` to fit; the full window for a request bigger than ``tpm``.

Two backends run the same steps. :class:`MemoryLimiter` keeps the log in process (one edge, or the fallback).
:class:`RedisLimiter` keeps it in Redis for edges that share limits: a sorted set (entry id -> admission time
in ms, from Redis's own clock so edges with skewed clocks agree) and a hash (entry id -> tokens, plus a
running ``_sum``), both changed by one Lua script per admission, so concurrent edges cannot overshoot.
A limit of 0 means unlimited; a key unlimited in both dimensions records nothing and gets no reservation.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("nearshore.edge.limits")

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class LimitSpec:
    rpm: int  # requests per window; 0: unlimited
    tpm: int  # tokens per window; 0: unlimited


@dataclass(frozen=True, slots=True)
class Window:
    """One dimension of a decision. ``limit`` 0 means unlimited (``remaining`` is then 0 and meaningless)."""

    limit: int
    remaining: int  # after this admission
    reset_s: float  # until the oldest entry leaves the window; 0 when it is empty


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    requests: Window
    tokens: Window
    retry_after_s: float = 0.0
    reservation: str | None = None  # id to pass to settle(); None when refused or unlimited
    refused_by: Literal["requests", "tokens"] | None = None
    degraded: bool = False  # decided by the local fallback because Redis is unreachable
    reason: str = ""  # why it was refused: the 429's message


class LimiterUnavailable(Exception):
    """Fail-closed mode and Redis is unreachable: the edge answers 503."""


class RateLimiter(Protocol):
    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision: ...

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None: ...

    def backend_up(self) -> bool: ...

    async def close(self) -> None: ...


# What the check step found, as the Lua script returns it.
_ALLOWED, _BY_REQUESTS, _BY_TOKENS, _TOO_LARGE = 0, 1, 2, 3

_UNLIMITED = Decision(True, Window(0, 0, 0.0), Window(0, 0, 0.0))


def _decision(
    spec: LimitSpec,
    tokens: int,
    window_s: float,
    verdict: int,
    count: int,
    used: int,
    reset_s: float,
    retry_s: float,
    reservation: str,
) -> Decision:
    """Both backends end here: ``count`` and ``used`` are the window's totals after this admission."""
    requests = Window(spec.rpm, max(0, spec.rpm - count) if spec.rpm else 0, reset_s)
    token_window = Window(spec.tpm, max(0, spec.tpm - used) if spec.tpm else 0, reset_s)
    if verdict == _ALLOWED:
        return Decision(True, requests, token_window, reservation=reservation)
    per = "per minute" if window_s == 60 else f"per {window_s:g} s"
    if verdict == _BY_REQUESTS:
        refused_by, reason = "requests", f"Rate limit reached: {spec.rpm} requests {per}."
    elif verdict == _BY_TOKENS:
        refused_by = "tokens"
        reason = f"Rate limit reached: {spec.tpm} tokens {per}; this request needs {tokens}."
    else:
        refused_by = "tokens"
        reason = f"This request needs {tokens} tokens, more than the limit of {spec.tpm} tokens {per}."
    return Decision(False, requests, token_window, retry_s, refused_by=refused_by, reason=reason)


def _check_tokens(tokens: int) -> None:
    if tokens < 0:
        raise ValueError(f"token count must be >= 0, got {tokens}")


def local_share(spec: LimitSpec, workers: int) -> LimitSpec:
    """One process's part of a key's limits while each of ``workers`` counts alone. Rounded down, so that
    together they stay within the limit; at least 1, so a limit under the worker count still admits."""
    rpm, tpm = (max(1, limit // workers) if limit else 0 for limit in (spec.rpm, spec.tpm))
    return spec if workers <= 1 else LimitSpec(rpm, tpm)


# --- in process ----------------------------------------------------------------------------------------


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
        for i, entry in enumerate(self.entries.values()):
            if i == rank:
                return entry.at
        raise IndexError(rank)

    def time_tokens_fit(self, tokens: int, tpm: int) -> float:
        """When enough of the oldest entries are gone for ``tokens`` more to fit."""
        freed = 0
        for entry in self.entries.values():
            freed += entry.tokens
            if self.used - freed + tokens <= tpm:
                return entry.at
        return next(reversed(self.entries.values())).at


class MemoryLimiter:
    """Limits kept in this process: one edge on its own, or the fallback while Redis is unreachable."""

    def __init__(self, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._logs: dict[str, _Log] = {}
        self._next_sweep = clock() + window_s

    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision:
        _check_tokens(tokens)
        if not spec.rpm and not spec.tpm:
            return _UNLIMITED
        now = self._clock()
        self._sweep(now)
        history = self._logs.setdefault(key_id, _Log())
        history.trim(now - self.window_s)
        count, used = len(history.entries), history.used

        def expiry(at: float) -> float:
            return max(0.0, at + self.window_s - now)

        verdict, retry = _ALLOWED, 0.0
        if spec.rpm and count >= spec.rpm:
            verdict, retry = _BY_REQUESTS, expiry(history.oldest_at(count - spec.rpm))
        if spec.tpm and tokens > spec.tpm:
            verdict, retry = _TOO_LARGE, self.window_s
        elif spec.tpm and used + tokens > spec.tpm:
            verdict = verdict or _BY_TOKENS
            retry = max(retry, expiry(history.time_tokens_fit(tokens, spec.tpm)))

        member = ""
        if verdict == _ALLOWED:
            member = os.urandom(16).hex()  # as unique as a uuid4, without building one
            history.entries[member] = _Entry(now, tokens)
            history.used += tokens
            count, used = count + 1, used + tokens
        reset = expiry(history.oldest_at(0)) if history.entries else 0.0
        return _decision(spec, tokens, self.window_s, verdict, count, used, reset, retry, member)

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None:
        _check_tokens(actual_tokens)
        history = self._logs.get(key_id)
        entry = history.entries.get(reservation) if history else None
        if history is None or entry is None:
            return  # expired, or never ours: nothing to refund
        history.used += actual_tokens - entry.tokens
        entry.tokens = actual_tokens

    def backend_up(self) -> bool:
        return True

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


# --- shared through Redis ------------------------------------------------------------------------------

# KEYS: the key's zset (entry -> admitted at, ms) and hash (entry -> tokens, "_sum" -> their total).
# ARGV: window_ms, rpm, tpm, tokens, entry id. Returns {verdict, count, used, reset_ms, retry_ms}.
_ADMIT_LUA = """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes, on Redis < 5
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window, rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local zset, hash = KEYS[1], KEYS[2]
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
  local freed, start, fits_at = 0, 0, nil
  while fits_at == nil do
    local batch = redis.call('ZRANGE', zset, start, start + 199, 'WITHSCORES')
    if #batch == 0 then break end
    local ids = {}
    for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
    for i, amount in ipairs(redis.call('HMGET', hash, unpack(ids))) do
      freed = freed + (tonumber(amount) or 0)
      if used - freed + tokens <= tpm then fits_at = batch[2 * i]; break end
    end
    start = start + 200
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
  count, used = count + 1, used + tokens
end
local reset = 0
if count > 0 then reset = expiry(redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')[2]) end
return {verdict, count, used, math.ceil(reset), math.ceil(retry)}
"""

# KEYS: the key's hash. ARGV: entry id, actual tokens. An entry trimmed (or never there) is left alone.
_SETTLE_LUA = """
if ARGV[1] == '_sum' then return 0 end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '_sum', tonumber(ARGV[2]) - tonumber(old))
return 1
"""

# Redis is unreachable (refused, timed out, no pooled connection free): not a bug to surface as a 500.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_LOCAL = "local-"  # prefix of reservations made by the fallback while Redis was down


@dataclass(frozen=True, slots=True)
class Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


_ADMIT = Script.of(_ADMIT_LUA)
_SETTLE = Script.of(_SETTLE_LUA)


class RedisLimiter:
    """Limits shared by every edge that points at the same Redis; one round trip per admission.

    When Redis is unreachable, ``fail_mode`` decides: "open" falls back to local limits (decisions marked
    ``degraded``), "closed" raises :class:`LimiterUnavailable`. Requests then skip Redis altogether while a
    background task pings it every ``retry_interval_s``; when it answers, Redis is used again. The
    ``workers`` processes sharing the Redis (an edge's workers, times the edges: ``[limits] edges``) fall back
    at once, each counting alone: each keeps :func:`local_share` of a key's limits, so that together they
    admit no more than the limit (two each admitted all of it).
    """

    def __init__(
        self,
        url: str,
        fail_mode: Literal["open", "closed"],
        key_prefix: str = "nearshore:rl:",
        *,
        window_s: float = WINDOW_S,
        socket_timeout_s: float = 0.25,
        retry_interval_s: float = 1.0,
        max_connections: int = 32,
        workers: int = 1,
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
            socket_connect_timeout=socket_timeout_s,
            # One immediate retry on a fresh socket covers a connection Redis closed while idle; timeouts are
            # not retried, so a request waits at most about one socket timeout before the fallback decides.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._redis = Redis.from_pool(pool)
        self._fallback = MemoryLimiter(window_s=window_s)
        self._up = True
        self._probe: asyncio.Task[None] | None = None

    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision:
        _check_tokens(tokens)
        if not spec.rpm and not spec.tpm:
            return _UNLIMITED
        if self._up:
            member = os.urandom(16).hex()  # as unique as a uuid4, without building one
            args = (math.ceil(self.window_s * 1000), spec.rpm, spec.tpm, tokens, member)
            try:
                verdict, count, used, reset_ms, retry_ms = await self._run(_ADMIT, self._keys(key_id), args)
            except _UNREACHABLE as exc:
                self._mark_down(exc)
            else:
                reset_s, retry_s = reset_ms / 1000, retry_ms / 1000
                return _decision(spec, tokens, self.window_s, verdict, count, used, reset_s, retry_s, member)
        if self.fail_mode == "closed":
            raise LimiterUnavailable("the rate-limit store (Redis) is unreachable")
        share = local_share(spec, self.workers)
        decision = await self._fallback.admit(key_id, share, tokens)
        reservation = _LOCAL + decision.reservation if decision.reservation else None
        reason = decision.reason
        if reason and share != spec:  # the numbers in it are this process's part, not the key's limits
            reason += f" (This process's share of the key's limits, 1/{self.workers}, while Redis is away.)"
        return replace(decision, reservation=reservation, degraded=True, reason=reason)

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None:
        _check_tokens(actual_tokens)
        if reservation.startswith(_LOCAL):
            await self._fallback.settle(key_id, reservation.removeprefix(_LOCAL), actual_tokens)
            return
        if not self._up:
            return  # the reservation stands until it leaves the window: overcharged, never undercharged
        try:
            await self._run(_SETTLE, self._keys(key_id)[1:], (reservation, actual_tokens))
        except _UNREACHABLE as exc:
            self._mark_down(exc)

    def backend_up(self) -> bool:
        return self._up

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
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._redis.aclose()
        await self._fallback.close()

    def _keys(self, key_id: str) -> list[str]:
        # The hash tag keeps a key's two structures in one Redis Cluster slot, as a script needs.
        base = f"{self.key_prefix}{{{key_id}}}"
        return [base + ":req", base + ":tok"]

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> Any:
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted or flushed Redis: EVAL also caches it for the next EVALSHA
            return await self._redis.eval(script.source, len(keys), *keys, *args)

    def _mark_down(self, exc: Exception) -> None:
        if self._up:
            then = "using local limits" if self.fail_mode == "open" else "refusing requests"
            log.warning("rate-limit store unreachable (%s: %s); %s", type(exc).__name__, exc, then)
        self._up = False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while True:
            await asyncio.sleep(self.retry_interval_s)
            try:
                await self._redis.ping()
            except _UNREACHABLE:
                continue
            self._up = True
            log.info("rate-limit store reachable again")
            return


def format_reset(seconds: float) -> str:
    """OpenAI's style: "0.5s", "1s", "6m0s"."""
    ms = max(0, round(seconds * 1000))
    minutes, ms = divmod(ms, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """``x-ratelimit-*`` for each limited dimension; on a refusal also ``retry-after`` (s) and ``-ms``."""
    headers: dict[str, str] = {}
    for name, window in (("requests", decision.requests), ("tokens", decision.tokens)):
        if window.limit > 0:
            headers[f"x-ratelimit-limit-{name}"] = str(window.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(window.remaining)
            headers[f"x-ratelimit-reset-{name}"] = format_reset(window.reset_s)
    if not decision.allowed:
        # The openai client waits retry-after-ms before its own backoff; Retry-After is whole seconds.
        headers["retry-after"] = str(max(1, math.ceil(decision.retry_after_s)))
        headers["retry-after-ms"] = str(math.ceil(decision.retry_after_s * 1000))
    return headers
