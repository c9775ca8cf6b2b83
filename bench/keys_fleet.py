"""``nearshore bench keys``: how fast a city's edges see a key change, with the keys in PostgreSQL (pushed to
every edge) beside the embedded SQLite file (each edge polls it; edges on one machine only), side by side
in one run (issue 35, item 1).

For each backend: ``--edges`` real edges over one stand-in region, then ``--rounds`` times: a key is
created (timed until every edge accepts it), one stream of it is opened on every edge, its RPM is lowered
to 1 (timed until each edge refuses its next request with 429: the key has used its one this minute), and
it is revoked (timed until each edge has ended that stream with ``key_revoked``). Then ``--requests`` short
chats on one edge: a request's latency in each mode (a key is checked in memory in both). Printed:
p50/p99/max of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from bench import peers
from edge.keys import KeyChange, KeyStore, KnownKeys, store_call
from harness.postgres import PostgresServer
from harness.procs import ManagedProcess, free_port
from harness.stats import percentile
from nearshore.children import nearshore_argv
from nearshore.tomlw import dumps

MODEL = peers.MODEL
# The stand-in region's pace: a stream outlives any revocation measured here (10,000 tokens, 5 ms apart),
# and a one-token chat's round trip is mostly the edge's.
STREAM_TOKENS = 10_000
INTERVAL_MS = 5


@dataclass(frozen=True)
class KeysBench:
    edges: int = 3
    rounds: int = 20
    requests: int = 300
    logs: str = ""
    json: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--edges", type=int, default=3, help="edges sharing the keys (default 3)")
    parser.add_argument("--rounds", type=int, default=20, help="keys created and revoked (default 20)")
    parser.add_argument("--requests", type=int, default=300, help="chats timed per backend (default 300)")
    parser.add_argument("--logs", default="", help="folder for the servers' logs (default: a temp folder)")
    parser.add_argument("--json", help="also write the report here")


def from_args(args: argparse.Namespace) -> KeysBench:
    return KeysBench(args.edges, args.rounds, args.requests, args.logs, args.json)


@dataclass
class BackendResult:
    backend: str
    created_ms: list[float] = field(default_factory=list)  # per edge and round: until it accepts the key
    lowered_ms: list[float] = field(default_factory=list)  # per edge and round: until RPM 1 refuses
    revoked_ms: list[float] = field(default_factory=list)  # per edge and round: until its stream ended
    request_ms: list[float] = field(default_factory=list)  # one short chat's round trip

    def summary(self) -> dict[str, object]:
        def stats(values: list[float]) -> dict[str, float]:
            if not values:
                return {}
            return {
                "p50": round(percentile(values, 50), 2),
                "p99": round(percentile(values, 99), 2),
                "max": round(max(values), 2),
            }

        return {
            "backend": self.backend,
            "create_seen_ms": stats(self.created_ms),
            "rpm_lowered_held_ms": stats(self.lowered_ms),
            "revoke_ended_stream_ms": stats(self.revoked_ms),
            "request_ms": stats(self.request_ms),
            "samples": len(self.revoked_ms),
        }


def start_edges(logs: Path, backend: str, region_url: str, count: int, keys: dict) -> list[peers.Endpoint]:
    edges = []
    for i in range(count):
        folder = logs / f"{backend}-edge{i}"
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = {
            "name": f"{backend}-edge{i}",
            "keys_db": logs / f"{backend}-keys.sqlite3",  # one file for every edge (read when sqlite)
            "keys": keys,
            "ledger_db": folder / "ledger.sqlite3",
            "server": {"port": port},
            "tls": {"enabled": False},
            "metrics": {"port": 0},
            "regions": [{"name": "pacer", "url": region_url}],
            # No per-key caps in the pool: a key's open 10,000-token stream must not hold its next chat
            # (the caps bind once other keys have used the pool; what is measured here is the keys).
            "pools": {"key_share": {"max_concurrent": 0, "max_tokens_in_flight": 0}},
        }
        (folder / "edge.toml").write_text(dumps(config))
        argv = nearshore_argv("edge", "--config", str(folder / "edge.toml"))
        url = f"http://127.0.0.1:{port}"
        process = peers.started(
            ManagedProcess(folder.name, argv, logs / f"{folder.name}.log"), url + "/health", 60
        )
        edges.append(peers.Endpoint(folder.name, url, dict(peers.JSON), process, None, folder))
    return edges


async def _accepted(s: aiohttp.ClientSession, url: str, key: str, start: float) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    while True:
        async with s.get(url + "/v1/models", headers=headers) as r:
            if r.status == 200:
                return (time.perf_counter() - start) * 1000
        await asyncio.sleep(0.002)


async def _refused(s: aiohttp.ClientSession, url: str, key: str, start: float) -> float:
    """Until the edge refuses a one-token chat of ``key`` with 429 (its lowered RPM holds)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {key}"}
    while True:
        async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            if r.status == 429:
                return (time.perf_counter() - start) * 1000
        await asyncio.sleep(0.002)


