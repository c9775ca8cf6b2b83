"""One bill for a city's edges (issue 35, item 2): three real edges ship their ledger rows to one real
PostgreSQL table. With PostgreSQL stopped in the middle of the traffic and one edge SIGKILLed (and started
again on its volume), every answered request has exactly one row there, no row is there twice, and
``nearshore usage --postgres`` counts what the clients counted.

NEARSHORE_FLEET_REQUESTS and NEARSHORE_FLEET_PG_DOWN_S make it the issue's full run (1,000 requests,
PostgreSQL down for 30 s); the suite runs a shorter one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from edge.keys import KeyStore
from nearshore.children import nearshore_argv
from tests.conftest import Postgres
from tests.edge_fixtures import Edge, start_edge, start_pacer

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
REQUESTS = int(os.environ.get("NEARSHORE_FLEET_REQUESTS", "240"))
PG_DOWN_S = float(os.environ.get("NEARSHORE_FLEET_PG_DOWN_S", "2"))
CLIENTS = 6


async def operator_health(edge: Edge) -> dict:
    async with aiohttp.ClientSession() as s, s.get(edge.metrics_url + "/health") as r:
        return await r.json()


async def until_fleet(edge: Edge, holds, tries: int = 1200) -> dict:
    """The edge's ledger_fleet health once ``holds`` is true of it (checked every 50 ms, bounded)."""
    for _ in range(tries):
        fleet = (await operator_health(edge))["ledger_fleet"]
        if holds(fleet):
            return fleet
        await asyncio.sleep(0.05)
    raise AssertionError(f"{edge.metrics_url}: ledger_fleet stayed {fleet}")


async def test_every_answered_request_is_billed_once_in_the_city_table(postgres: Postgres, tmp_path: Path):
    pacer = start_pacer(tmp_path, name="bill-region", tokens=4, interval_ms=1)
    keys_db = tmp_path / "keys.sqlite3"
    store = KeyStore(keys_db)
    key, _ = store.create("acme", rpm=10**9, tpm=10**12)
    store.close()
    ledger = {"postgres_url": postgres.url}
    edges = [
        start_edge(tmp_path / f"edge{i}", [("bill-region", pacer.url)], keys_db=keys_db, ledger=ledger)
        for i in range(3)
    ]
    contexts = {edge.url: edge.ssl_context() for edge in edges}
    answered: list[str] = []  # the edge's request id of every 200 a client got
    sent = 0
    faults_done = asyncio.Event()  # the clients go on until the faults are over (and REQUESTS are sent)

    async def client(index: int, s: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < REQUESTS or not faults_done.is_set():
            sent += 1
            edge = edges[(sent + index) % len(edges)]
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"q{sent}"}], "max_tokens": 4}
            try:
                async with s.post(
                    edge.url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                    ssl=contexts[edge.url],  # each edge serves its own development certificate
                ) as r:
                    await r.read()
                    if r.status == 200:
                        answered.append(r.headers["x-request-id"])
            except aiohttp.ClientError:  # the edge SIGKILLed under it: not answered
                await asyncio.sleep(0.05)

    async def faults() -> None:
        while sent < REQUESTS // 3:
            await asyncio.sleep(0.01)
        postgres.server.stop()
        await asyncio.gather(*(until_fleet(e, lambda f: f["state"] != "up") for e in edges))
        await asyncio.sleep(PG_DOWN_S)
        victim = edges[1]  # SIGKILLed with rows not yet shipped, started again on its own volume
        assert victim.process.proc is not None
        os.kill(victim.process.proc.pid, signal.SIGKILL)
        victim.process.proc.wait()
        victim.process.restart()
        await asyncio.to_thread(victim.process.wait_http, victim.url + "/health", 60, victim.ssl_context())
        postgres.server.start()
        faults_done.set()

    try:
        connector = aiohttp.TCPConnector(ssl=edges[0].ssl_context(), limit=0)
        async with aiohttp.ClientSession(connector=connector) as s:
            await asyncio.gather(faults(), *(client(i, s) for i in range(CLIENTS)))
        for edge in edges:
            await until_fleet(edge, lambda f: f["state"] == "up" and f["behind"] == 0)

        conn = await asyncpg.connect(postgres.url)
        try:
            billed = [r["request_id"] for r in await conn.fetch("SELECT request_id FROM nearshore_usage")]
            by_edge = dict(await conn.fetch("SELECT edge, count(*) FROM nearshore_usage GROUP BY edge"))
        finally:
            await conn.close()
        local = [row["request_id"] for edge in edges for row in edge.ledger_rows()]
        assert len(billed) == len(set(billed)) == len(local) == len(set(local))  # none twice
        assert set(billed) == set(local) and set(answered) <= set(billed)
        assert len(answered) >= REQUESTS * 0.9, (sent, len(answered))  # the killed edge's few went unanswered
        assert len(by_edge) == 3, by_edge
        counts = f"sent {sent}, answered {len(answered)}, billed {len(billed)}"
        print(f"\n{counts}, by edge {sorted(by_edge.values())}")  # the figures of a long run (-s)

        report = subprocess.run(
            nearshore_argv("usage", "--postgres", postgres.url), capture_output=True, text=True, check=False
        )
        assert report.returncode == 0, report.stderr
        total = report.stdout.strip().splitlines()[-1].split()
        assert total[0] == "total" and int(total[1]) == len(billed)
    finally:
        for edge in edges:
            edge.stop()
        pacer.process.stop()


async def test_an_edge_stopped_at_once_ships_its_last_rows_before_it_exits(
    postgres: Postgres, tmp_path: Path
):
    """A pod rescheduled without its volume: SIGTERM right after the answers, and the rows are all there."""
    pacer = start_pacer(tmp_path, name="bill-region", tokens=2, interval_ms=1)
    edge = start_edge(tmp_path / "edge", [("bill-region", pacer.url)], ledger={"postgres_url": postgres.url})
    try:
        key = edge.new_key()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with aiohttp.ClientSession(connector=connector) as s:
            for _ in range(20):
                async with s.post(
                    edge.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                ) as r:
                    assert r.status == 200
        assert edge.process.proc is not None
        edge.process.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(edge.process.proc.wait, 60) == 0
        conn = await asyncpg.connect(postgres.url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM nearshore_usage") == 20
        finally:
            await conn.close()
    finally:
        edge.stop()
        pacer.process.stop()
