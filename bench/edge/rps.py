"""``bench edge``, part 2: the highest request rate one edge process sustains.

An open-loop rate is ramped at one edge process (plain and TLS) in front of a pacer that answers at once;
the result is the highest rate whose p99 overhead over the direct path stays under 10 ms with no errors.
A failing rate is tried once more before it counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import peers
from bench.edge.request import chat_body, one_stream, session_for
from bench.peers import Endpoint
from harness.client import Stream
from harness.stats import percentile

RPS_OVERHEAD_LIMIT_MS = 10.0


@dataclass(frozen=True)
class Ramp:
    rates: list[float]  # requests per second, in order
    seconds: float  # at each rate
    budget_s: float  # cap on the whole ramp's time


async def _open_loop(target: Endpoint, session: aiohttp.ClientSession, rate: float, seconds: float) -> dict:
    """Send ``rate`` requests a second for ``seconds``, each on time whatever the others do; latency counts
    from when a request was due, so a proxy that falls behind shows it."""
    body = chat_body(1)
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
                tasks.append(asyncio.create_task(one_stream(session, target, body, 1, result, started=due)))
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


async def _ramp(targets: list[Endpoint], ramp: Ramp) -> list[dict]:
    """At each rate, direct and then every edge still passing. A failing step is run once more, direct
    included, and fails only if it fails again: one noisy moment on a shared machine is not a limit.
    Stops when every edge has failed, when the direct path fails, or at the time cap."""
    direct, edges = targets[0], targets[1:]
    sessions = {t.name: session_for(t) for t in targets}
    steps: list[dict] = []
    failed: set[str] = set()
    deadline = time.monotonic() + ramp.budget_s

    async def step(target: Endpoint, rate: float) -> dict:
        base = await _open_loop(direct, sessions[direct.name], rate, ramp.seconds)
        result = await _open_loop(target, sessions[target.name], rate, ramp.seconds)
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
                    *(one_stream(sessions[target.name], target, chat_body(1), 1, Stream()) for _ in range(32))
                )
            await _open_loop(target, sessions[target.name], 50, 0.4)
        for rate in ramp.rates:
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
                print(f"  stopped at the time cap ({ramp.budget_s:g} s)")
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


def run_rps(runner: asyncio.Runner, logs: Path, ramp: Ramp, stack: contextlib.ExitStack) -> dict:
    pacer = peers.start_stand_in(logs, "pacer", "pacer-fast", tokens=1, interval_ms=1)
    stack.callback(pacer.stop)
    targets = [Endpoint("direct", pacer.url, dict(peers.JSON))]
    for name, tls in (("edge-rps", False), ("edge-tls", True)):
        edge = peers.start_edge(logs, name, pacer.url, tls=tls)
        stack.callback(edge.stop)
        targets.append(edge)
    steps = runner.run(_ramp(targets, ramp))
    best: dict[str, dict] = {}
    for step in steps:
        if step.get("passed") and step["rate"] > best.get(step["path"], {"rate": 0})["rate"]:
            best[step["path"]] = step
    return {
        "steps": steps,
        "max_rps": {name: best.get(name, {}).get("rate", 0) for name in ("edge-rps", "edge-tls")},
    }
