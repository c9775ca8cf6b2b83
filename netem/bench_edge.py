"""``nearshore bench edge``: what the edge proxy adds to a token stream, beside nginx and LiteLLM's proxy.

Every path ends at the same upstream, a pacer (``nearshore pacer``) that streams tokens at a fixed pace,
so the differences are the proxies': (a) direct to the pacer, (b) through a Nearshore edge (TLS off, so
it compares with the others), (c) through nginx as a plain reverse proxy, the floor for a proxy on this
machine, (d) through LiteLLM's proxy, one worker, from its own virtualenv.

The proxies run side by side but are loaded one at a time, never at once, so they do not compete for the
cores. Each concurrency level is split into rounds; every round runs every path, in the reverse order of
the round before, so a noisy machine drifts on all paths alike. Overhead is a path's percentile minus the
direct path's at the same level.

Each stream records TTFT (send -> first content event), end-to-end time (send -> ``[DONE]``) and every gap
between content events; a gap under a quarter of the pacer's interval counts as bunched. A proxy's CPU
time is read from /proc (its process and their children, every thread) from the measured streams' start
until it is quiet again, so work it defers (logging, settling) counts too.

A second part ramps an open-loop request rate at one edge process (plain and TLS) in front of a pacer
that answers at once, and reports the highest rate whose p99 overhead stays under 10 ms with no errors;
a failing rate is tried once more before it counts.

LiteLLM runs with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no fetch of the price map at start: this machine
has no internet), ``LITELLM_TELEMETRY_DISABLED=true``, ``LITELLM_LOG=ERROR``, no database (so no spend
logs, and ``disable_spend_logs: true`` besides) and a master key (it refuses to start without one); the
client sends that key as the edge's client sends its API key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

from edge.keys import KeyStore
from nearshore.procs import ManagedProcess, ProcessFailed, free_port, nearshore_argv
from nearshore.stats import percentile
from nearshore.tls import ensure_dev_certificate

MODEL = "gemma-3-270m"
BUNCHED = 0.25  # a gap shorter than this share of the pacer's interval: two chunks arrived together
RPS_OVERHEAD_LIMIT_MS = 10.0
STREAM_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
REPO = Path(__file__).resolve().parents[1]


# --- one stream, as the client sees it -----------------------------------------------------------------


@dataclass(slots=True)
class Stream:
    ttft_s: float = 0.0
    last_token_s: float = 0.0
    e2e_s: float = 0.0
    # The edge's own account (Server-Timing ``edge;dur``): arrival -> forwarded to the region.
    edge_s: float = math.nan
    tokens: int = 0
    gaps_s: list[float] = field(default_factory=list)
    error: str = "unfinished"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] = []
    error: dict | None = None


_event_decoder = msgspec.json.Decoder(_Event)


async def _one_stream(
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes,
    expected_tokens: int,
    result: Stream,
    started: float | None = None,
) -> None:
    """POST one streaming chat request; ``started`` (a perf_counter time) is when it was due to be sent."""
    started = time.perf_counter() if started is None else started
    try:
        async with session.post(target.url + "/v1/chat/completions", data=body, headers=target.headers) as r:
            if r.status != 200:
                result.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return
            result.edge_s = _server_timing_s(r.headers.get("Server-Timing", ""), "edge")
            buffer = b""
            async for piece in r.content.iter_any():
                now = time.perf_counter()
                buffer += piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece
                *events, buffer = buffer.split(b"\n\n")
                for raw in events:
                    data = b"\n".join(
                        line[5:].lstrip() for line in raw.split(b"\n") if line.startswith(b"data:")
                    )
                    if not data:
                        continue  # a comment (keep-alive)
                    if data == b"[DONE]":
                        result.e2e_s = now - started
                        short = result.tokens != expected_tokens
                        result.error = f"{result.tokens} of {expected_tokens} tokens" if short else ""
                        return
                    event = _event_decoder.decode(data)
                    if event.error is not None:
                        result.error = f"error event: {data[:200]!r}"
                        return
                    if not any((c.delta is not None and c.delta.content) or c.text for c in event.choices):
                        continue  # the role, finish or usage event
                    if result.tokens == 0:
                        result.ttft_s = now - started
                    else:
                        result.gaps_s.append(now - started - result.last_token_s)
                    result.last_token_s = now - started
                    result.tokens += 1
            result.error = "the stream ended without [DONE]"
    except (TimeoutError, aiohttp.ClientError, OSError, msgspec.DecodeError) as exc:
        result.error = repr(exc)[:200]


def _server_timing_s(header: str, name: str) -> float:
    for part in header.split(","):
        metric, *params = (p.strip() for p in part.split(";"))
        for param in params:
            if metric == name and param.startswith("dur="):
                with contextlib.suppress(ValueError):
                    return float(param[4:]) / 1000
    return math.nan


def _chat_body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def _session(target: Target) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, ssl=target.ssl or True)
    # A peer that accepts and then never answers (LiteLLM has, here) costs one read timeout, not the run.
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S, sock_connect=10, sock_read=READ_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


# --- the paths and their processes ----------------------------------------------------------------------


@dataclass
class Target:
    """One path to the pacer: where the client sends, and which process tree is the proxy's cost."""

    name: str
    url: str
    headers: dict[str, str]
    process: ManagedProcess | None = None  # None: direct, no proxy
    ssl: ssl.SSLContext | None = None

    def cpu_s(self) -> float:
        if self.process is None or self.process.proc is None:
            return 0.0
        return tree_cpu_s(self.process.proc.pid)


