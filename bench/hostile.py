"""``nearshore bench hostile``: what a hostile region costs the edge in front of it, beside an honest one.

Two edges with the same config, one in front of ``nearshore pacer`` (honest), one in front of ``nearshore
hostile`` with every mode at once (endless bodies, streams without a blank line, lying usage, broken framing,
HTML, hangs). Each gets the same closed-loop load in turn while /health is probed every 20 ms and the edge's
RSS sampled; at the end every request must have exactly one ledger row. Reports the /health latency
(p50, p99, max), peak RSS, the statuses, and the ledger check, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import peers
from bench.peers import Endpoint
from harness.standins.hostile import MODES
from harness.stats import percentile
from nearshore.protocol.headers import CLIENT_REQUEST_ID

# Modes that answer correctly are left out: they measure nothing here.
HOSTILE_MODES = sorted(name for name in MODES if name != "ok")
EDGE_UPSTREAM = {"ttft_timeout_s": 2, "unary_timeout_per_token_s": 0.05, "stall_timeout_s": 2}


@dataclass
class EdgeUnderTest:
    endpoint: Endpoint
    statuses: Counter = field(default_factory=Counter)
    client_ids: list[str] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def ledger(self) -> Path:
        assert self.endpoint.folder is not None
        return self.endpoint.folder / "ledger.sqlite3"


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
    headers = {**edge.endpoint.headers, CLIENT_REQUEST_ID: client_id}
    edge.client_ids.append(client_id)
    try:
        async with s.post(edge.endpoint.url + "/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
            edge.statuses[r.status] += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        edge.statuses[type(exc).__name__] += 1


async def _watch(edge: EdgeUnderTest, s: aiohttp.ClientSession, stop: asyncio.Event) -> None:
    """/health every 20 ms (on the same listener users reach), and the edge's RSS."""
    process = edge.endpoint.process
    assert process is not None and process.proc is not None
    status = Path(f"/proc/{process.proc.pid}/status")
    while not stop.is_set():
        started = time.perf_counter()
        async with s.get(edge.endpoint.url + "/health") as r:
            await r.read()
        edge.health_ms.append((time.perf_counter() - started) * 1000)
        with contextlib.suppress(OSError, StopIteration):
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
            edge.rss_mb.append(int(line.split()[1]) / 1024)
        await asyncio.sleep(0.02)


async def _load(edge: EdgeUnderTest, modes: list[str | None], seconds: float, concurrency: int) -> None:
    kinds = itertools.cycle(itertools.product(modes, (False, True)))
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0, ssl=edge.endpoint.ssl or True)
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


@dataclass(frozen=True)
class HostileBench:
    """The run's settings (the command's flags)."""

    seconds: float  # load per edge
    concurrency: int  # requests in flight
    logs: str  # folder for logs and configs ("": a temp folder)


def run(bench: HostileBench) -> list[EdgeUnderTest]:
    """Load each edge in turn, print the table; return what each edge saw."""
    logs = Path(bench.logs or tempfile.mkdtemp(prefix="nearshore-bench-hostile-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"hostile-region bench: {bench.concurrency} requests in flight for {bench.seconds:g}s per edge; "
        f"{len(HOSTILE_MODES)} hostile modes, streamed and not; logs in {logs}",
        flush=True,
    )
    results: list[EdgeUnderTest] = []
    with contextlib.ExitStack() as stack:
        for name, command, modes in (
            ("honest", "pacer", [None]),
            ("hostile", "hostile", list(HOSTILE_MODES)),
        ):
            region = peers.start_stand_in(logs, command, command)
            stack.callback(region.stop)
            edge_name = f"edge-{name}"
            endpoint = peers.start_edge(
                logs, edge_name, region.url, tls=True, region_name=edge_name, upstream=EDGE_UPSTREAM
            )
            stack.callback(endpoint.stop)
            edge = EdgeUnderTest(endpoint)
            asyncio.run(_load(edge, modes, bench.seconds, bench.concurrency))
            results.append(edge)
    header = f"{'edge in front of':<18}{'requests':>9}{'health p50':>12}{'p99':>8}{'max':>8}{'RSS max':>9}"
    print(f"\n{header}  ledger")
    for edge in results:
        print(
            f"{edge.name.removeprefix('edge-') + ' region':<18}{len(edge.client_ids):>9}"
            f"{percentile(edge.health_ms, 50):>10.1f}ms{percentile(edge.health_ms, 99):>6.1f}ms"
            f"{max(edge.health_ms, default=0):>6.1f}ms{max(edge.rss_mb, default=0):>7.0f}MB"
            f"  {_ledger_check(edge)}"
        )
        print(f"{'':<18}statuses: {dict(sorted(edge.statuses.items(), key=str))}")
    return results
