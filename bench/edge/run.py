"""``nearshore bench edge``: what the edge proxy adds to a token stream, beside nginx and LiteLLM's proxy.

Every path ends at the same upstream, a pacer (``nearshore pacer``) that streams tokens at a fixed pace,
so the differences are the proxies': (a) direct to the pacer, (b) through a Nearshore edge (TLS off, so
it compares with the others), (c) through nginx as a plain reverse proxy, the floor for a proxy on this
machine, (d) through LiteLLM's proxy, one worker, from its own virtualenv (see bench/peers.py).

The proxies run side by side but are loaded one at a time, never at once, so they do not compete for the
cores. Each concurrency level is split into rounds; every round runs every path, in the reverse order of
the round before, so a noisy machine drifts on all paths alike. Overhead is a path's percentile minus the
direct path's at the same level.

Each stream records TTFT (send -> first content event), end-to-end time (send -> ``[DONE]``) and every gap
between content events; a gap under a quarter of the pacer's interval counts as bunched. A proxy's CPU
time is read from /proc (its process and their children, every thread) from the measured streams' start
until it is quiet again, so work it defers (logging, settling) counts too.

A second part (bench/edge/rps.py) ramps an open-loop request rate at one edge process (plain and
TLS) in front of a pacer that answers at once. With ``--routing on,off`` the edge runs with its route stage
and without it, side by side in the stream and non-streamed parts (bench/edge/routing.py); with ``--fleet``
an edge in a city's fleet mode runs beside the edge alone the same way (bench/edge/fleet.py), and with
``--tls`` the edge with TLS on (its default) beside it with TLS off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from bench import peers
from bench.cpu import idle_cpu
from bench.edge import fleet as edge_fleet
from bench.edge import paired
from bench.edge import report as edge_report
from bench.edge import routing as edge_routing
from bench.edge import rps as edge_rps
from bench.edge import throughput as edge_throughput
from bench.edge.request import chat_body, one_stream, session_for
from bench.peers import Endpoint
from harness.client import Stream
from harness.procs import ProcessFailed
from harness.stats import percentile

# How the pacer's clock is said in the report's first line.
_CLOCKS = {"stream": "each stream on its own clock", "step": "every stream on one step clock"}
BUNCHED = 0.25  # a gap shorter than this share of the pacer's interval: two chunks arrived together


@dataclass(frozen=True)
class EdgeBench:
    """The run's settings (the command's flags)."""

    concurrency: str  # stream counts, comma-separated
    streams: int  # measured streams per path and level
    waves: int  # at least this many streams per worker and level
    rounds: int  # rounds per level, paths interleaved
    tokens: int  # tokens per stream
    interval_ms: float  # the pacer's gap between tokens
    clock: str  # the pacer's clock: "stream" (each stream's own, from its arrival) or "step" (one, shared)
    no_nginx: bool
    nginx: str  # nginx binary ("": on PATH, else /usr/sbin/nginx)
    # also the bare byte relay (bench/edge/floor.py), what the runtime alone costs, and the edge's frame
    # without its stages (bench/edge/frame.py), on aiohttp and on the lean server core (frame_lean.py)
    floor: bool
    no_litellm: bool
    litellm: str  # LiteLLM's CLI, in its own venv
    rps_rates: str  # request rates for the max-RPS part, comma-separated; empty skips it
    rps_seconds: float  # seconds at each rate
    rps_budget_s: float  # cap on the ramp's time
    unary_concurrency: int  # clients of the non-streamed throughput part
    unary_seconds: float  # its length per path; 0 skips it
    routing: str  # "on", "off" or "on,off": the edge with its route stage, without, or both side by side
    fleet: bool  # also the edge in fleet mode (PostgreSQL and Redis), beside the edge alone
    tls: bool  # also the edge with TLS on (as it runs by default), beside the edge with it off
    json: str | None  # also write every number here
    logs: str  # folder for logs and configs ("": a temp folder)


# --- part 1: streams at fixed concurrency ---------------------------------------------------------------


@dataclass
class Sample:
    """One path at one concurrency level, over all its rounds."""

    path: str
    concurrency: int
    streams: list[Stream] = field(default_factory=list)
    wall_s: float = 0.0
    proxy_cpu_s: float = 0.0
    pacer_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def ok(self) -> list[Stream]:
        return [s for s in self.streams if not s.error]

    def summary(self, interval_s: float) -> dict:
        ok = self.ok
        ttfts, e2es = [s.ttft_s for s in ok], [s.e2e_s for s in ok]
        tails = [s.e2e_s - s.last_token_s for s in ok]
        edge_times = [t for s in ok if not math.isnan(t := s.server_timing_s("edge"))]
        gaps = [g for s in ok for g in s.gaps_s]
        n = len(self.streams) or 1
        errors = [s.error for s in self.streams if s.error]
        return {
            "path": self.path,
            "concurrency": self.concurrency,
            "streams": len(ok),
            "errors": len(errors),
            "first_error": errors[0] if errors else "",
            "ttft_p50_ms": percentile(ttfts, 50) * 1000,
            "ttft_p99_ms": percentile(ttfts, 99) * 1000,
            "e2e_p50_ms": percentile(e2es, 50) * 1000,
            "e2e_p99_ms": percentile(e2es, 99) * 1000,
            "tail_p50_ms": percentile(tails, 50) * 1000,  # last content event -> [DONE]
            "tail_p99_ms": percentile(tails, 99) * 1000,
            "server_timing_edge_p50_ms": percentile(edge_times, 50) * 1000,
            "server_timing_edge_p99_ms": percentile(edge_times, 99) * 1000,
            "gap_p50_ms": percentile(gaps, 50) * 1000,
            "gap_p99_ms": percentile(gaps, 99) * 1000,
            "bunched_pct": 100 * sum(g < BUNCHED * interval_s for g in gaps) / len(gaps)
            if gaps
            else math.nan,
            "cpu_ms_per_stream": self.proxy_cpu_s * 1000 / n,
            "pacer_cpu_ms_per_stream": self.pacer_cpu_s * 1000 / n,
            "client_cpu_ms_per_stream": self.client_cpu_s * 1000 / n,
            "streams_per_s": len(ok) / self.wall_s if self.wall_s else 0.0,
        }


async def _drive(
    session: aiohttp.ClientSession,
    target: Endpoint,
    body: bytes,
    expected_tokens: int,
    concurrency: int,
    count: int,
    deadline_s: float,
) -> list[Stream]:
    """``count`` streams, ``concurrency`` at a time, each worker starting its next as one ends."""
    results: list[Stream] = []

    async def worker() -> None:
        while len(results) < count:
            result = Stream()
            results.append(result)
            await one_stream(session, target, body, expected_tokens, result)

    with contextlib.suppress(TimeoutError):  # unfinished streams keep their "unfinished" error
        async with asyncio.timeout(deadline_s):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _measure(
    target: Endpoint, pacer: Endpoint, level: int, count: int, bench: EdgeBench, sample: Sample
) -> None:
    body = chat_body(bench.tokens)
    waves = math.ceil(count / level) + 1
    deadline_s = 30 + 5 * waves * (bench.tokens + 1) * bench.interval_ms / 1000
    async with session_for(target) as session:
        # One unmeasured wave opens the client's connections (and the proxy's to the pacer).
        await _drive(session, target, body, bench.tokens, level, level, deadline_s)
        proxy0, pacer0, client0 = target.cpu_s(), pacer.cpu_s(), time.process_time()
        started = time.perf_counter()
        sample.streams += await _drive(session, target, body, bench.tokens, level, count, deadline_s)
        sample.wall_s += time.perf_counter() - started
        await quiesce(target)
        sample.proxy_cpu_s += target.cpu_s() - proxy0
        sample.pacer_cpu_s += pacer.cpu_s() - pacer0
        sample.client_cpu_s += time.process_time() - client0


async def quiesce(target: Endpoint, limit_s: float = 5.0) -> None:
    """Wait until the proxy has done the work a load leaves behind (logging, settling), so that it counts
    in its CPU and does not slow the next path: under 5% of a core for 200 ms, or ``limit_s``."""
    if target.process is None:
        return
    deadline, last = time.monotonic() + limit_s, target.cpu_s()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        now = target.cpu_s()
        if now - last < 0.01:
            return
        last = now


def run_levels(
    runner: asyncio.Runner, targets: list[Endpoint], pacer: Endpoint, bench: EdgeBench
) -> list[dict]:
    levels = [int(x) for x in bench.concurrency.split(",") if x]
    rows: list[dict] = []
    for level in levels:
        total = max(bench.streams, bench.waves * level)
        per_round = math.ceil(total / bench.rounds)
        samples = {t.name: Sample(t.name, level) for t in targets}
        for round_index in range(bench.rounds):
            order = targets if round_index % 2 == 0 else targets[::-1]
            for target in order:
                runner.run(_measure(target, pacer, level, per_round, bench, samples[target.name]))
        direct = samples["direct"].summary(bench.interval_ms / 1000)
        for target in targets:
            row = samples[target.name].summary(bench.interval_ms / 1000)
            for metric in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
                row[f"{metric}_overhead_ms"] = row[f"{metric}_ms"] - direct[f"{metric}_ms"]
            rows.append(row)
            print(
                f"  x{level:<4} {target.name:>8}: {row['streams']} streams, "
                f"TTFT p50 {row['ttft_p50_ms']:.2f} ms, e2e p50 {row['e2e_p50_ms']:.2f} ms "
                f"(+{row['e2e_p50_overhead_ms']:.2f}), "
                f"{row['errors']} errors",
                flush=True,
            )
    return rows


# --- the run --------------------------------------------------------------------------------------------


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _start_proxies(
    logs: Path,
    pacer: Endpoint,
    nginx: str | None,
    litellm: Path | None,
    routing: list[bool],
    city: edge_fleet.CityStores | None,
    notes: list[str],
    stack: contextlib.ExitStack,
    floor: bool = False,
    tls: bool = False,
) -> list[Endpoint]:
    """The edge (once per routing mode, in fleet mode with ``city``, with TLS on with ``tls``), then nginx
    and LiteLLM where found; a peer that fails to start is a note, an edge's failure is the run's. Each is
    stopped with ``stack``."""
    starters: list[tuple[str, Callable[[], list[Endpoint]]]] = [
        ("edge", lambda: edge_routing.start_edges(logs, "edge", pacer.url, routing, tls=False))
    ]
    if city is not None:
        starters.append(("edge", lambda: [edge_fleet.start_edge(logs, "edge", pacer.url, city, tls=False)]))
    if tls:
        starters.append(("edge", lambda: [peers.start_edge(logs, paired.HTTPS_EDGE, pacer.url, tls=True)]))
    if nginx:
        starters.append(("nginx", lambda: [peers.start_nginx(logs, nginx, pacer.url)]))
        if tls:
            starters.append(("nginx", lambda: [peers.start_nginx(logs, nginx, pacer.url, tls=True)]))
    if floor:
        starters.append(("floor", lambda: [peers.start_floor(logs, pacer.url)]))
        starters.append(("frame", lambda: [peers.start_frame(logs, pacer.url)]))
        starters.append(("lean", lambda: [peers.start_lean_frame(logs, pacer.url)]))
    if litellm:
        starters.append(("litellm", lambda: [peers.start_litellm(logs, litellm, pacer.url)]))
    started: list[Endpoint] = []
    for name, start in starters:
        try:
            proxies = start()
        except ProcessFailed as exc:
            if name == "edge":
                raise
            notes.append(f"{name} skipped: it did not start ({str(exc).splitlines()[0]})")
            continue
        for proxy in proxies:
            stack.callback(proxy.stop)
        started += proxies
    return started


def run(bench: EdgeBench) -> dict:
    """Run both parts, print the report, return every number (also written to ``bench.json``, a path)."""
    started = time.monotonic()
    routing = edge_routing.parse_modes(bench.routing)
    logs = Path(bench.logs or tempfile.mkdtemp(prefix="nearshore-bench-edge-"))
    logs.mkdir(parents=True, exist_ok=True)
    nginx = None if bench.no_nginx else peers.find_nginx(bench.nginx)
    litellm = None if bench.no_litellm else peers.find_litellm(bench.litellm)
    notes: list[str] = []
    if not bench.no_nginx and nginx is None:
        notes.append("nginx skipped: not found (apt-get install -y nginx)")
    if not bench.no_litellm and litellm is None:
        notes.append(
            f"LiteLLM skipped: {bench.litellm} not found (python3 -m venv .venv-litellm && "
            ".venv-litellm/bin/pip install 'litellm[proxy]')"
        )
    report: dict = {"settings": asdict(bench), "environment": peers.versions(nginx, litellm)}
    print(
        f"edge overhead bench: pacer {bench.tokens} tokens every {bench.interval_ms:g} ms "
        f"({_CLOCKS[bench.clock]}); "
        f"levels {bench.concurrency}; {bench.rounds} rounds per level, paths interleaved; logs in {logs}",
        flush=True,
    )
    with contextlib.ExitStack() as stores:
        city = edge_fleet.CityStores(logs) if bench.fleet else None
        if city is not None:
            stores.callback(city.stop)
        _run_parts(bench, logs, nginx, litellm, routing, city, notes, report)
    report["ratios"] = edge_report.ratios(report["streams"])
    report["targets"] = edge_report.targets(
        report["streams"], report.get("throughput"), ttft=bench.clock == "stream"
    )
    report["routing"] = edge_routing.summary(report["streams"], report.get("throughput"))
    report["fleet"] = paired.compare(
        report["streams"], report.get("throughput"), "edge" + edge_fleet.SUFFIX, "edge"
    )
    report["tls"] = paired.compare(report["streams"], report.get("throughput"), paired.HTTPS_EDGE, "edge")
    report["tls_nginx"] = paired.compare(
        report["streams"], report.get("throughput"), peers.NGINX_HTTPS, "nginx"
    )
    report["notes"], report["logs"] = notes, str(logs)
    report["elapsed_s"] = time.monotonic() - started
    edge_report.print_report(report)
    if bench.json:
        Path(bench.json).write_text(json.dumps(edge_report.finite(report), indent=2, default=str))
    return report


def _run_parts(
    bench: EdgeBench,
    logs: Path,
    nginx: str | None,
    litellm: Path | None,
    routing: list[bool],
    city: edge_fleet.CityStores | None,
    notes: list[str],
    report: dict,
) -> None:
    """The stream part, then the ramp and the non-streamed part, each with its own processes."""
    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner, contextlib.ExitStack() as stack:
        pacer = peers.start_stand_in(
            logs, "pacer", "pacer", tokens=bench.tokens, interval_ms=bench.interval_ms, clock=bench.clock
        )
        stack.callback(pacer.stop)
        targets = [Endpoint("direct", pacer.url, dict(peers.JSON))]
        targets += _start_proxies(
            logs, pacer, nginx, litellm, routing, city, notes, stack, bench.floor, bench.tls
        )
        idle = {t.name: t.process for t in (pacer, *targets) if t.process is not None}
        report["idle_cpu_ms_per_s"] = idle_cpu(idle)
        report["streams"] = run_levels(runner, targets, pacer, bench)
        stack.close()  # stop the stream part's processes before the ramp
        if bench.rps_rates:
            print("max RPS ramp (open loop, 1-token streams from an instant pacer):", flush=True)
            rates = [float(x) for x in bench.rps_rates.split(",") if x]
            ramp = edge_rps.Ramp(rates, bench.rps_seconds, bench.rps_budget_s)
            report["rps"] = edge_rps.run_rps(runner, logs, ramp, stack)
        if bench.unary_seconds > 0:
            print(
                f"non-streamed throughput (closed loop, {bench.unary_concurrency} clients, instant pacer):",
                flush=True,
            )
            report["throughput"] = edge_throughput.run_throughput(
                runner,
                logs,
                nginx,
                bench.unary_concurrency,
                bench.unary_seconds,
                stack,
                routing,
                city,
                bench.floor,
                bench.tls,
            )