def _thread_cpu_s(pid: int) -> float:
    """CPU time (user + system) of one process's live threads, in seconds, to the nanosecond."""
    total_ns, found = 0, False
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                found = True
    if found:
        return total_ns / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):  # no schedstat: clock ticks, 10 ms steps
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_s(root: int) -> float:
    """CPU time of a process and all its descendants (nginx's workers, LiteLLM's children)."""
    return sum(_thread_cpu_s(pid) for pid in _descendants(root))


def _start_pacer(logs: Path, name: str, tokens: int, interval_ms: float) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = nearshore_argv(
        "pacer",
        "--port",
        str(port),
        "--tokens",
        str(tokens),
        "--interval-ms",
        str(interval_ms),
        "--name",
        name,
    )
    process = ManagedProcess(name, argv, logs / f"{name}.log").start()
    url = f"http://127.0.0.1:{port}"
    process.wait_http(url + "/health", timeout_s=30)
    return process, url


def _start_edge(logs: Path, name: str, region_url: str, tls: bool) -> Target:
    folder = logs / name
    folder.mkdir(parents=True, exist_ok=True)
    keys_db = folder / "keys.sqlite3"
    store = KeyStore(keys_db)
    try:
        api_key, _ = store.create(tenant="bench", rpm=10**9, tpm=10**12)
    finally:
        store.close()
    context = None
    if tls:
        cert, _ = ensure_dev_certificate(folder / "tls")  # made here, so the client can trust it at once
        context = ssl.create_default_context(cafile=str(cert))
    port = free_port()
    config = folder / "edge.toml"
    config.write_text(
        f'name = "{name}"\nkeys_db = "{keys_db}"\nledger_db = "{folder / "ledger.sqlite3"}"\n'
        f"[server]\nport = {port}\n"
        f'[tls]\nenabled = {"true" if tls else "false"}\ndev_cert_dir = "{folder / "tls"}"\n'
        "[metrics]\nport = 0\n"
        f'[[regions]]\nname = "pacer"\nurl = "{region_url}"\n'
    )
    process = ManagedProcess(name, nearshore_argv("edge", "--config", str(config)), logs / f"{name}.log")
    process.start()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health", timeout_s=60, context=context)
    except ProcessFailed:
        process.stop()
        raise
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    return Target(name, url, headers, process, context)


NGINX_CONF = """daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream pacer {{
        server {upstream};
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://pacer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def _start_nginx(logs: Path, nginx: str, pacer_url: str) -> Target:
    folder = logs / "nginx"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = folder / "nginx.conf"
    upstream = pacer_url.removeprefix("http://")
    conf.write_text(NGINX_CONF.format(dir=folder, upstream=upstream, port=port))
    argv = [nginx, "-c", str(conf), "-p", str(folder), "-e", str(folder / "nginx-error.log")]
    process = ManagedProcess("nginx", argv, logs / "nginx.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health", timeout_s=30)
    except ProcessFailed:
        process.stop()
        raise
    return Target("nginx", url, {"Content-Type": "application/json"}, process)


LITELLM_CONF = """model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {pacer}/v1
      api_key: x
