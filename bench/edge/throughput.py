"""``bench edge``, part 3: non-streamed throughput, closed loop, beside nginx.

An instant pacer (it answers a 1-token request at once), then one edge process (plain HTTP) and nginx in
front of it, each driven in turn by ``concurrency`` clients that send the next request as soon as the last
answered, for ``seconds``. Reports requests per second, the proxy's CPU per request, and errors; and, for
scale, what the client and pacer alone do (the direct path), so the client's own ceiling is visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import aiohttp

from bench import peers
from bench.edge import fleet as edge_fleet
from bench.edge import paired
from bench.edge import routing as edge_routing
from bench.peers import MODEL, Endpoint

_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 1}
).encode()


async def closed_loop(target: Endpoint, concurrency: int, seconds: float) -> dict:
    connector = aiohttp.TCPConnector(limit=0, ssl=target.ssl or True)
    timeout = aiohttp.ClientTimeout(total=30)
    done = errors = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> bool:
            async with session.post(
                target.url + "/v1/chat/completions", data=_BODY, headers=target.headers
            ) as r:
                await r.read()
                return r.status == 200

        await asyncio.gather(*(one() for _ in range(concurrency)))  # connections open before timing
        deadline = time.perf_counter() + seconds
        cpu0 = target.cpu_s()

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    ok = await one()
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                done += ok
                errors += not ok

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = target.cpu_s() - cpu0
    return {"done": done, "errors": errors, "elapsed_s": elapsed, "cpu_s": cpu}


def _row(path: str, parts: list[dict]) -> dict:
    """One path's figures over all its rounds."""
    done, errors = sum(p["done"] for p in parts), sum(p["errors"] for p in parts)
    return {
        "path": path,
        "rps": done / sum(p["elapsed_s"] for p in parts),
        "errors": errors,
        "cpu_ms_per_request": sum(p["cpu_s"] for p in parts) * 1000 / max(1, done + errors),
    }


def run_throughput(
    runner: asyncio.Runner,
    logs: Path,
    nginx: str | None,
    concurrency: int,
    seconds: float,
    stack: contextlib.ExitStack,
    routing: list[bool] | None = None,
    city: edge_fleet.CityStores | None = None,
    floor: bool = False,
    tls: bool = False,
) -> list[dict]:
    """``routing``: the edge's route stage on, off, or both side by side (edge_routing.py); ``city``: also
    the edge in fleet mode (edge_fleet.py); ``floor``: also the bare byte relay (floor.py) and the edge's
    frame without its stages (frame.py), on aiohttp and on the lean server core (frame_lean.py); ``tls``:
    also the edge with TLS on."""
    pacer = peers.start_stand_in(logs, "pacer", "pacer-instant", tokens=1, interval_ms=0)
    stack.callback(pacer.stop)
    targets = [Endpoint("direct", pacer.url, dict(peers.JSON))]
    for edge in edge_routing.start_edges(logs, "edge-unary", pacer.url, routing or [True], tls=False):
        stack.callback(edge.stop)
        targets.append(edge)
    if city is not None:
        targets.append(edge_fleet.start_edge(logs, "edge-unary", pacer.url, city, tls=False))
        stack.callback(targets[-1].stop)
    if tls:
        targets.append(peers.start_edge(logs, paired.unary_path(paired.HTTPS_EDGE), pacer.url, tls=True))
        stack.callback(targets[-1].stop)
    if nginx:
        for https in (False, True) if tls else (False,):
            targets.append(peers.start_nginx(logs / "unary", nginx, pacer.url, tls=https))
            stack.callback(targets[-1].stop)
    if floor:
        for start in (peers.start_floor, peers.start_frame, peers.start_lean_frame):
            targets.append(start(logs / "unary", pacer.url))
            stack.callback(targets[-1].stop)
    # With two edges compared, the paths alternate over rounds, so that drift on a busy machine hits both.
    rounds = 4 if (routing and len(routing) > 1) or city is not None or tls else 1
    parts: dict[str, list[dict]] = {t.name: [] for t in targets}
    for i in range(rounds):
        for target in targets if i % 2 == 0 else targets[::-1]:
            parts[target.name].append(runner.run(closed_loop(target, concurrency, seconds / rounds)))
    rows = [_row(t.name, parts[t.name]) for t in targets]
    for row in rows:
        print(
            f"  {row['path']:>10}: {row['rps']:7.0f} req/s, CPU {row['cpu_ms_per_request']:.3f} ms/req, "
            f"{row['errors']} errors",
            flush=True,
        )
    return rows
