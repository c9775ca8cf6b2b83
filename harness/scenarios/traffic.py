"""Steady traffic through a topology's edge, and what a scenario reads off it.

Clients in the user's city send one streamed request every ``1 / rate_per_s`` seconds whatever the answers
do (an open loop: a slow region does not slow the arrivals, so requests per second per region stay
comparable across phases). Each request records when it started, which region served it, its time to first
token and how it ended. :class:`HealthWatch` samples the edge's ``/health`` (each region's status as the
router sees it) beside the traffic, so a scenario can tell when a region was taken out and let back in.

The figures are computed here once for every scenario: percentiles, when traffic moved to where it should
be, and flaps (region changes beyond the necessary ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

from harness.client import Stream, read_events, read_head
from harness.launcher import RunningTopology
from harness.stats import percentile
from nearshore import tls
from nearshore.protocol.headers import DEBUG, DEGRADED, ROUTE

MODEL = "gemma-3-270m"
OK = "ok"
FAILED_BEFORE_FIRST_BYTE = "failed-before-first-byte"
CUT_MID_STREAM = "failed-mid-stream"


@dataclass
class Attempt:
    started: float  # perf_counter when the request was sent
    region: str = ""
    ttft_s: float = 0.0
    outcome: str = "pending"  # ok | failed-before-first-byte | failed-mid-stream
    route: str = ""  # x-nearshore-route: the edge's reasons for the region it chose
    error: str = ""
    ended: float = 0.0  # perf_counter when the answer ended (or failed)
    cache: str = ""  # x-nearshore-cache: HIT or SEMANTIC when the edge's cache answered
    degraded: str = ""  # x-nearshore-degraded: why a degraded tier answered (cable-cut)
    status: int = 0  # the HTTP status of the answer's head

    def row(self, t0: float) -> dict[str, object]:
        """For a scenario's JSON: when it was sent (seconds from ``t0``), where it went, how it went."""
        return {
            "t_s": round(self.started - t0, 3),
            "region": self.region,
            "ttft_ms": round(self.ttft_s * 1000, 1),
            "outcome": self.outcome,
            "route": self.route,
        }

    @property
    def served(self) -> bool:
        """A region answered it (its first token reached the user), whether or not it finished."""
        return self.outcome in (OK, CUT_MID_STREAM)


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], attempt: Attempt
) -> None:
    """Send one streaming request to ``url`` (a base URL) and record its outcome on ``attempt``; never
    raises for what the network or the server does."""
    stream = Stream()
    try:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as response:
            read_head(stream, response.status, response.headers)
            # Known as soon as the head arrives: a scenario may watch where traffic goes while it runs. A
            # head the edge sent before the region answered (a heartbeat, after heartbeat_s) names no
            # region: the route's choice stands in.
            attempt.route = response.headers.get(ROUTE, "")
            attempt.region = stream.region or attempt.route.partition(" ")[0]
            attempt.cache, attempt.status = stream.cache, response.status
            attempt.degraded = response.headers.get(DEGRADED, "")
            if response.status != 200:
                stream.error = f"HTTP {response.status}: {(await response.text())[:200]}"
            else:
                await read_events(response.content.iter_any(), stream, attempt.started)
    except (TimeoutError, aiohttp.ClientError, OSError, msgspec.DecodeError) as exc:
        stream.error = repr(exc)[:200]
    attempt.ttft_s, attempt.error, attempt.ended = stream.ttft_s, stream.error, time.perf_counter()
    if not stream.tokens:
        attempt.outcome = FAILED_BEFORE_FIRST_BYTE
    else:
        attempt.outcome = CUT_MID_STREAM if stream.error else OK


