"""Edges sharing limits through a real redis-server, Redis outages, and a SIGKILL under load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from nearshore.protocol.sse import iter_data
from tests.edge_fixtures import Edge, start_edge, start_pacer
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def session(edge: Edge) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.ssl_context(), limit=0))


async def post(s: aiohttp.ClientSession, edge: Edge, key: str, payload: dict = CHAT) -> int:
    async with s.post(
        edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        await r.read()
        return r.status


async def refusal(s: aiohttp.ClientSession, edge: Edge, key: str) -> tuple[int, dict, str | None]:
    """A request's status, its error (empty when it was served) and its Retry-After."""
    async with s.post(
        edge.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        payload = await r.json(content_type=None)
        return r.status, payload.get("error", {}), r.headers.get("Retry-After")


async def health(edge: Edge) -> dict:
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/health") as r:  # the details
        return await r.json()


@contextlib.contextmanager
def two_edges_on_redis(folder: Path) -> Iterator[tuple[RedisServer, Edge, Edge]]:
    """A real redis-server, a pacer, and two edges sharing their keys and the Redis (fail closed), each with
    its own ledger."""
    redis = RedisServer(folder / "redis").start()
    pacer = start_pacer(folder, tokens=1, interval_ms=1)
    limits = {"backend": "redis", "redis_url": redis.url, "fail_mode": "closed"}
    first = start_edge(folder / "a", [("r", pacer.url)], limits=limits)
    second = start_edge(folder / "b", [("r", pacer.url)], keys_db=first.keys_db, limits=limits)
    try:
        yield redis, first, second
    finally:
        first.stop()
        second.stop()
        pacer.process.stop()
        redis.stop()


async def test_two_edges_sharing_redis_never_admit_more_than_the_limit(tmp_path):
    with two_edges_on_redis(tmp_path) as (_, first, second):
        key = first.new_key(rpm=25)
        async with session(first) as s1, session(second) as s2:
            # Ten through each edge one by one, then a burst split across both.
            statuses = [await post(s1, first, key) for _ in range(10)]
            statuses += [await post(s2, second, key) for _ in range(10)]
            assert statuses == [200] * 20
            statuses += await asyncio.gather(
                *(post(s1 if i % 2 else s2, first if i % 2 else second, key) for i in range(60))
            )
        assert statuses.count(200) == 25, statuses
        assert set(statuses) == {200, 429}


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_redis_outage_follows_the_fail_mode_and_recovers(tmp_path, fail_mode):
    redis = RedisServer(tmp_path / "redis").start()
    pacer = start_pacer(tmp_path, tokens=1, interval_ms=1)
    edge = start_edge(
        tmp_path / "edge",
        [("r", pacer.url)],
        limits={"backend": "redis", "redis_url": redis.url, "fail_mode": fail_mode},
    )
    try:
        key = edge.new_key(rpm=1000)
        async with session(edge) as s:
            assert await post(s, edge, key) == 200
            redis.stop()
            status, error, retry_after = await refusal(s, edge, key)
            assert status == (200 if fail_mode == "open" else 503)
            if fail_mode == "closed":  # the edge's own store, never read as a provider's outage
                assert (error["type"], error["code"]) == ("server_error", "limits_unavailable"), error
                assert retry_after is not None and int(retry_after) >= 1
            assert (await health(edge))["limits"] == f"down ({fail_mode})"
            async with s.get(edge.metrics_url + "/metrics") as r:
                assert "nearshore_edge:ratelimit_backend_up 0.0" in await r.text()
            redis.start()
            for _ in range(50):
                if (await health(edge))["limits"] == "up":
                    break
                await asyncio.sleep(0.1)
            assert (await health(edge))["limits"] == "up"
            assert await post(s, edge, key) == 200
    finally:
        edge.stop()
        pacer.process.stop()
        redis.stop()


async def test_sigkill_under_load_loses_no_completed_ledger_row(tmp_path):
    pacer = start_pacer(tmp_path, tokens=5, interval_ms=2)
    edge = start_edge(tmp_path / "edge", [("r", pacer.url)])
    completed: list[str] = []
    try:
        key = edge.new_key(rpm=10**6, tpm=10**9)

        async def client(s: aiohttp.ClientSession, n: int) -> None:
            for i in range(200):
                rid = f"c{n}-{i}"
                try:
                    async with s.post(
                        edge.url + "/v1/chat/completions",
                        json={**CHAT, "stream": True, "max_tokens": 5},
                        headers={"Authorization": f"Bearer {key}", "x-request-id": rid},
                    ) as r:
                        async for data in iter_data(r.content):
                            if data == b"[DONE]":
                                completed.append(rid)  # the client saw the end of its answer
                except (aiohttp.ClientError, ConnectionError):
                    return

        async def killer() -> None:
            while len(completed) < 60:
                await asyncio.sleep(0.01)
            edge.process.proc.send_signal(signal.SIGKILL)

        async with session(edge) as s:
            await asyncio.wait_for(asyncio.gather(killer(), *(client(s, n) for n in range(8))), timeout=60)
        edge.process.proc.wait()
        db = sqlite3.connect(edge.ledger_db)
        stored = {row[0] for row in db.execute("SELECT client_request_id FROM usage")}
        db.close()
        assert len(completed) >= 60
        missing = [rid for rid in completed if rid not in stored]
        assert not missing, f"{len(missing)} completed requests have no ledger row"
    finally:
        edge.stop()
        pacer.process.stop()


def test_usage_report_prints_per_key_and_day(tmp_path):
    import subprocess
    import sys

    from edge.ledger import Ledger, UsageRecord

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    record = UsageRecord(
        request_id="r1",
        ts=1_795_000_000.0,
        key_id="abcabcabcabc",
        tenant="acme",
        model="gemma-3-270m",
        region="london",
        prompt_tokens=100,
        cached_tokens=20,
        completion_tokens=50,
        cache_status="bypass",
        cost_usd=0.25,
        status="ok",
        http_status=200,
    )
    asyncio.run(ledger.record(record))
    asyncio.run(ledger.close())
    out = subprocess.run(
        [sys.executable, "-m", "nearshore", "usage", "--db", str(tmp_path / "ledger.sqlite3")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "abcabcabcabc" in out and "acme" in out and "0.25" in out
    assert json.dumps  # the report is plain text, one line per key and day