litellm_settings:
  telemetry: false
general_settings:
  master_key: {master_key}
  disable_spend_logs: true
"""


def _start_litellm(logs: Path, litellm: Path, pacer_url: str) -> Target:
    folder = logs / "litellm"
    folder.mkdir(parents=True, exist_ok=True)
    master_key = "sk-" + secrets.token_hex(32)
    conf = folder / "config.yaml"
    conf.write_text(LITELLM_CONF.format(model=MODEL, pacer=pacer_url, master_key=master_key))
    port = free_port()
    argv = [
        str(litellm),
        "--config",
        str(conf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    env = {
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY_DISABLED": "true",
    }
    process = ManagedProcess("litellm", argv, logs / "litellm.log", env=env).start()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health/liveliness", timeout_s=180)
    except ProcessFailed:
        process.stop()
        raise
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {master_key}"}
    return Target("litellm", url, headers, process)


def _find_nginx(choice: str) -> str | None:
    if choice:
        return shutil.which(choice)
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def _find_litellm(choice: str) -> Path | None:
    path = Path(choice)
    for candidate in (path, REPO / path) if not path.is_absolute() else (path,):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _versions(nginx: str | None, litellm: Path | None) -> dict[str, str]:
    versions = {
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "cpus": str(os.cpu_count()),
    }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if nginx:
            out = subprocess.run([nginx, "-v"], capture_output=True, text=True, timeout=10)
            versions["nginx"] = (out.stderr or out.stdout).strip().split("/")[-1]
        if litellm:
            query = "import importlib.metadata as m; print(m.version('litellm'))"
            out = subprocess.run(
                [str(litellm.parent / "python"), "-c", query], capture_output=True, text=True, timeout=30
            )
            versions["litellm"] = out.stdout.strip()
    return versions


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
        edge_times = [s.edge_s for s in ok if not math.isnan(s.edge_s)]
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
    target: Target,
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
            await _one_stream(session, target, body, expected_tokens, result)

    with contextlib.suppress(TimeoutError):  # unfinished streams keep their "unfinished" error
        async with asyncio.timeout(deadline_s):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _measure(
    target: Target, pacer: ManagedProcess, level: int, count: int, args: argparse.Namespace, sample: Sample
) -> None:
    body = _chat_body(args.tokens)
    waves = math.ceil(count / level) + 1
    deadline_s = 30 + 5 * waves * (args.tokens + 1) * args.interval_ms / 1000
    async with _session(target) as session:
        # One unmeasured wave opens the client's connections (and the proxy's to the pacer).
        await _drive(session, target, body, args.tokens, level, level, deadline_s)
        proxy0, pacer0, client0 = target.cpu_s(), _pid_cpu(pacer), time.process_time()
        started = time.perf_counter()
        sample.streams += await _drive(session, target, body, args.tokens, level, count, deadline_s)
        sample.wall_s += time.perf_counter() - started
        await _quiesce(target)
        sample.proxy_cpu_s += target.cpu_s() - proxy0
        sample.pacer_cpu_s += _pid_cpu(pacer) - pacer0
        sample.client_cpu_s += time.process_time() - client0


async def _quiesce(target: Target, limit_s: float = 5.0) -> None:
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


def _pid_cpu(process: ManagedProcess) -> float:
    return tree_cpu_s(process.proc.pid) if process.proc is not None else 0.0


def idle_cpu(processes: dict[str, ManagedProcess], seconds: float = 3.0) -> dict[str, float]:
    """CPU milliseconds per second each process burns with no load: its timers and health checks, and on
    a virtual machine the cost of waking a cold process, which the per-stream numbers at x1 include."""
    before = {name: _pid_cpu(p) for name, p in processes.items()}
    time.sleep(seconds)
    return {name: (_pid_cpu(p) - before[name]) * 1000 / seconds for name, p in processes.items()}


def run_levels(
    runner: asyncio.Runner, targets: list[Target], pacer: ManagedProcess, args: argparse.Namespace
) -> list[dict]:
    levels = [int(x) for x in args.concurrency.split(",") if x]
    rows: list[dict] = []
    for level in levels:
        total = max(args.streams, args.waves * level)
        per_round = math.ceil(total / args.rounds)
        samples = {t.name: Sample(t.name, level) for t in targets}
        for round_index in range(args.rounds):
            order = targets if round_index % 2 == 0 else targets[::-1]
            for target in order:
                runner.run(_measure(target, pacer, level, per_round, args, samples[target.name]))
        direct = samples["direct"].summary(args.interval_ms / 1000)
        for target in targets:
            row = samples[target.name].summary(args.interval_ms / 1000)
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


# --- part 2: the highest rate one edge process sustains -------------------------------------------------


async def _open_loop(target: Target, session: aiohttp.ClientSession, rate: float, seconds: float) -> dict:
    """Send ``rate`` requests a second for ``seconds``, each on time whatever the others do; latency counts
    from when a request was due, so a proxy that falls behind shows it."""
    body = _chat_body(1)
    count = max(1, round(rate * seconds))
    results = [Stream() for _ in range(count)]
    tasks: list[asyncio.Task] = []
    cpu0 = target.cpu_s()
    start = time.perf_counter() + 0.01
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds + 20):
            for i, result in enumerate(results):
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_one_stream(session, target, body, 1, result, started=due)))
            await asyncio.gather(*tasks)
    for task in tasks:
        task.cancel()
    cpu = target.cpu_s() - cpu0
    ok = [r.e2e_s for r in results if not r.error]
    errors = [r.error for r in results if r.error]
    return {
        "path": target.name,
        "rate": rate,
        "sent": count,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "e2e_p50_ms": percentile(ok, 50) * 1000,
        "e2e_p99_ms": percentile(ok, 99) * 1000,
        "cpu_ms_per_request": cpu * 1000 / count,
    }


async def _ramp(targets: list[Target], args: argparse.Namespace) -> list[dict]:
    """At each rate, direct and then every edge still passing. A failing step is run once more, direct
    included, and fails only if it fails again: one noisy moment on a shared machine is not a limit.
    Stops when every edge has failed, when the direct path fails, or at the time cap."""
    rates = [float(x) for x in args.rps_rates.split(",") if x]
    direct, edges = targets[0], targets[1:]
    sessions = {t.name: _session(t) for t in targets}
    steps: list[dict] = []
    failed: set[str] = set()
    deadline = time.monotonic() + args.rps_budget_s

    async def step(target: Target, rate: float) -> dict:
        base = await _open_loop(direct, sessions[direct.name], rate, args.rps_seconds)
        result = await _open_loop(target, sessions[target.name], rate, args.rps_seconds)
        result["direct_e2e_p99_ms"] = base["e2e_p99_ms"]
        result["direct_errors"] = base["errors"]
        result["p99_overhead_ms"] = result["e2e_p99_ms"] - base["e2e_p99_ms"]
        result["passed"] = not result["errors"] and result["p99_overhead_ms"] < RPS_OVERHEAD_LIMIT_MS
        _print_step(result)
        return result

    try:
        for target in targets:  # open connections (TLS handshakes included) before anything is timed
            async with asyncio.timeout(30):
                await asyncio.gather(
                    *(
                        _one_stream(sessions[target.name], target, _chat_body(1), 1, Stream())
                        for _ in range(32)
                    )
                )
            await _open_loop(target, sessions[target.name], 50, 0.4)
        for rate in rates:
            for target in edges:
                if target.name in failed or time.monotonic() > deadline:
                    continue
                result = await step(target, rate)
                if not result["passed"]:
                    result = await step(target, rate)
                steps.append(result)
                if not result["passed"]:
                    failed.add(target.name)
                if result["direct_errors"]:
                    print(f"  the direct path failed at {rate:.0f}/s: the client or the pacer is the limit")
                    failed.update(t.name for t in edges)
            if failed >= {t.name for t in edges}:
                break
            if time.monotonic() > deadline:
                print(f"  stopped at the time cap ({args.rps_budget_s:g} s)")
                break
    finally:
        for session in sessions.values():
            await session.close()
    return steps


def _print_step(step: dict) -> None:
    print(
        f"  {step['rate']:6.0f}/s {step['path']:>9}: e2e p99 {step['e2e_p99_ms']:7.2f} ms, direct "
        f"{step['direct_e2e_p99_ms']:.2f} (+{step['p99_overhead_ms']:.2f}), {step['errors']} errors, "
        f"CPU {step['cpu_ms_per_request']:.2f} ms/req -> {'ok' if step['passed'] else 'FAILED'}",
        flush=True,
    )


def run_rps(
    runner: asyncio.Runner, logs: Path, args: argparse.Namespace, stack: contextlib.ExitStack
) -> dict:
    pacer, pacer_url = _start_pacer(logs, "pacer-fast", tokens=1, interval_ms=1)
    stack.callback(pacer.stop)
    targets = [Target("direct", pacer_url, {"Content-Type": "application/json"})]
    for name, tls in (("edge-rps", False), ("edge-tls", True)):
        edge = _start_edge(logs, name, pacer_url, tls)
        stack.callback(edge.process.stop)  # type: ignore[union-attr]
        targets.append(edge)
    steps = runner.run(_ramp(targets, args))
    best: dict[str, dict] = {}
    for step in steps:
        if step.get("passed") and step["rate"] > best.get(step["path"], {"rate": 0})["rate"]:
            best[step["path"]] = step
    return {
        "steps": steps,
        "max_rps": {name: best.get(name, {}).get("rate", 0) for name in ("edge-rps", "edge-tls")},
    }


# --- the command ----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,10,50,200", help="stream counts (default 1,10,50,200)")
    parser.add_argument(
        "--streams", type=int, default=200, help="measured streams per path and level (default 200)"
    )
    parser.add_argument(
        "--waves", type=int, default=4, help="at least this many streams per worker and level (default 4)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds per level, paths interleaved (default 2)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="tokens per stream (default 16)")
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="the pacer's gap between tokens (default 20)"
    )
    parser.add_argument("--no-nginx", action="store_true", help="skip nginx")
    parser.add_argument(
        "--nginx", default="", help="nginx binary (default: nginx on PATH, else /usr/sbin/nginx)"
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument(
        "--litellm",
        default=".venv-litellm/bin/litellm",
        help="LiteLLM's CLI, in its own venv (default %(default)s)",
    )
    parser.add_argument(
        "--rps-rates",
        default="100,200,300,400,500,600,800,1000,1200,1600",
        help="request rates to ramp through for the max-RPS part; empty to skip it",
    )
    parser.add_argument("--rps-seconds", type=float, default=2.0, help="seconds at each rate (default 2)")
    parser.add_argument(
        "--rps-budget-s", type=float, default=60.0, help="cap on the ramp's time (default 60)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    parser.add_argument(
        "--logs", default="", help="folder for process logs and configs (default: a temp folder)"
    )


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    logs = Path(args.logs or tempfile.mkdtemp(prefix="nearshore-bench-edge-"))
    logs.mkdir(parents=True, exist_ok=True)
    nginx = None if args.no_nginx else _find_nginx(args.nginx)
    litellm = None if args.no_litellm else _find_litellm(args.litellm)
    notes: list[str] = []
    if not args.no_nginx and nginx is None:
        notes.append("nginx skipped: not found (apt-get install -y nginx)")
    if not args.no_litellm and litellm is None:
        notes.append(
            f"LiteLLM skipped: {args.litellm} not found (python3 -m venv .venv-litellm && "
            ".venv-litellm/bin/pip install 'litellm[proxy]')"
        )
    report: dict = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("run", "func")},
        "environment": _versions(nginx, litellm),
    }
    print(
        f"edge overhead bench: pacer {args.tokens} tokens every {args.interval_ms:g} ms; "
        f"levels {args.concurrency}; {args.rounds} rounds per level, paths interleaved; logs in {logs}",
        flush=True,
    )
    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner, contextlib.ExitStack() as stack:
        pacer, pacer_url = _start_pacer(logs, "pacer", args.tokens, args.interval_ms)
        stack.callback(pacer.stop)
        targets = [Target("direct", pacer_url, {"Content-Type": "application/json"})]
        starters: list[tuple[str, Callable[[], Target]]] = [
            ("edge", lambda: _start_edge(logs, "edge", pacer_url, tls=False))
        ]
        if nginx:
            starters.append(("nginx", lambda: _start_nginx(logs, nginx, pacer_url)))
        if litellm:
            starters.append(("litellm", lambda: _start_litellm(logs, litellm, pacer_url)))
        for name, start in starters:
            try:
                target = start()
            except ProcessFailed as exc:
                if name == "edge":
                    raise
                notes.append(f"{name} skipped: it did not start ({str(exc).splitlines()[0]})")
                continue
            stack.callback(target.process.stop)  # type: ignore[union-attr]
            targets.append(target)
        idle = {"pacer": pacer, **{t.name: t.process for t in targets if t.process is not None}}
        report["idle_cpu_ms_per_s"] = idle_cpu(idle)
        report["streams"] = run_levels(runner, targets, pacer, args)
        stack.close()  # stop the stream part's processes before the ramp
        if args.rps_rates:
            print("max RPS ramp (open loop, 1-token streams from an instant pacer):", flush=True)
            report["rps"] = run_rps(runner, logs, args, stack)
    report["ratios"], report["targets"] = _ratios(report["streams"]), _targets(report["streams"])
    report["notes"], report["logs"] = notes, str(logs)
    report["elapsed_s"] = time.monotonic() - started
    _print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(_finite(report), indent=2, default=str))
    return 0


# --- the report ------------------------------------------------------------------------------------------


def _finite(value: object) -> object:
    """NaN (a number with no samples) becomes null, so the JSON file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _row(rows: list[dict], path: str, level: int) -> dict | None:
    return next((r for r in rows if r["path"] == path and r["concurrency"] == level), None)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def _ratios(rows: list[dict]) -> list[dict]:
    out = []
    for level in sorted({r["concurrency"] for r in rows}):
        edge, nginx, litellm = (_row(rows, p, level) for p in ("edge", "nginx", "litellm"))
        if edge is None:
            continue
        entry: dict = {"concurrency": level}
        for name, peer in (("nginx", nginx), ("litellm", litellm)):
            if peer is None:
                continue
            for metric in (
                "ttft_p50_overhead_ms",
                "e2e_p50_overhead_ms",
                "e2e_p99_overhead_ms",
                "cpu_ms_per_stream",
            ):
                entry[f"edge_over_{name}_{metric}"] = _ratio(edge[metric], peer[metric])
        out.append(entry)
    return out


