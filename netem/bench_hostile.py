"""``nearshore bench hostile``: what a hostile region costs the edge in front of it, beside an honest one.

Two edges with the same config, one in front of ``nearshore pacer`` (honest), one in front of ``nearshore
hostile`` with every mode at once (endless bodies, streams without a blank line, lying usage, broken framing,
HTML, hangs). Each gets the same closed-loop load in turn while /health is probed every 20 ms and the edge's
RSS sampled; at the end every request must have exactly one ledger row. Reports the /health latency
(p50, p99, max), peak RSS, the statuses, and the ledger check, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sqlite3
import ssl
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from edge.keys import KeyStore
from nearshore.procs import ManagedProcess, free_port, nearshore_argv
from nearshore.tls import ensure_dev_certificate
from netem.hostile import MODES

# Modes that answer correctly are left out: they measure nothing here.
HOSTILE_MODES = sorted(name for name in MODES if name != "ok")
EDGE_UPSTREAM = {"first_byte_timeout_s": 2, "unary_timeout_per_token_s": 0.05, "idle_timeout_s": 2}


@dataclass
class EdgeUnderTest:
    name: str
    url: str
    key: str
    process: ManagedProcess
    ledger: Path
    context: ssl.SSLContext
    statuses: Counter = field(default_factory=Counter)
    client_ids: list[str] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)


def _start_region(logs: Path, command: str, *flags: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = nearshore_argv(command, "--port", str(port), "--name", command, *flags)
    process = ManagedProcess(command, argv, logs / f"{command}.log").start()
    url = f"http://127.0.0.1:{port}"
    process.wait_http(url + "/health", timeout_s=30)
    return process, url


def _start_edge(logs: Path, name: str, region_url: str) -> EdgeUnderTest:
    folder = logs / name
    folder.mkdir(parents=True, exist_ok=True)
    store = KeyStore(folder / "keys.sqlite3")
    try:
        key, _ = store.create(tenant="bench", rpm=10**9, tpm=10**12)
    finally:
        store.close()
    cert, _ = ensure_dev_certificate(folder / "tls")
    port = free_port()
    upstream = "".join(f"{k} = {v}\n" for k, v in EDGE_UPSTREAM.items())
    config = folder / "edge.toml"
    config.write_text(
        f'name = "{name}"\nkeys_db = "{folder / "keys.sqlite3"}"\nledger_db = "{folder / "ledger.sqlite3"}"\n'
        f'[server]\nport = {port}\n[tls]\ndev_cert_dir = "{folder / "tls"}"\n[metrics]\nport = 0\n'
        f'[upstream]\n{upstream}[[regions]]\nname = "{name}"\nurl = "{region_url}"\n'
    )
    process = ManagedProcess(name, nearshore_argv("edge", "--config", str(config)), logs / f"{name}.log")
    context = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{port}"
    process.start().wait_http(url + "/health", timeout_s=60, context=context)
    return EdgeUnderTest(name, url, key, process, folder / "ledger.sqlite3", context)


async def _request(s: aiohttp.ClientSession, edge: EdgeUnderTest, mode: str | None, stream: bool) -> None:
    client_id = uuid.uuid4().hex
    body = {
        "model": "gemma-3-270m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": stream,
    }
    if mode:
        body["user"] = f"mode:{mode}"
    headers = {"Authorization": f"Bearer {edge.key}", "x-client-request-id": client_id}
    edge.client_ids.append(client_id)
    try:
        async with s.post(edge.url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            edge.statuses[r.status] += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        edge.statuses[type(exc).__name__] += 1


async def _watch(edge: EdgeUnderTest, s: aiohttp.ClientSession, stop: asyncio.Event) -> None:
    """/health every 20 ms (on the same listener users reach), and the edge's RSS."""
    assert edge.process.proc is not None
    status = Path(f"/proc/{edge.process.proc.pid}/status")
    while not stop.is_set():
        started = time.perf_counter()
        async with s.get(edge.url + "/health") as r:
            await r.read()
        edge.health_ms.append((time.perf_counter() - started) * 1000)
        with contextlib.suppress(OSError, StopIteration):
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
            edge.rss_mb.append(int(line.split()[1]) / 1024)
        await asyncio.sleep(0.02)


async def _load(edge: EdgeUnderTest, modes: list[str | None], seconds: float, concurrency: int) -> None:
    kinds = itertools.cycle(itertools.product(modes, (False, True)))
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0, ssl=edge.context)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch(edge, s, stop))

        async def worker() -> None:
            while time.monotonic() < deadline:
                mode, stream = next(kinds)
                await _request(s, edge, mode, stream)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        stop.set()
        await watcher


def _ledger_check(edge: EdgeUnderTest) -> str:
    """'ok' when every request has exactly one row with sane counts, else what is wrong."""
    time.sleep(0.5)  # the last rows commit just after their answers
    db = sqlite3.connect(edge.ledger)
    try:
        rows = db.execute(
            "SELECT client_request_id, prompt_tokens, completion_tokens, cost_usd FROM usage"
        ).fetchall()
    finally:
        db.close()
    counts = Counter(row[0] for row in rows)
    missing = sum(1 for cid in edge.client_ids if counts[cid] == 0)
    doubled = sum(1 for n in counts.values() if n > 1)
    insane = sum(1 for _, p, c, cost in rows if not (0 <= p <= 100 and 0 <= c <= 9 and 0 <= cost < 1e-3))
    problems = [
        f"{n} {what}"
        for n, what in ((missing, "without a row"), (doubled, "billed twice"), (insane, "insane"))
        if n
    ]
    return ", ".join(problems) or f"ok ({len(rows)} rows)"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0, help="load per edge (default 20)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    parser.add_argument("--logs", default="", help="folder for logs and configs (default: a temp folder)")


def main(args: argparse.Namespace) -> int:
    logs = Path(args.logs or tempfile.mkdtemp(prefix="nearshore-bench-hostile-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"hostile-region bench: {args.concurrency} requests in flight for {args.seconds:g}s per edge; "
        f"{len(HOSTILE_MODES)} hostile modes, streamed and not; logs in {logs}",
        flush=True,
    )
    results: list[EdgeUnderTest] = []
    with contextlib.ExitStack() as stack:
        for name, command, modes in (
            ("honest", "pacer", [None]),
            ("hostile", "hostile", list(HOSTILE_MODES)),
        ):
            region, url = _start_region(logs, command)
            stack.callback(region.stop)
            edge = _start_edge(logs, f"edge-{name}", url)
            stack.callback(edge.process.stop)
            asyncio.run(_load(edge, modes, args.seconds, args.concurrency))
            results.append(edge)
    header = f"{'edge in front of':<18}{'requests':>9}{'health p50':>12}{'p99':>8}{'max':>8}{'RSS max':>9}"
    print(f"\n{header}  ledger")
    for edge in results:
        print(
            f"{edge.name.removeprefix('edge-') + ' region':<18}{len(edge.client_ids):>9}"
            f"{_pct(edge.health_ms, 0.5):>10.1f}ms{_pct(edge.health_ms, 0.99):>6.1f}ms"
            f"{max(edge.health_ms, default=0):>6.1f}ms{max(edge.rss_mb, default=0):>7.0f}MB"
            f"  {_ledger_check(edge)}"
        )
        print(f"{'':<18}statuses: {dict(sorted(edge.statuses.items(), key=str))}")
    return 0
