"""The edge's per-pool limit, queue and refusals, through a real edge in front of a paced region."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.edge_fixtures import edge_over_pacer

pytestmark = pytest.mark.slow

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_a_full_pool_queues_then_refuses_with_retry_after(tmp_path):
    # One slot, one place in the queue; each stream takes about 0.8 s.
    edge = edge_over_pacer(
        tmp_path, "slow", {"pools": {"large": {"max_inflight": 1, "max_queue": 1}}}, tokens=8, interval_ms=100
    )
    try:
        key = edge.new_key()
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with aiohttp.ClientSession(connector=connector) as s:

            async def one(delay_s: float) -> tuple[int, dict, bytes]:
                await asyncio.sleep(delay_s)
                async with s.post(
                    edge.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
                ) as r:
                    return r.status, dict(r.headers), await r.read()

            (s1, _, b1), (s2, h2, b2), (s3, h3, b3) = await asyncio.gather(one(0), one(0.2), one(0.4))
        assert s1 == 200 and b1.endswith(b"data: [DONE]\n\n")
        assert s2 == 200 and b2.endswith(b"data: [DONE]\n\n")
        queued_ms = float(h2["Server-Timing"].split("edge-queue;dur=")[1].split(",")[0])
        assert queued_ms > 300  # it waited for the first stream's slot
        assert s3 == 503 and b'"overloaded"' in b3 and b"queue is full" in b3 and h3["Retry-After"]
    finally:
        edge.stop()