def _targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, each with the measured number and whether it was met."""
    out = []
    for level in (1, 10):
        edge = _row(rows, "edge", level)
        if edge:
            worst = max(edge["ttft_p50_overhead_ms"], edge["e2e_p50_overhead_ms"])
            out.append({"target": f"overhead p50 < 1 ms at x{level}", "value_ms": worst, "met": worst < 1.0})
    edge, nginx = _row(rows, "edge", 50), _row(rows, "nginx", 50)
    if edge and nginx:
        worst = max(edge["ttft_p50_overhead_ms"], edge["e2e_p50_overhead_ms"])
        floor = max(nginx["ttft_p50_overhead_ms"], nginx["e2e_p50_overhead_ms"])
        ratio = _ratio(worst, floor)
        met = worst <= 3 * max(floor, 0.0)
        out.append(
            {
                "target": "overhead p50 within 3x nginx's at x50",
                "value_ms": worst,
                "nginx_ms": floor,
                "ratio": ratio,
                "met": met,
            }
        )
    edges = [r for r in rows if r["path"] == "edge"]
    for edge in edges:
        cpu = edge["cpu_ms_per_stream"]
        target = f"CPU per streamed request < 3 ms at x{edge['concurrency']}"
        out.append({"target": target, "value_ms": cpu, "met": cpu < 3.0})
    for edge in edges:
        extra = edge["bunched_pct"] - (_row(rows, "direct", edge["concurrency"]) or edge)["bunched_pct"]
        target = f"no bunching at x{edge['concurrency']} (bunched % - direct's < 1)"
        out.append({"target": target, "value_pct": extra, "met": extra < 1.0})
    return out


def _vs(ours: float, theirs: float) -> str:
    ratio = _ratio(ours, theirs)
    return f"{ours:.2f} vs {theirs:.2f} ms ({'n/a' if math.isnan(ratio) else f'{ratio:.1f}x'})"


def _f(value: float, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if value is None or math.isnan(value) else f"{value:{width}.{digits}f}"


def _print_report(report: dict) -> None:
    rows = report["streams"]
    header = (
        f"{'path':>8} {'conc':>4} {'streams':>7} | {'TTFT p50':>8} {'p99':>7} {'e2e p50':>8} {'p99':>7} | "
        f"{'+TTFT p50':>9} {'p99':>6} {'+e2e p50':>8} {'p99':>6} | "
        f"{'tail':>5} {'CPU/str':>7} {'gap p99':>7} {'bunched':>7} {'err':>3}"
    )
    print(
        "\nall times in ms; +X = X minus direct's at the same concurrency; tail = last token -> [DONE], p50;"
        "\nCPU/str = the proxy's CPU per stream; bunched = gaps under a quarter of the pacer's interval"
    )
    print(header + "\n" + "-" * len(header))
    level = None
    for r in rows:
        if level is not None and r["concurrency"] != level:
            print()
        level = r["concurrency"]
        cpu = _f(r["cpu_ms_per_stream"], 7) if r["path"] != "direct" else f"{'-':>7}"
        print(
            f"{r['path']:>8} {r['concurrency']:>4} {r['streams']:>7} | {_f(r['ttft_p50_ms'], 8)} "
            f"{_f(r['ttft_p99_ms'], 7)} {_f(r['e2e_p50_ms'], 8)} {_f(r['e2e_p99_ms'], 7)} | "
            f"{_f(r['ttft_p50_overhead_ms'], 9)} {_f(r['ttft_p99_overhead_ms'], 6)} "
            f"{_f(r['e2e_p50_overhead_ms'], 8)} {_f(r['e2e_p99_overhead_ms'], 6)} | "
            f"{_f(r['tail_p50_ms'], 5)} {cpu} "
            f"{_f(r['gap_p99_ms'], 7)} {_f(r['bunched_pct'], 6, 1)}% {r['errors']:>3}"
        )
    print()
    for entry in report["ratios"]:
        level = entry["concurrency"]
        edge = _row(rows, "edge", level)
        for peer in ("nginx", "litellm"):
            other = _row(rows, peer, level)
            if other is None:
                continue
            parts = [
                f"{label} {_vs(edge[metric], other[metric])}"
                for label, metric in (
                    ("+e2e p50", "e2e_p50_overhead_ms"),
                    ("+TTFT p50", "ttft_p50_overhead_ms"),
                    ("CPU/stream", "cpu_ms_per_stream"),
                )
            ]
            print(f"x{level:<4} edge vs {peer:<7}: " + "; ".join(parts))
    print("\ntargets:")
    for t in report["targets"]:
        if "value_pct" in t:
            value = f"{t['value_pct']:.1f} points"
        elif "nginx_ms" in t:
            value = _vs(t["value_ms"], t["nginx_ms"]) + " nginx's"
        else:
            value = f"{t['value_ms']:.2f} ms"
        print(f"  {t['target']:<48} {value} -> {'met' if t['met'] else 'MISSED'}")
    pacer = ", ".join(
        f"x{r['concurrency']} {r['pacer_cpu_ms_per_stream']:.2f}" for r in rows if r["path"] == "direct"
    )
    print(f"  for scale, the pacer's own CPU per stream, ms: {pacer}")
    own = ", ".join(
        f"x{r['concurrency']} {r['server_timing_edge_p50_ms']:.2f}/{r['server_timing_edge_p99_ms']:.2f}"
        for r in rows
        if r["path"] == "edge"
    )
    print(f"  the edge's own Server-Timing edge;dur (arrival -> forwarded), p50/p99 ms: {own}")
    rps = report.get("rps")
    if rps:
        print(
            f"\nmax RPS of one edge process with p99 overhead < {RPS_OVERHEAD_LIMIT_MS:g} ms and no errors:"
        )
        for name, label in (("edge-rps", "plain HTTP"), ("edge-tls", "TLS")):
            first_fail = next((s for s in rps["steps"] if s["path"] == name and not s.get("passed")), None)
            why = ""
            if first_fail:
                why = (
                    f" (at {first_fail['rate']:.0f}/s: +{first_fail['p99_overhead_ms']:.1f} ms p99, "
                    f"{first_fail['errors']} errors)"
                )
            elif rps["steps"]:
                why = " (no failure within the ramp: the real limit is higher)"
            print(f"  {label:<10} {rps['max_rps'][name]:6.0f}/s{why}")
    idle = ", ".join(f"{k} {v:.1f}" for k, v in report.get("idle_cpu_ms_per_s", {}).items())
    if idle:
        print(f"idle CPU, ms per second with no load: {idle}")
    for note in report["notes"]:
        print(f"note: {note}")
    env = report["environment"]
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"took {report['elapsed_s']:.0f} s; logs: {report['logs']}")


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="nearshore bench edge", description=__doc__.splitlines()[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