def chat_body(question: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()


@dataclass
class SteadyLoad:
    """An open loop of streamed requests through the edge, as the topology's user sends them."""

    running: RunningTopology
    rate_per_s: float = 3.0
    max_tokens: int = 16
    question: str = "Tell me about Lagos."
    attempts: list[Attempt] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> list[Attempt]:
        """Send requests until ``stop`` is set, then wait for every answer to end."""
        running = self.running
        connector = aiohttp.TCPConnector(ssl=tls.client_context(ca=Path(running.edge_ca)), limit=0)
        headers = {
            "Authorization": f"Bearer {running.api_key}",
            "Content-Type": "application/json",
            DEBUG: "route",
            # Every request must cross to a region: these scenarios measure routing, not the cache.
            "Cache-Control": "no-cache, no-store",
        }
        body = chat_body(self.question, self.max_tokens)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks = []
            start = time.perf_counter()
            n = 0
            while not stop.is_set():
                attempt = Attempt(time.perf_counter())
                self.attempts.append(attempt)
                tasks.append(
                    asyncio.create_task(one_request(session, running.edge_url, body, headers, attempt))
                )
                n += 1
                # Due times from the start, not from the last send: late wake-ups do not add up.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), start + n / self.rate_per_s - time.perf_counter())
            await asyncio.gather(*tasks)
        return self.attempts

    def settled(self, since: float, good: Callable[[str], bool], last: int = 3) -> bool:
        """Whether the ``last`` latest requests sent since ``since`` whose region is known went to a ``good``
        region (a live view: a region is known from the answer's head)."""
        known = [a for a in self.attempts if a.started >= since and a.region]
        return len(known) >= last and all(good(a.region) for a in known[-last:])


@dataclass
class HealthWatch:
    """Samples the edge's /health (operator listener) every ``interval_s``: (time, {region: status})."""

    url: str
    interval_s: float = 0.1
    samples: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while not stop.is_set():
                try:
                    async with session.get(self.url + "/health") as response:
                        regions = (await response.json())["regions"]
                    self.samples.append((time.perf_counter(), regions))
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError):
                    pass
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    def first(self, since: float, region: str, test: Callable[[str], bool]) -> float | None:
        """When, at or after ``since``, the region's status first passed ``test``."""
        for at, regions in self.samples:
            if at >= since and test(regions.get(region, "")):
                return at
        return None


async def until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Wait until ``condition()`` holds (checked every 50 ms); False if ``timeout_s`` passed first."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# --- figures ---------------------------------------------------------------------------------------------


def percentile_ms(values_s: Sequence[float], q: float) -> float:
    """The q-th percentile (harness/stats.py's one definition) of seconds, in milliseconds; NaN for none."""
    return 1000 * percentile(values_s, q)


def in_window(attempts: Sequence[Attempt], start: float, end: float) -> list[Attempt]:
    return [a for a in attempts if start <= a.started < end]


def explored(attempt: Attempt) -> bool:
    """The edge sent it to measure a region again whose figures had gone stale (geo/hold.py): one request
    by design, not traffic moving."""
    return "explored" in attempt.route.split("; ")


def moved_after_s(attempts: Sequence[Attempt], since: float, good: Callable[[str], bool]) -> float | None:
    """Seconds from ``since`` until traffic was where it should be for good: the start of the first served
    request after the last one served by a region that is not ``good``. None: it never got there.
    Explorations (:func:`explored`) are measurements, not traffic: they do not count."""
    served = sorted((a for a in attempts if a.served and not explored(a)), key=lambda a: a.started)
    last_bad = max((i for i, a in enumerate(served) if not good(a.region)), default=-1)
    if last_bad == len(served) - 1:
        return None
    return max(0.0, served[last_bad + 1].started - since)


def region_changes(regions: Sequence[str]) -> int:
    return sum(1 for a, b in itertools.pairwise(regions) if a != b)


def flaps(before: str, attempts: Sequence[Attempt]) -> int:
    """Region changes among a phase's served requests (in the order they were sent, starting from the region
    that served last before it) beyond the one it takes to end where they ended. Explorations do not count
    (:func:`explored`); a scenario reports them beside."""
    regions = [before] if before else []
    regions += [a.region for a in sorted(attempts, key=lambda a: a.started) if a.served and not explored(a)]
    if len(regions) < 2:
        return 0
    return region_changes(regions) - (regions[0] != regions[-1])


def per_region(attempts: Sequence[Attempt]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in attempts:
        if a.served:
            counts[a.region] = counts.get(a.region, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def seconds(value: float | None) -> str:
    return "never" if value is None or math.isnan(value) else f"{value:.1f}"


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"
