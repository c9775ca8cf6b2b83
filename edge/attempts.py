"""One request's attempts at the regions, before its first token: failover across a model's replicas,
retries with Retry-After and backoff, then the model's fallbacks, all inside the request's deadline.

The order for each model is the router's. A first pass asks each replica of the model once, skipping one
that asked (Retry-After) not to be asked yet, then each replica of its fallbacks in turn: an answer now
from a fallback beats a wait for the model. When none answered, the replicas that may answer later (a
refusal, a 5xx, a reset) are asked again, soonest first, each after its Retry-After or a backoff with
jitter, while the wait is at most ``max_retry_wait_s``, fits in the deadline, and the replica's retry
budget allows. At most ``max_attempts`` requests in all, and the fallback chain always gets its turn: the
model's own replicas leave it the attempts ``reserved`` for it (one, when the request has a chain), and
the chain is asked at least once even when the model's replicas spent every attempt (``max_attempts`` = 1,
or a request asked again). A silent replica (no head within its timeout) and one that does not speak HTTP
are not asked again by this request.

What each replica did goes to the router (failures in a row eject it: the circuit opens) and into the
error the client gets when nothing answered: the slowest of the refusals' Retry-After, and a status that
says what happened (429 when every replica limited the rate, 504 when every one was silent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge.config import UpstreamConfig
from edge.h1 import MalformedResponse, Response
from edge.metrics import EdgeMetrics
from edge.opened import Opened, UpstreamTiming
from edge.provider import CredentialUnavailable
from edge.region_answer import UpstreamFault, read_refusal, refusal_code
from edge.retry import NO_FIRST_BYTE_BUDGET, Deadline, FirstByteBudget, backoff_s, retry_after_of
from edge.upstream import UPSTREAM_ERRORS, Slot, Upstream, UpstreamPool
from nearshore.jsonlog import FIELDS
from nearshore.protocol.errors import (
    INVALID_REQUEST,
    NO_ROOM_FOR_CHOICES,
    REQUEST_SCOPED_REFUSALS,
    UPSTREAM_RATE_LIMITED,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    ApiError,
)

log = logging.getLogger("nearshore.edge.attempts")

RETRYABLE = frozenset({429, 500, 502, 503, 504})
REFUSALS = frozenset({429, 503})  # the region is up and says "not now": Retry-After applies
CONTEXT_LENGTH = "context_length_exceeded"
_PEEK_BYTES = 4096
_MIN_ATTEMPT_S = 0.05  # less than this left to wait for a head: the attempt is not made


@dataclass(slots=True)
class Target:
    """One model of the chain: its replicas in failover order and the body they get."""

    model: str
    upstreams: list[Upstream]
    body: bytes
    why_none: str = ""  # when no replica may serve it (the router's reason)


class Refused(Exception):
    """A replica refused the request itself (a 4xx no other replica would answer differently)."""

    def __init__(self, error: ApiError, passed_on: bool, opened: Opened) -> None:
        super().__init__(error.message)
        self.error, self.passed_on, self.opened = error, passed_on, opened

    def release(self) -> None:
        """Give back the connection and the slot of the replica whose refusal was read."""
        self.opened.release()


@dataclass(slots=True)
class _Later:
    """A replica to ask again: when it may be asked, and how many times this request asked it."""

    upstream: Upstream
    target: Target
    ready_at: float
    asked: int = 1


@dataclass(slots=True)
class Attempts:
    """The attempts of one request (a stream's continuation makes its own)."""

    pool: UpstreamPool
    config: UpstreamConfig
    metrics: EdgeMetrics
    deadline: Deadline
    prompt_tokens: int = 0  # the request's prompt estimate: the router takes its prefill out of a TTFT
    choices: int = 1  # n: a replica that reports taking fewer in one request is not asked
    first_byte: FirstByteBudget = NO_FIRST_BYTE_BUDGET  # the request's, shared by every attempt
    request_id: str = ""  # for its log lines
    tenant: str = ""  # who asked: what the router learns from its answers is told whose request it was
    rescuing: bool = False  # a stream's continuation: each attempt is worth a line, even one that answers
    made: int = 0
    skipped: list[str] = field(default_factory=list)
    # What the failures were, for the client's error.
    _timeouts: int = 0
    _malformed: int = 0
    _rate_limited: int = 0
    _other: int = 0
    _retry_after: float = 0.0
    _deadline_hit: bool = False  # an attempt timed out at the deadline rather than at its own limit
    _most_choices: int = 0  # the largest n a replica passed over for this request's n reported it takes
    _no_room: int = 0  # replicas that had no room for this request's n choices now

    async def open(
        self,
        first: Target,
        fallbacks: Callable[[], list[Target]],
        context: Callable[[], list[Target]],
        path: str,
        headers: dict[str, str],
        timeout_s: float,
        reserved: int = 0,
    ) -> Opened:
        """The first answer head with status 200 (or a 4xx passed on as :class:`Refused`) from ``first``'s
        replicas, else from its ``fallbacks`` in order; else the :class:`ApiError` that says why nothing
        answered. A context-length refusal moves to the ``context`` chain instead, when there is one.
        ``first``'s replicas leave ``reserved`` of the attempts to the chain, which is asked at least once."""
        queue = [first]
        more: Callable[[], list[Target]] | None = fallbacks
        context_used = False
        later: list[_Later] = []
        limit = max(self.config.max_attempts - reserved, 1)  # the model's own replicas' first pass
        while queue or more is not None:
            if not queue:
                assert more is not None
                queue, more = more(), None
                limit = self._chain_limit()
                continue
            target = queue.pop(0)
            if not target.upstreams:
                self.skipped.append(f"{target.model}: {target.why_none or 'no replica serves it'}")
                continue
            try:
                opened = await self._one_model(target, path, headers, timeout_s, later, limit)
            except Refused as refused:
                if refused.error.kind.code == CONTEXT_LENGTH and not context_used:
                    context_used = True
                    chain = context()
                    if chain:
                        self.skipped.append(f"{target.model}: the prompt is longer than its context")
                        refused.release()
                        queue, more = chain, None
                        limit = self._chain_limit()
                        continue
                raise
            if opened is not None:
                return opened
            if self._out_of_time():
                break
        opened = await self._again(later, path, headers, timeout_s)
        if opened is not None:
            return opened
        raise self.error()

    def _chain_limit(self) -> int:
        """The attempts a fallback (or context) chain may take the request to: what is left of
        ``max_attempts``, and at least one more, so that the chain always gets its turn."""
        return max(self.config.max_attempts, self.made + 1)

    async def _one_model(
        self,
        target: Target,
        path: str,
        headers: dict[str, str],
        timeout_s: float,
        later: list[_Later],
        limit: int,
    ) -> Opened | None:
        """Each replica of ``target`` once, while fewer than ``limit`` attempts were made; those that may
        answer later go on ``later``."""
        for upstream in target.upstreams:
            if self.made >= limit or self._out_of_time():
                return None
            if (most := _most_choices(upstream)) and self.choices > most:
                self._most_choices = max(self._most_choices, most)
                self.skipped.append(f"{upstream.name}: takes at most n = {most}")
                continue
            now = time.monotonic()
            if cooling_s := upstream.cooling_left(now, target.model):  # it asked not to be asked yet
                self.skipped.append(f"{upstream.name}: asked to wait {cooling_s:.1f}s")
                if upstream.cooling_status(target.model) == 429:
                    self._rate_limited += 1
                else:
                    self._other += 1
                later.append(_Later(upstream, target, now + cooling_s, asked=0))
                continue
            upstream.budget.deposit(now)
            opened, again = await self._attempt(upstream, target, path, headers, timeout_s)
            if opened is not None:
                return opened
            if again is not None:
                later.append(_Later(upstream, target, again))
        return None

    async def _again(
        self, later: list[_Later], path: str, headers: dict[str, str], timeout_s: float
    ) -> Opened | None:
        """Ask the replicas that may answer later, soonest first, while waiting is worth it."""
        c = self.config
        while later and self.made < c.max_attempts:
            later.sort(key=lambda entry: entry.ready_at)
            entry = later.pop(0)
            now = time.monotonic()
            wait = max(entry.ready_at - now, 0.0)
            if entry.asked:  # spaced from this request's last attempt on it, whatever it said
                wait = max(wait, backoff_s(entry.asked - 1, c.retry_backoff_s, c.retry_backoff_max_s))
            if wait > c.max_retry_wait_s or wait >= self.deadline.left(now):
                self.skipped.append(f"{entry.upstream.name}: not waited on ({wait:.1f}s)")
                continue
            if not entry.upstream.budget.withdraw(now):
                self.skipped.append(f"{entry.upstream.name}: its retry budget is spent")
                self.metrics.retries_denied.labels(entry.upstream.name).inc()
                continue
            if wait > 0:
                await asyncio.sleep(wait)
            self.metrics.retries.labels(entry.upstream.name).inc()
            opened, again = await self._attempt(entry.upstream, entry.target, path, headers, timeout_s)
            if opened is not None:
                return opened
            if again is not None:
                later.append(_Later(entry.upstream, entry.target, again, entry.asked + 1))
        return None

    async def _attempt(
        self, upstream: Upstream, target: Target, path: str, headers: dict[str, str], timeout_s: float
    ) -> tuple[Opened | None, float | None]:
        """One request to one replica: the answer head, or None and when it may be asked again (None:
        not by this request). Each is one log line: replica, model, outcome and time."""
        started, made, noted = time.perf_counter(), self.made, len(self.skipped)
        try:
            opened, again = await self._send(upstream, target, path, headers, timeout_s)
        except Refused as refused:
            self._log(upstream, target, f"refused it (HTTP {refused.opened.response.status})", started)
            raise
        if opened is not None:
            what = "answered"
        elif len(self.skipped) > noted:
            what = self.skipped[-1].removeprefix(f"{upstream.name}: ")
        else:
            what = "failed"
        self._log(upstream, target, what, started, asked=self.made > made)
        return opened, again

    def _log(self, upstream: Upstream, target: Target, what: str, started: float, asked: bool = True) -> None:
        # A request's one attempt that answered is the common case: its line is DEBUG (at INFO, one line a
        # request cost the edge 7% of its CPU). Every attempt of a request that needed more than one, and
        # every continuation's, is INFO: which replica failed, why, and after how long.
        plain = asked and what == "answered" and self.made == 1 and not self.rescuing
        level = logging.DEBUG if plain else logging.INFO
        if not log.isEnabledFor(level):
            return
        seconds = time.perf_counter() - started
        if not asked:
            model = target.model
            log.info("request %s: %s for %s not asked: %s", self.request_id, upstream.name, model, what)
            return
        fields = {
            "request_id": self.request_id,
            "attempt": self.made,
            "replica": upstream.name,
            "model": target.model,
            "outcome": what[:200],
            "ms": round(seconds * 1000, 3),
        }
        log.log(
            level,
            "request %s: attempt %d at %s for %s: %s (%.3fs)",
            self.request_id,
            self.made,
            upstream.name,
            target.model,
            what[:200],
            seconds,
            extra={FIELDS: fields},
        )

    async def _send(
        self, upstream: Upstream, target: Target, path: str, headers: dict[str, str], timeout_s: float
    ) -> tuple[Opened | None, float | None]:
        limit = self.first_byte.limit(target.model, self.deadline.cap(timeout_s))
        if limit < _MIN_ATTEMPT_S:  # the budget is spent (or kept for the fallbacks): not worth a request
            self._timeouts += 1
            self.skipped.append(f"{upstream.name}: the request's first-byte budget is spent")
            return None, None
        # Its limit is what was left of the deadline: a timeout is the deadline's, even if the loop's timer
        # fires a hair before it (passed() alone then says no, and the error would not name the deadline).
        at_deadline = limit >= self.deadline.left()
        self.made += 1
        timing = UpstreamTiming(forwarded_at=time.perf_counter())
        try:
            response, slot = await _post(upstream, path, headers, target, limit)
        except CredentialUnavailable as exc:  # a provider's: nothing was sent
            self._other += 1
            self._skip(upstream, target.model, f"its credential is unavailable: {exc}")
            return None, None
        except TimeoutError:
            self._timeouts += 1
            self._deadline_hit = self._deadline_hit or at_deadline or self.deadline.passed()
            self._skip(upstream, target.model, f"no answer within {round(limit, 2):g}s")
            return None, None
        except MalformedResponse as exc:  # it answered, but not in HTTP
            self._malformed += 1
            self._skip(upstream, target.model, f"a malformed response ({str(exc)[:80]})")
            return None, None
        except UPSTREAM_ERRORS as exc:  # refused, reset: the next try may find it back
            self._other += 1
            self._skip(upstream, target.model, type(exc).__name__)
            return None, time.monotonic()
        timing.head_arrived(response, time.perf_counter())
        opened = Opened(upstream, response, timing, slot, self.skipped, target.model, target.body)
        if response.status == 200:
            first_byte_s = timing.replica_first_byte_s
            self.pool.answered(
                upstream, response, first_byte_s, target.model, self.prompt_tokens, self.tenant
            )
            return opened, None
        if upstream.provider is not None and response.status in (401, 403):
            # The edge's credential, not the client's request: another replica may take it. The body is not
            # read (a provider may echo part of the key in it).
            opened.release()
            self._other += 1
            self._skip(upstream, target.model, f"it refused the edge's credential (HTTP {response.status})")
            return None, None
        if response.status not in RETRYABLE:
            upstream.replica.health.request_succeeded(target.model)  # up: the request is what it refused
            self.pool.refused(upstream, response)  # its load report (and limits) come with the refusal
            try:
                error, passed_on = await read_refusal(response)
            except BaseException:  # (cancelled while reading it) no refusal to release: give it back here
                opened.release()
                raise
            raise Refused(error, passed_on, opened)  # its slot is held until the refusal is released
        return None, await self._retryable(upstream, target.model, response, slot)

    async def _retryable(
        self, upstream: Upstream, model: str, response: Response, slot: Slot
    ) -> float | None:
        """A 429 or 5xx: note it, and say when the replica may be asked again (None: not by this
        request)."""
        try:
            peeked = await _peek(response)
        finally:
            slot.release()
        detail = peeked[:200].decode(errors="replace")
        self.pool.refused(upstream, response)  # a refusal carries the region's load too (a full queue)
        status = response.status
        now = time.monotonic()
        asked = retry_after_of(response.headers)  # Retry-After, or a provider's x-ratelimit-reset-*
        # Whatever it said, at most max_retry_after_s: one reply must not bench a replica for an hour.
        retry_after = None if asked is None else min(asked, self.config.max_retry_after_s)
        if status in REFUSALS and refusal_code(peeked) in REQUEST_SCOPED_REFUSALS:
            # About this request alone (its n choices do not fit now): the replica is up and others'
            # requests are welcome there, so neither its health nor its cooling hears of it.
            upstream.replica.health.request_succeeded(model)
            self._no_room += 1
            self._retry_after = max(self._retry_after, retry_after or 0.0)
            self.skipped.append(f"{upstream.name}: HTTP {status} {detail}".strip())
            return None  # another replica or the fallbacks may have the room; the client retries this one
        ready_at = now
        if retry_after is not None and status in REFUSALS:
            ready_at = now + retry_after
            if upstream.cool(ready_at, status, now, model):  # for every request for the model there
                capped = " (upstream.max_retry_after_s)" if asked is not None and asked > retry_after else ""
                log.warning(
                    "region %s is cooling for %s for %gs%s: HTTP %d with Retry-After: %s",
                    upstream.name,
                    model,
                    retry_after,
                    capped,
                    status,
                    response.headers.get("retry-after", "")[:40],
                )
            self._retry_after = max(self._retry_after, retry_after)
        if status == 429:
            self._rate_limited += 1
        else:
            self._other += 1
        # Refusals in a row open the circuit as failures do: a region saying "not now" to every request
        # is out until its ejection ends (and a half-open trial finds it back).
        self._skip(upstream, model, f"HTTP {status} {detail}".strip(), refused=status in REFUSALS)
        return ready_at

    def _skip(self, upstream: Upstream, model: str, why: str, refused: bool = False) -> None:
        self.pool.failed(upstream, why, model, refused)
        self.skipped.append(f"{upstream.name}: {why}")
        self.metrics.failovers.labels(upstream.name).inc()

    def _out_of_time(self) -> bool:
        return self.deadline.passed()

    def error(self) -> ApiError:
        """Why nothing answered, as the client is told."""
        where = f" ({'; '.join(self.skipped)})" if self.skipped else " (none available)"
        retry_after = max(1, math.ceil(self._retry_after))
        counted = self._timeouts + self._malformed + self._rate_limited + self._other + self._no_room
        if self._no_room and self._no_room == counted:
            return ApiError(
                NO_ROOM_FOR_CHOICES,
                f"No region has room for n = {self.choices} choices now; retry shortly or ask for "
                f"fewer{where}",
                param="n",
                retry_after_s=retry_after,
            )
        if self._most_choices and not counted:  # no replica was asked: none takes that many choices
            return ApiError(
                INVALID_REQUEST,
                f"n = {self.choices} choices is more than any region serving the model takes in one request "
                f"(at most {self._most_choices}){where}.",
                param="n",
            )
        if self._out_of_time() or self._deadline_hit:
            return ApiError(
                UPSTREAM_TIMEOUT,
                f"No region answered within the request's deadline{where}",
                retry_after_s=retry_after,
            )
        if counted and self._timeouts == counted:
            return ApiError(UPSTREAM_TIMEOUT, "No region answered in time" + where, retry_after_s=retry_after)
        if counted and self._malformed == counted:
            return UpstreamFault.bad("No region answered in HTTP" + where).error
        if counted and self._rate_limited == counted:
            return ApiError(
                UPSTREAM_RATE_LIMITED, "Every region limited the rate" + where, retry_after_s=retry_after
            )
        attempts = f" after {self.made} attempts" if self.made >= self.config.max_attempts else ""
        return ApiError(
            UPSTREAM_UNAVAILABLE,
            f"No region could take the request{attempts}{where}",
            retry_after_s=retry_after,
        )


async def _post(
    upstream: Upstream, path: str, headers: dict[str, str], target: Target, timeout_s: float
) -> tuple[Response, Slot]:
    """The request, with the slot that counts it in the replica's in-flight while the region queues and
    serves it (the caller releases an answered one when it is done with it). A provider gets it as it
    takes it (edge/provider.py)."""
    out = upstream.outgoing(path, headers, target.body, target.model)
    slot = upstream.take_slot()
    try:
        return await upstream.pool.request("POST", out.path, out.headers, out.body, timeout_s), slot
    except BaseException:
        slot.release()
        raise


def _most_choices(upstream: Upstream) -> int:
    """The most choices one request may have at the replica, as it last reported (0: unknown)."""
    load = upstream.replica.load
    return load.max_choices if load is not None else 0


async def _peek(response: Response) -> bytes:
    """The start of a refusal's body, for its code, the log and the 503 message; a long or slow rest is
    not read."""
    data = b""
    with contextlib.suppress(TimeoutError, *UPSTREAM_ERRORS):
        async with asyncio.timeout(1.0):
            while len(data) <= _PEEK_BYTES and (more := await response.read()):
                data += more
    response.close()  # pooled again if it was read to its end
    return data[:_PEEK_BYTES]
