"""One Retry-After cannot bench a region for an hour (issue 34, N2): a single 429 with
``Retry-After: 999999999`` once made the edge refuse every key for that region for 3,600 s while its /health
said "ok". The edge now cools the replica for at most ``upstream.max_retry_after_s``, shows it cooling on
/health (the operator's details, and "cooling" as the public reason when no replica is left to ask) and in
``nearshore_edge:region_cooling_seconds``, and asks it again once the cap has passed.

A real edge process in front of a stand-in region in the test's own process (tests/fake_region.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.edge_fixtures import Edge, start_edge
from tests.fake_region import FakeRegion, completion, serving

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
CAP_S = 4.0  # the test's upstream.max_retry_after_s: far below what the region asks
HUGE = "999999999"
COOLING = re.compile(rf"^cooling after a Retry-After: {MODEL} (?P<left>[0-9.]+)s \(HTTP 429\)$")


class OneRefusal:
    """Refuses the first request with 429 and a Retry-After of 31 years; answers every later one."""

    def __init__(self) -> None:
        self.refused = asyncio.Event()

    async def __call__(self, kind: str, body: dict[str, Any], _request: web.Request) -> web.StreamResponse:
        if not self.refused.is_set():
            self.refused.set()
            error = {"message": "Slow down.", "type": "rate_limit_error", "code": "rate_limit_exceeded"}
            return web.json_response({"error": error}, status=429, headers={"Retry-After": HUGE})
        usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
        return web.Response(
            body=completion(kind, body["model"], "Hi", usage), content_type="application/json"
        )


@pytest.fixture
async def region_and_edge(tmp_path) -> AsyncIterator[tuple[FakeRegion, OneRefusal, Edge]]:
    answer = OneRefusal()
    region = FakeRegion(answer)
    async with serving(region) as url:
        upstream = {"health_interval_s": 60.0, "max_retry_after_s": CAP_S, "max_retry_wait_s": 0}
        edge = await asyncio.to_thread(
            start_edge, tmp_path, [("london", url)], tls={"enabled": False}, upstream=upstream
        )
        try:
            yield region, answer, edge
        finally:
            await asyncio.to_thread(edge.stop)


async def chat(session: aiohttp.ClientSession, edge: Edge, key: str) -> aiohttp.ClientResponse:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}
    async with session.post(
        edge.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        await response.read()
        return response


async def details(session: aiohttp.ClientSession, edge: Edge) -> dict[str, Any]:
    async with session.get(edge.metrics_url + "/health") as response:
        return await response.json()


async def cooling_gauge(session: aiohttp.ClientSession, edge: Edge) -> float:
    async with session.get(edge.metrics_url + "/metrics") as response:
        text = await response.text()
    [value] = re.findall(r'^nearshore_edge:region_cooling_seconds\{region="london"\} (\S+)$', text, re.M)
    return float(value)


async def test_a_huge_retry_after_cools_the_replica_for_the_cap_and_shows_it(region_and_edge):
    region, answer, edge = region_and_edge
    key = await asyncio.to_thread(edge.new_key, rpm=10_000, tpm=10**8)
    async with aiohttp.ClientSession() as session:
        assert await cooling_gauge(session, edge) == 0  # the family is there before anything cools
        refused = await chat(session, edge, key)
        assert answer.refused.is_set() and refused.status == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= CAP_S  # the client is told the capped wait

        # Cooling, for at most the cap: on the operator's /health, in the gauge, and as the public reason.
        seen = await details(session, edge)
        cooling = COOLING.match(seen["regions"]["london"])
        assert cooling and 0 < float(cooling["left"]) <= CAP_S, seen
        assert "cooling" in seen["reasons"] and not seen["refusing"], seen
        assert 0 < await cooling_gauge(session, edge) <= CAP_S
        async with session.get(edge.url + "/health") as public:
            assert public.status == 200 and await public.json() == {"status": "degraded", "reason": "cooling"}

        # A request now is not sent to the region: it asked not to be asked yet.
        asked = region.asked
        assert (await chat(session, edge, key)).status == 429 and region.asked == asked

        # Then the cooling ends (by the cap, not in 31 years) and the region is asked again.
        for _ in range(600):  # 30 s: far past the cap
            if (await details(session, edge))["regions"]["london"] == "up":
                break
            await asyncio.sleep(0.05)
        seen = await details(session, edge)
        assert seen["regions"]["london"] == "up" and seen["status"] == "ok", seen
        assert await cooling_gauge(session, edge) == 0
        assert (await chat(session, edge, key)).status == 200 and region.asked == asked + 1
