"""A real edge over a pacer when its ledger refuses writes: another process holds the write lock for 20 s
(the edge keeps answering, /health within 50 ms, every row there once the lock is gone), and a full disk
(new work refused with a 503 until space returns; nothing it answered goes unbilled)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from tests.edge.test_ledger_degraded import fill, tiny_disk, write_lock_held
from tests.edge_fixtures import Edge, edge_over_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
__all__ = ["tiny_disk"]  # the fixture, imported for this module's tests


def chat(n: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"hi {n}"}],
        "max_tokens": 4,
        "stream": True,
    }


def quiet_edge(folder: Path, ledger_db: Path | None = None) -> Edge:
    sections: dict = {"cache": {"enabled": False}}
    if ledger_db is not None:
        sections["ledger_db"] = ledger_db
    return edge_over_pacer(folder, "pacer", sections, tokens=4, interval_ms=5)


async def ask(s: aiohttp.ClientSession, edge: Edge, key: str, n: int) -> tuple[int, str, bytes]:
    async with s.post(
        edge.url + "/v1/chat/completions", json=chat(n), headers={"Authorization": f"Bearer {key}"}
    ) as r:
        body = await r.read()
        return r.status, r.headers.get("Retry-After", ""), body


async def health_times_ms(s: aiohttp.ClientSession, edge: Edge, seconds: float) -> list[float]:
    times = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        async with s.get(edge.url + "/health") as r:
            await r.read()
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.05)
    return times


async def test_a_ledger_locked_for_20s_neither_freezes_the_edge_nor_loses_a_row(tmp_path):
    edge = quiet_edge(tmp_path)
    try:
        key = edge.new_key(rpm=10_000, tpm=10**8)
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with aiohttp.ClientSession(connector=connector) as s:
            assert (await ask(s, edge, key, -1))[0] == 200
            with write_lock_held(edge.ledger_db):

                async def traffic() -> list[int]:
                    statuses = []
                    for n in range(40):
                        statuses.append((await ask(s, edge, key, n))[0])
                        await asyncio.sleep(0.45)
                    return statuses

                health, statuses = await asyncio.gather(health_times_ms(s, edge, 20.0), traffic())
            assert statuses == [200] * 40
            health.sort()
            p99 = health[int(len(health) * 0.99) - 1]
            assert p99 < 50, f"/health p99 {p99:.0f} ms while the ledger was locked (n={len(health)})"
            # Once the lock is gone the replayer writes the spooled rows: every answer billed, once.
            deadline = time.monotonic() + 15
            while len(edge.ledger_rows()) < 41 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
        ids = [row["request_id"] for row in edge.ledger_rows()]
        assert len(ids) == 41 and len(set(ids)) == 41
    finally:
        edge.stop()


async def test_a_full_disk_under_the_ledger_refuses_new_work_until_space_returns(tmp_path, tiny_disk):
    edge = quiet_edge(tmp_path, ledger_db=tiny_disk / "ledger.sqlite3")
    try:
        key = edge.new_key(rpm=10_000, tpm=10**8)
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with aiohttp.ClientSession(connector=connector) as s:
            assert (await ask(s, edge, key, -1))[0] == 200
            filler = fill(tiny_disk)
            answered, refused = 0, None
            for n in range(300):
                status, retry_after, body = await ask(s, edge, key, n)
                if status == 200:
                    answered += 1
                    continue
                refused = (status, retry_after, json.loads(body))
                break
            assert refused is not None, "a full disk under the ledger went unnoticed"
            status, retry_after, error = refused
            assert status == 503 and retry_after and error["error"]["code"] == "ledger_unavailable"
            # The load balancer and the operator see it: public /health refuses, the gauge says 0.
            async with s.get(edge.url + "/health") as r:
                assert r.status == 503 and (await r.json()) == {"status": "degraded", "reason": "unavailable"}
            async with aiohttp.ClientSession() as plain, plain.get(edge.metrics_url + "/metrics") as r:
                assert "nearshore_edge:ledger_accepting 0.0" in await r.text()
            filler.unlink()
            deadline = time.monotonic() + 20
            while (await ask(s, edge, key, 1000))[0] != 200:
                assert time.monotonic() < deadline, "the edge never took work again"
                await asyncio.sleep(0.5)
        # Every answer the client got is billed: the first, those before the refusal, the one after.
        assert len(edge.ledger_rows()) >= answered + 2
    finally:
        edge.stop()
