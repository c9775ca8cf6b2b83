"""The edge's retry discipline, as pure pieces: the request's deadline, ``Retry-After``, backoff with jitter,
and a retry budget per replica.

A retry is work the region did not ask for. Each piece bounds it: the deadline bounds a request's every
attempt together; ``Retry-After`` says when a region that refused wants to be asked again; backoff spaces
the attempts on one replica (full jitter, so many edges that failed at once do not come back at once);
the budget caps retries at a share of a replica's traffic (Envoy's retry budget), so a struggling region
sees its load multiplied by at most ``1 + share``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

# A Retry-After beyond this is read as this: no region is waited on longer, whatever it says.
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a request must have its answer, on the monotonic clock."""

    at: float

    @classmethod
    def after(cls, seconds: float, now: float | None = None) -> Deadline:
        return cls((time.monotonic() if now is None else now) + seconds)

    def left(self, now: float | None = None) -> float:
        return max(0.0, self.at - (time.monotonic() if now is None else now))

    def cap(self, timeout_s: float, now: float | None = None) -> float:
        """``timeout_s``, or what is left of the deadline if that is less."""
        return min(timeout_s, self.left(now))

    def passed(self, now: float | None = None) -> bool:
        return self.left(now) <= 0.0


@dataclass(frozen=True, slots=True)
class FirstByteBudget:
    """One first-byte budget for all of a request's attempts (issue 34: three silent replicas used to get
    the whole first-token limit each, 90 s before the fallback was asked). Every attempt's head, and a
    stream's first token, must come by ``by``; while the request's own model is asked, ``reserve_s`` of it
    is kept back for its fallback chain, so the chain is reached with time to answer."""

    by: float  # on the monotonic clock; 0: no budget
    reserve_s: float = 0.0  # kept for the fallback chain (0: the request has none)
    own_model: str = ""  # the model asked for: its replicas leave the reserve

    def limit(self, model: str, timeout_s: float, now: float | None = None) -> float:
        """How long an attempt at ``model`` may wait for its first byte: ``timeout_s`` or the budget left."""
        if not self.by:
            return timeout_s
        left = self.by - (time.monotonic() if now is None else now)
        if model == self.own_model:
            left -= self.reserve_s
        return max(0.0, min(timeout_s, left))


NO_FIRST_BYTE_BUDGET = FirstByteBudget(0.0)

# A stream's later stall windows never go below this (or half the stall timeout, when that is shorter): a
# healthy replica's tokens are far closer together, and a continuation needs a moment to prefill what was
# relayed.
MIN_STALL_WINDOW_S = 5.0


def stall_window(stall_timeout_s: float, budget_s: float, stalled_s: float) -> float:
    """How long a stream may be silent now: ``stall_timeout_s``, or what is left of the request's stall
    budget after ``stalled_s`` of silences that cut earlier streams (at least MIN_STALL_WINDOW_S, or half
    the stall timeout when that is shorter). A chain of stalling replicas waits the budget, not a stall
    each."""
    floor = min(stall_timeout_s / 2, MIN_STALL_WINDOW_S)
    return max(floor, min(stall_timeout_s, budget_s - stalled_s))


def parse_retry_after(value: str | None, now_epoch: float | None = None) -> float | None:
    """``Retry-After`` in seconds from now: delta-seconds or an HTTP date (RFC 9110 10.2.3); None when
    absent or unreadable; never negative, at most MAX_RETRY_AFTER_S."""
    if not value:
        return None
    value = value.strip()
    if len(value) > 64:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now_epoch is None else now_epoch)
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


# A Go-style duration, as OpenAI-compatible providers give x-ratelimit-reset-*: "1s", "6m0s", "20ms",
# "2m59.56s", "1h2m".
_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"^(?:{_NUMBER}h)?(?:{_NUMBER}m(?!s))?(?:{_NUMBER}s)?(?:{_NUMBER}ms)?$")


def parse_duration(value: str | None) -> float | None:
    """A Go-style duration (``6m0s``) or bare seconds in seconds; None when absent or unreadable."""
    if not value or len(value) > 32:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    match = _DURATION.match(value)
    if match is None or not any(match.groups()):
        return None
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """How long a refusal asks the edge to wait, in seconds: ``retry-after-ms``, ``Retry-After``, else
    (a provider's 429 often says it only so) the reset of the ``x-ratelimit-*`` limit it ran out of; None
    when it does not say. At most MAX_RETRY_AFTER_S."""
    if (ms := parse_duration(headers.get("retry-after-ms"))) is not None:
        return min(ms / 1000, MAX_RETRY_AFTER_S)
    if (asked := parse_retry_after(headers.get("retry-after"))) is not None:
        return asked
    resets = []
    for limit in ("requests", "tokens"):
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{limit}"))
        remaining = headers.get(f"x-ratelimit-remaining-{limit}", "").strip()
        if reset is not None:
            resets.append((remaining == "0", reset))
    if not resets:
        return None
    spent = [reset for exhausted, reset in resets if exhausted]
    # The limit it ran out of decides; when it does not say which, the soonest reset is the first chance.
    return min(max(spent) if spent else min(reset for _, reset in resets), MAX_RETRY_AFTER_S)


def backoff_s(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with equal jitter: half of min(max_s, base_s * 2**attempt), plus up to as much
    again at random (``attempt`` counts from 0). The random half keeps edges that failed together from
    coming back together; the fixed half keeps every wait a wait."""
    ceiling = min(max_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + (rng or random).uniform(0.0, ceiling / 2)


@dataclass(slots=True)
class RetryBudget:
    """Retries allowed to one replica: ``share`` of its first attempts, plus ``floor_per_s`` a second
    whatever its traffic (so a quiet replica can still be retried). A token bucket: each first attempt
    deposits ``share``, time deposits ``floor_per_s``; each retry takes one; it holds at most ``burst``."""

    share: float
    floor_per_s: float
    burst: float
    tokens: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.floor_per_s)
        self.updated = now

    def deposit(self, now: float) -> None:
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + self.share)

    def withdraw(self, now: float) -> bool:
        """Take one retry; False when the budget is spent (the retry is not made)."""
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
