"""``region-outage``: London dies under load. How long until users are served from elsewhere, and did any
request that had not started streaming fail?

Clients in Lagos keep streaming through the edge; partway through, the London node is killed (SIGKILL,
no goodbye). Requests already streaming from London may end with an error event (the edge never switches
region after the first byte); every request that had not started must be served by the next region.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import aiohttp

from nearshore import tls
from netem.bench.client import Stream, stream_once
from netem.scenarios.base import ScenarioContext, ScenarioResult

CLIENTS = 4
BEFORE_S = 6.0
AFTER_S = 10.0


@dataclass
class Attempt:
    started: float
    region: str = ""
    ttft_s: float = 0.0
    outcome: str = "pending"  # ok | failed-before-first-byte | failed-mid-stream


class RegionOutage:
    name: ClassVar[str] = "region-outage"
    description: ClassVar[str] = "kill the first region under load; failover time and failed requests"

    def run(self, ctx: ScenarioContext) -> ScenarioResult:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: ScenarioContext) -> ScenarioResult:
        running = ctx.running
        victim = ctx.topology.regions[0].name
        attempts: list[Attempt] = []
        stop_at = time.perf_counter() + BEFORE_S + AFTER_S
        connector = aiohttp.TCPConnector(ssl=tls.client_context(ca=Path(running.edge_ca)), limit=0)
        payload = {
            "model": "gemma-3-270m",
            "messages": [{"role": "user", "content": "Tell me about Lagos."}],
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
        }
        body = json.dumps(payload).encode()
        headers = {"Authorization": f"Bearer {running.api_key}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=connector) as session:

            async def client() -> None:
                while time.perf_counter() < stop_at:
                    attempt = Attempt(time.perf_counter())
                    attempts.append(attempt)
                    await self._one(session, running.edge_url, body, headers, attempt)

            killed_at = 0.0

            async def killer() -> None:
                nonlocal killed_at
                await asyncio.sleep(BEFORE_S)
                process = ctx.launcher.by_name[f"region-{victim}"]
                assert process.proc is not None
                process.proc.send_signal(signal.SIGKILL)
                killed_at = time.perf_counter()

            await asyncio.gather(killer(), *(client() for _ in range(CLIENTS)))
        return self._result(ctx, victim, attempts, killed_at)

    @staticmethod
    async def _one(
        session: aiohttp.ClientSession, url: str, body: bytes, headers: dict, attempt: Attempt
    ) -> None:
        url += "/v1/chat/completions"
        answer = await stream_once(session, url, body, headers, Stream(), started=attempt.started)
        attempt.region, attempt.ttft_s = answer.region, answer.ttft_s
        if not answer.tokens:
            attempt.outcome = "failed-before-first-byte"
        else:
            attempt.outcome = "failed-mid-stream" if answer.error else "ok"

    def _result(
        self, ctx: ScenarioContext, victim: str, attempts: list[Attempt], killed_at: float
    ) -> ScenarioResult:
        before = [a for a in attempts if a.started < killed_at]
        after = [a for a in attempts if a.started >= killed_at]
        in_flight = [a for a in before if a.outcome != "ok" or a.started + a.ttft_s >= killed_at]
        recovered = sorted(a.started + a.ttft_s for a in after if a.outcome == "ok")
        failover_s = (recovered[0] - killed_at) if recovered else float("nan")

        def count(group: list[Attempt], outcome: str) -> int:
            return sum(1 for a in group if a.outcome == outcome)

        def ttft(group: list[Attempt]) -> str:
            values = [a.ttft_s * 1000 for a in group if a.outcome == "ok"]
            return f"{statistics.median(values):.0f}" if values else "-"

        regions = lambda group: ", ".join(sorted({a.region for a in group if a.region}))  # noqa: E731
        rows = [
            [
                "before the kill",
                len(before),
                count(before, "ok"),
                count(before, "failed-before-first-byte"),
                count(before, "failed-mid-stream"),
                ttft(before),
                regions(before),
            ],
            [
                "after the kill",
                len(after),
                count(after, "ok"),
                count(after, "failed-before-first-byte"),
                count(after, "failed-mid-stream"),
                ttft(after),
                regions(after),
            ],
        ]
        not_started_failed = count(attempts, "failed-before-first-byte")
        notes = [
            f"{victim} was killed {BEFORE_S:.0f}s into the run; {CLIENTS} clients kept streaming for "
            f"{AFTER_S:.0f}s more.",
            f"Failover: the first answer from another region reached a user {failover_s * 1000:.0f} ms after "
            "the kill.",
            f"Requests that had not started streaming and failed: {not_started_failed} (the goal is 0); "
            f"requests cut mid-stream: {count(attempts, 'failed-mid-stream')} of {len(in_flight)} in flight "
            "at the kill (the edge never switches region after the first byte).",
        ]
        chart = self._chart(ctx.out_dir, attempts, killed_at)
        return ScenarioResult(
            title=f"region-outage: {victim} dies under load",
            columns=[
                "phase",
                "requests",
                "ok",
                "failed before first byte",
                "cut mid-stream",
                "TTFT p50 ms",
                "served by",
            ],
            rows=[[str(v) for v in row] for row in rows],
            notes=notes,
            chart=str(chart),
            data={
                "failover_ms": failover_s * 1000,
                "failed_before_first_byte": not_started_failed,
                "cut_mid_stream": count(attempts, "failed-mid-stream"),
                "requests": len(attempts),
            },
        )

    @staticmethod
    def _chart(out_dir: Path, attempts: list[Attempt], killed_at: float) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t0 = min(a.started for a in attempts)
        fig, ax = plt.subplots(figsize=(9, 3.6))
        colours = {}
        for a in attempts:
            if a.outcome == "ok":
                colour = colours.setdefault(a.region, f"C{len(colours)}")
                ax.scatter(a.started - t0, a.ttft_s * 1000, s=14, color=colour, label=a.region)
            else:
                ax.scatter(a.started - t0, 0, s=30, marker="x", color="red", label=a.outcome)
        ax.axvline(killed_at - t0, color="black", linestyle="--", label="region killed")
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=False))
        ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left")
        ax.set_xlabel("request start (s)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_title("Region outage: who served each request")
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "region-outage.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
