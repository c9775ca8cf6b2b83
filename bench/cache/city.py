"""One cache for a city's edges, measured: ``python -m bench.cache.city [--questions N]``.

A real Redis, a stand-in region, an edge alone (``[cache]`` as today) and two edges sharing their caches
through the Redis (``share_redis_url``). The same ``--questions`` are stored through the lone edge and
through shared edge A; then, interleaved question by question, each is asked again as an exact repeat: on
the lone edge (its own entry) and on shared edge B (A's entry, applied by B's follower). Printed: each
kind's hit latency p50/p99 at the client (the acceptance's "a cache hit's p99 beside today's"), and how
long after A's answer B had applied A's entry to its store (the follow's delay; B's operator /health
asked every millisecond), after which B serves it as a hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import peers
from edge.keys import KeyStore
from harness.procs import ManagedProcess, free_port
from harness.redis_server import RedisServer
from harness.stats import percentile
from nearshore.children import nearshore_argv
from nearshore.tomlw import dumps

MODEL = peers.MODEL


def start_edge(
    logs: Path, name: str, region_url: str, keys_db: Path, cache: dict
) -> tuple[ManagedProcess, str]:
    folder = logs / name
    folder.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    config = {
        "name": name,
        "keys_db": keys_db,
        "ledger_db": folder / "ledger.sqlite3",
        "server": {"port": port},
        "tls": {"enabled": False},
        "metrics": {"port": metrics_port},
        "cache": {"folder": str(folder / "cache"), "store_truncated": True, **cache},
        "regions": [{"name": "pacer", "url": region_url}],
    }
    (folder / "edge.toml").write_text(dumps(config))
    url = f"http://127.0.0.1:{port}"
    argv = nearshore_argv("edge", "--config", str(folder / "edge.toml"))
    process = peers.started(ManagedProcess(name, argv, logs / f"{name}.log"), url + "/health", 60)
    return process, url, f"http://127.0.0.1:{metrics_port}"


async def applied(s: aiohttp.ClientSession, operator_url: str) -> int:
    """The changes from other edges this edge has applied to its store (its operator /health)."""
    async with s.get(operator_url + "/health") as r:
        return (await r.json())["cache_share"]["applied"]


async def ask(s: aiohttp.ClientSession, url: str, key: str, question: str) -> tuple[float, str]:
    body = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": question}],
    }
    headers = {"Authorization": f"Bearer {key}", "Cache-Control": "no-store"}
    start = time.perf_counter()
    async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        return (time.perf_counter() - start) * 1000, r.headers.get("x-nearshore-cache", "")


async def measure(urls: dict[str, str], operators: dict[str, str], key: str, questions: int) -> dict:
    lone, a, b = urls["lone"], urls["shared-a"], urls["shared-b"]
    b_operator = operators["shared-b"]
    texts = [
        f"City cache question number {i}: what is the tallest building in Lagos?" for i in range(questions)
    ]
    follow_ms, hits = [], {"lone": [], "shared": []}
    async with aiohttp.ClientSession() as s:
        # Each edge's embedder loads on its first cacheable request, its pair judge on the first candidate
        # near enough to judge (a store waits for its edge's lookup): warmed on questions of the same shape.
        for url in (lone, a, b):
            for i in range(3):
                warm_up = f"City cache warm-up number {i}: what is the tallest building in Abuja?"
                await ask(s, url, key, warm_up)
        done = await applied(s, b_operator)
        for text in texts:
            body = {
                "model": MODEL,
                "temperature": 0,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": text}],
            }
            headers = {"Authorization": f"Bearer {key}"}
            for url in (lone, a):  # stored through the lone edge and through A
                async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    await r.read()
            stored = time.perf_counter()
            while await applied(s, b_operator) < done + 1:  # the cheap question, asked every 1 ms
                await asyncio.sleep(0.001)
            follow_ms.append((time.perf_counter() - stored) * 1000)
            done += 1
            assert (await ask(s, b, key, text))[1] == "HIT"
        for _ in range(3):  # exact repeats, interleaved: drift hits both alike
            for text in texts:
                for kind, url in (("lone", lone), ("shared", b)):
                    ms, cache = await ask(s, url, key, text)
                    assert cache == "HIT", (kind, cache)
                    hits[kind].append(ms)

    def stats(values: list[float]) -> dict[str, float]:
        return {"p50": round(percentile(values, 50), 2), "p99": round(percentile(values, 99), 2)}

    return {
        "hit_lone_ms": stats(hits["lone"]),
        "hit_shared_ms": stats(hits["shared"]),
        "follow_ms": {**stats(follow_ms), "max": round(max(follow_ms), 2)},
        "hits_each": len(hits["lone"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--logs", default="", help="folder for logs (default: a temp folder)")
    args = parser.parse_args(argv)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="nearshore-bench-city-cache-"))
    logs.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(logs / "redis").start()
    redis_url = redis.url
    pacer = peers.start_stand_in(logs, "pacer", "pacer", tokens=4, interval_ms=20)
    store = KeyStore(logs / "keys.sqlite3")
    key, _ = store.create("bench", rpm=10**9, tpm=10**12)
    store.close()
    processes, urls, operators = [redis, pacer.process], {}, {}
    try:
        for name, cache in (
            ("lone", {}),
            ("shared-a", {"share_redis_url": redis_url}),
            ("shared-b", {"share_redis_url": redis_url}),
        ):
            process, urls[name], operators[name] = start_edge(
                logs, name, pacer.url, logs / "keys.sqlite3", cache
            )
            processes.append(process)
        report = asyncio.run(measure(urls, operators, key, args.questions))
    finally:
        for process in reversed(processes):
            process.stop()
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
