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

Two backends run the same steps. :class:`~edge.limits_memory.MemoryLimiter` keeps the log in process (one
edge, or the fallback). :class:`~edge.limits_redis.RedisLimiter` keeps it in Redis for edges that share
limits: a sorted set (entry id -> admission time in ms, from Redis's own clock so edges with skewed clocks
agree) and a hash (entry id -> tokens, plus a
running ``_sum``), both changed by one Lua script per admission, so concurrent edges cannot overshoot.
A limit of 0 means unlimited; a key unlimited in both dimensions records nothing and gets no reservation.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger("nearshore.edge.limits")

WINDOW_S = 60.0
# How many of a key's oldest entries a refusal by tokens reads to say when the request would fit: the
# retry is when enough of them have left or, when all those read leaving is not yet enough, when the last
# one read leaves (a request back then is refused again, with a later retry). Reading a key's whole
# window on every refusal (tens of thousands of entries: ~5 ms on the event loop, longer in Redis) let one
# key's refused requests hold the process, or a city's Redis, for everyone.
FIT_SCAN_ENTRIES = 200


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
    # settle() does no I/O (it cannot suspend): the settle stage awaits it in place, with no task.
    settles_in_memory: bool

    async def admit(self, key_id: str, spec: LimitSpec, tokens: int) -> Decision: ...

    async def settle(self, key_id: str, reservation: str, actual_tokens: int) -> None: ...

    def backend_up(self) -> bool: ...

    def store_resets(self) -> int: ...

    async def close(self) -> None: ...


# What the check step found, as the Lua script returns it.
ALLOWED, BY_REQUESTS, BY_TOKENS, TOO_LARGE = 0, 1, 2, 3

UNLIMITED = Decision(True, Window(0, 0, 0.0), Window(0, 0, 0.0))


def decision_of(
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
    if verdict == ALLOWED:
        return Decision(True, requests, token_window, reservation=reservation)
    per = "per minute" if window_s == 60 else f"per {window_s:g} s"
    if verdict == BY_REQUESTS:
        refused_by, reason = "requests", f"Rate limit reached: {spec.rpm} requests {per}."
    elif verdict == BY_TOKENS:
        refused_by = "tokens"
        reason = f"Rate limit reached: {spec.tpm} tokens {per}; this request needs {tokens}."
    else:
        refused_by = "tokens"
        reason = f"This request needs {tokens} tokens, more than the limit of {spec.tpm} tokens {per}."
    return Decision(False, requests, token_window, retry_s, refused_by=refused_by, reason=reason)


def check_tokens(tokens: int) -> None:
    if tokens < 0:
        raise ValueError(f"token count must be >= 0, got {tokens}")


def local_share(spec: LimitSpec, workers: int) -> LimitSpec:
    """One process's part of a key's limits while each of ``workers`` counts alone. Rounded down, so that
    together they stay within the limit; at least 1, so a limit under the worker count still admits."""
    rpm, tpm = (max(1, limit // workers) if limit else 0 for limit in (spec.rpm, spec.tpm))
    return spec if workers <= 1 else LimitSpec(rpm, tpm)


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


class StandingRefusals:
    """Keys their RPM refused, and until when: no slot of a key's window frees before the refusal's retry
    time (its entries only leave by age), so a request of that key before then is refused at once, before
    its body is read or the limiter is asked. Kept for the limits it was refused under: a key whose limits
    changed is asked again. Bounded: past ``max_keys``, the lapsed go, then the soonest to lapse."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._standing: dict[str, tuple[float, LimitSpec, Decision]] = {}  # key -> (noted at, spec, refusal)

    def __len__(self) -> int:
        return len(self._standing)

    def note(self, key_id: str, spec: LimitSpec, decision: Decision, now: float) -> None:
        if decision.allowed or decision.refused_by != "requests" or decision.degraded:
            return  # a refusal by tokens may not stand for a smaller request; a local guess is no proof
        if len(self._standing) >= self.max_keys and key_id not in self._standing:
            self._make_room(now)
        self._standing[key_id] = (now, spec, decision)

    def standing(self, key_id: str, spec: LimitSpec, now: float) -> Decision | None:
        """The refusal that still stands for ``key_id`` under ``spec``, its times counted from ``now``."""
        held = self._standing.get(key_id)
        if held is None:
            return None
        noted_at, noted_spec, decision = held
        elapsed = now - noted_at
        if elapsed >= decision.retry_after_s or noted_spec != spec:
            del self._standing[key_id]
            return None
        requests, tokens = decision.requests, decision.tokens
        return Decision(
            False,
            Window(requests.limit, requests.remaining, max(0.0, requests.reset_s - elapsed)),
            Window(tokens.limit, tokens.remaining, max(0.0, tokens.reset_s - elapsed)),
            decision.retry_after_s - elapsed,
            refused_by="requests",
            reason=decision.reason,
        )

    def _make_room(self, now: float) -> None:
        standing = self._standing
        for key_id in [k for k, (at, _, d) in standing.items() if now - at >= d.retry_after_s]:
            del standing[key_id]
        if len(standing) >= self.max_keys:
            by_lapse = sorted(standing, key=lambda k: standing[k][0] + standing[k][2].retry_after_s)
            for key_id in by_lapse[: len(standing) - self.max_keys + 1]:
                del standing[key_id]