async def _stream_until_cut(
    s: aiohttp.ClientSession, url: str, key: str, started: asyncio.Event, cut: list[float]
) -> None:
    """Hold one stream of ``key`` open; note when the edge ends it with key_revoked."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": STREAM_TOKENS}
    headers = {"Authorization": f"Bearer {key}"}
    async with s.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as r:
        while line := await r.content.readline():
            if line.startswith(b"data: {") and b'"delta"' in line:
                started.set()
            if b"key_revoked" in line:
                cut.append(time.perf_counter())
                return


async def one_round(store: KnownKeys, edges: Sequence[peers.Endpoint], result: BackendResult) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        start = time.perf_counter()
        plaintext, key = await store_call(store, "create", "bench", rpm=10**9, tpm=10**12)
        result.created_ms += await asyncio.gather(*(_accepted(s, e.url, plaintext, start) for e in edges))
        events = [asyncio.Event() for _ in edges]
        cuts: list[float] = []
        streams = [
            asyncio.create_task(_stream_until_cut(s, e.url, plaintext, ev, cuts))
            for e, ev in zip(edges, events, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in events)), 30)
        start = time.perf_counter()
        await store_call(store, "update", key.key_id, KeyChange(rpm=1))
        lowered = (_refused(s, e.url, plaintext, start) for e in edges)
        result.lowered_ms += await asyncio.wait_for(asyncio.gather(*lowered), 30)
        start = time.perf_counter()
        await store_call(store, "revoke", key.key_id)
        await asyncio.wait_for(asyncio.gather(*streams), 30)
        result.revoked_ms += [(cut - start) * 1000 for cut in cuts]


async def timed_requests(edge: peers.Endpoint, key: str, count: int, result: BackendResult) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    headers = {**peers.JSON, "Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as s:
        for i in range(count + 20):  # the first 20 warm the connection and are not counted
            start = time.perf_counter()
            async with s.post(edge.url + "/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
            if i >= 20:
                result.request_ms.append((time.perf_counter() - start) * 1000)


async def measure(settings: KeysBench, logs: Path, backend: str, pacer_url: str, pg: PostgresServer) -> dict:
    from edge.keys_pg import PgKeyStore  # asyncpg: imported where the bench runs, not with the CLI

    result = BackendResult(backend)
    store: KnownKeys
    if backend == "postgres":
        url = pg.url()
        store = await PgKeyStore(url).open()
        keys = {"backend": "postgres", "postgres_url": url}
    else:
        store = KeyStore(logs / f"{backend}-keys.sqlite3")
        keys = {"backend": "sqlite"}
    edges = start_edges(logs, backend, pacer_url, settings.edges, keys)
    try:
        for _ in range(settings.rounds):
            await one_round(store, edges, result)
        plaintext, _ = await store_call(store, "create", "bench", rpm=10**9, tpm=10**12)
        await asyncio.gather(*(_accepted_on(e, plaintext) for e in edges[:1]))
        await timed_requests(edges[0], plaintext, settings.requests, result)
    finally:
        for edge in edges:
            edge.process.stop()
        await store_call(store, "close")
    return result.summary()


async def _accepted_on(edge: peers.Endpoint, key: str) -> None:
    async with aiohttp.ClientSession() as s:
        await _accepted(s, edge.url, key, time.perf_counter())


def run(settings: KeysBench) -> dict:
    logs = Path(settings.logs or tempfile.mkdtemp(prefix="nearshore-bench-keys-"))
    logs.mkdir(parents=True, exist_ok=True)
    pacer = peers.start_stand_in(logs, "pacer", "pacer", tokens=STREAM_TOKENS, interval_ms=INTERVAL_MS)
    pg = PostgresServer().start()
    os.environ.update(pg.env)  # the edges' password (PGPASSWORD), as a Secret would give it
    try:
        report = {
            "edges": settings.edges,
            "rounds": settings.rounds,
            "backends": [
                asyncio.run(measure(settings, logs, backend, pacer.url, pg))
                for backend in ("postgres", "sqlite")
            ],
            "logs": str(logs),
        }
    finally:
        pacer.process.stop()
        pg.remove()
    return report


def run_and_print(settings: KeysBench) -> None:
    report = run(settings)
    print(
        f"{settings.edges} edges, {settings.rounds} keys created and revoked per backend (ms, at the client)"
    )
    print(
        f"{'backend':<10} {'seen after create':>22} {'RPM 1 holds':>22} {'stream ended after revoke':>26}"
        f" {'one chat':>22}"
    )
    for b in report["backends"]:
        cells = [b["create_seen_ms"], b["rpm_lowered_held_ms"], b["revoke_ended_stream_ms"], b["request_ms"]]
        text = [f"{c['p50']:.1f} / {c['p99']:.1f} / {c['max']:.1f}" for c in cells]
        print(f"{b['backend']:<10} {text[0]:>22} {text[1]:>22} {text[2]:>26} {text[3]:>22}")
    print("(each: p50 / p99 / max)")
    if settings.json:
        Path(settings.json).write_text(json.dumps({**report, "settings": asdict(settings)}, indent=2))
