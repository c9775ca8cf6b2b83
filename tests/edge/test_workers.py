"""``server.workers = 2``: two processes on one port, limits exact across them (issue 8, item 2)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from edge.config import EdgeConfig
from edge.node import check_config
from harness.procs import free_port
from tests.edge_fixtures import (
    EVENTUALLY_S,
    Edge,
    start_edge,
    start_pacer,
    wait_for_both_workers,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

CHAT = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_more_than_one_worker_needs_the_shared_limiter():
    config = msgspec.convert(
        {"regions": [{"name": "r", "url": "http://127.0.0.1:1"}], "server": {"workers": 2}}, EdgeConfig
    )
    with pytest.raises(ValueError, match=r'limits\.backend = "redis"'):
        check_config(config)


async def post_on_a_new_connection(edge: Edge, key: str, payload: dict = CHAT) -> int:
    # A connection of its own, so the kernel may hand it to either worker.
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context(), force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(
            edge.url + "/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
        ) as r,
    ):
        await r.read()
        return r.status


def served_by_each_worker(edge: Edge) -> list[float]:
    import urllib.request

    base = int(edge.metrics_url.rsplit(":", 1)[1])
    counts = []
    for port in (base, base + 1):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        counts.append(
            sum(
                float(v)
                for v in re.findall(
                    r"^nearshore_edge:(?:requests|rate_limited)_total\{[^}]*\} (\S+)", text, re.M
                )
            )
        )
    return counts


@contextlib.contextmanager
def two_workers(folder: Path, **pacer_flags: object) -> Iterator[Edge]:
    """An edge of two worker processes sharing limits through a real Redis, in front of a pacer."""
    redis = RedisServer(folder / "redis").start()
    pacer = start_pacer(folder, **pacer_flags)
    try:
        edge = start_edge(
            folder / "edge",
            [("r", pacer.url)],
            server={"workers": 2},
            limits={"backend": "redis", "redis_url": redis.url},
            metrics={"port": free_port(count=2)},  # worker i serves metrics on port + i
        )
        try:
            wait_for_both_workers(edge)
            yield edge
        finally:
            edge.stop()
    finally:
        pacer.process.stop()
        redis.stop()


async def test_two_workers_share_a_port_and_admit_exactly_the_limit(tmp_path):
    with two_workers(tmp_path, tokens=1, interval_ms=1) as edge:
        key = edge.new_key(rpm=30, tpm=10**6)
        statuses = await asyncio.gather(*(post_on_a_new_connection(edge, key) for _ in range(80)))
        assert statuses.count(200) == 30 and statuses.count(429) == 50
        counts = served_by_each_worker(edge)
        assert all(c > 0 for c in counts) and sum(counts) == 80, counts  # both workers took requests


async def test_sigterm_drains_the_workers_streams(tmp_path):
    with two_workers(tmp_path, tokens=15, interval_ms=100) as edge:
        key = edge.new_key()
        headers = {"Authorization": f"Bearer {key}"}
        connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(
                edge.url + "/v1/chat/completions",
                json={**CHAT, "max_tokens": 15, "stream": True},
                headers=headers,
            ) as r,
        ):
            events = []
            async for line in r.content:
                if line.startswith(b"data: "):
                    events.append(line)
                    if len(events) == 2:
                        edge.process.proc.terminate()  # shutdown begins mid-stream
        assert events[-1].startswith(b"data: [DONE]") and len(events) == 15 + 3  # role, 15 tokens, finish
        assert edge.process.proc.wait(15) == 0


async def test_workers_die_with_their_supervisor(tmp_path):
    with two_workers(tmp_path, tokens=1, interval_ms=1) as edge:
        assert edge.process.proc is not None
        workers = _children(edge.process.proc.pid)
        assert len(workers) == 2
        os.kill(edge.process.proc.pid, signal.SIGKILL)  # the supervisor dies without a word
        deadline = time.monotonic() + EVENTUALLY_S
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_two_workers_never_overspend_a_budget_together(tmp_path):
    """Budgets are held in Redis beside the limits: two processes cannot each spend the whole of one."""
    import sqlite3

    # Each request may cost $5.3e-6 (a 42-token prompt ceiling, 16 tokens out) and really costs $3.7e-6:
    # one book per process would let each hold two at once, and four would spend $14.8e-6 of $11e-6.
    with two_workers(tmp_path, tokens=16, interval_ms=20) as edge:
        key = edge.new_key(budget_usd=0.000011, rpm=1000, tpm=10**6)
        payload = {**CHAT, "max_tokens": 16}
        statuses = await asyncio.gather(*(post_on_a_new_connection(edge, key, payload) for _ in range(60)))
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 2
        await asyncio.sleep(0.5)
        db = sqlite3.connect(edge.ledger_db)
        [(spent,)] = db.execute("SELECT sum(cost_usd) FROM usage WHERE key_id = ?", (key.split("-")[1],))
        db.close()
        assert spent <= 0.000011
