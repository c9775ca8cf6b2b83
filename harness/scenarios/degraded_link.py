"""``degraded-link``: the Lagos-London link goes bad and gets better. Do new requests leave London within
seconds, come back once it recovers, and never flap or fail on the way?

Clients in Lagos stream steadily through the edge (an open loop, ``traffic.SteadyLoad``). The edge's link to
London is changed live through the links' control API, phase by phase:

    baseline   the link as its profile says (London is the nearest region: ~100 ms RTT)
    spike      +200 ms each way: London is now ~500 ms away, farther than Johannesburg or Virginia
    calm       the profile again
    loss       25% of chunks lost each way (a lost chunk arrives one retransmission timeout late)
    recovery   the profile again

A spike and a loss burst each move traffic away from London and a calm phase brings it back, so every move
is timed. Per phase: seconds until traffic was where it should be for good, requests per region, TTFT
p50/p95 (the user's, through the last mile), requests failed before their first byte (target 0), streams
cut mid-answer, and flaps: region changes beyond the one the phase needs (target 0).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import aiohttp

from harness.scenarios.base import ScenarioContext, ScenarioResult, check_phases
from harness.scenarios.charts import traffic_chart
from harness.scenarios.traffic import (
    CUT_MID_STREAM,
    FAILED_BEFORE_FIRST_BYTE,
    Attempt,
    SteadyLoad,
    explored,
    flaps,
    in_window,
    moved_after_s,
    ms,
    per_region,
    percentile_ms,
    seconds,
    until,
)
from harness.topology import nearest_region
from netem.profiles import load_profile

SPIKE_MS = 200.0  # added one way, each way
LOSS = 0.25  # share of chunks lost, each way
RATE_PER_S = 2.0  # requests of MAX_TOKENS: well within one region's CPU on a 2-core machine
MAX_TOKENS = 12
PHASE_S = 8.0  # each phase goes on this long once traffic is where it belongs (``--phase-s``)
# A phase whose traffic has not moved within this many phase lengths (and at least MIN_MOVE_S) ends anyway.
MOVE_PHASES = 5
MIN_MOVE_S = 30.0
WARMUP_PROBES = 3  # a few probes and requests before anything is measured


@dataclass(frozen=True)
class Phase:
    name: str
    change: str  # "profile" | "spike" | "loss": what the link becomes
    on_target: bool  # where traffic belongs: on the degraded region (True) or away from it

    def belongs(self, region: str, target: str) -> bool:
        """Whether a request served by ``region`` is where this phase's traffic belongs."""
        return (region == target) == self.on_target


PHASES = (
    Phase("baseline", "profile", True),
    Phase("spike", "spike", False),
    Phase("calm", "profile", True),
    Phase("loss", "loss", False),
    Phase("recovery", "profile", True),
)


class DegradedLink:
    name: ClassVar[str] = "degraded-link"
    description: ClassVar[str] = (
        "a latency spike, then a loss burst on Lagos-London: new requests move away and come back"
    )
    health_interval_s: ClassVar[float] = 1.0  # the edge's probes: how soon it sees a link change
    phase_names: ClassVar[tuple[str, ...]] = tuple(p.name for p in PHASES)

    def run(self, ctx: ScenarioContext) -> ScenarioResult:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: ScenarioContext) -> ScenarioResult:
        nearest = nearest_region(ctx.topology)  # London, in the Lagos topology
        target, profile = nearest.name, load_profile(nearest.link)
        link_url = f"{ctx.running.control_url}/links/edge-{target}"
        phase_s = ctx.phase_s or PHASE_S
        max_move_s = max(MIN_MOVE_S, MOVE_PHASES * phase_s)
        check_phases(self, ctx.phases)
        phases = [p for p in PHASES if p.name in ctx.phases] if ctx.phases else list(PHASES)
        load = SteadyLoad(ctx.running, rate_per_s=RATE_PER_S, max_tokens=MAX_TOKENS)
        bodies = {
            "profile": [{"profile": profile.name}],
            "spike": [
                {"direction": way, "delay_ms": profile.way(way).delay_ms + SPIKE_MS}
                for way in ("a_to_b", "b_to_a")
            ],
            "loss": [{"loss": {"model": "bernoulli", "p": LOSS}}],
        }
        windows: list[tuple[str, float, float]] = []
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as control:

            async def drive() -> None:
                try:
                    # Warm up, and start from where traffic belongs: the target, the nearest region.
                    begun = time.perf_counter()
                    await asyncio.sleep(WARMUP_PROBES * self.health_interval_s)
                    await until(lambda: load.settled(begun, lambda r: r == target), max_move_s)
                    for phase in phases:
                        for body in bodies[phase.change]:
                            async with control.put(link_url, json=body) as response:
                                response.raise_for_status()
                        started = time.perf_counter()

                        # Until traffic is where it belongs (or it is clear it will not get there) ...
                        good = partial(phase.belongs, target=target)
                        await until(partial(load.settled, started, good), max_move_s)
                        # ... then long enough to see whether it stays there.
                        await asyncio.sleep(phase_s)
                        windows.append((phase.name, started, time.perf_counter()))
                finally:
                    stop.set()

            await asyncio.gather(drive(), load.run(stop))
        return self._result(ctx, target, phases, load.attempts, windows, phase_s, max_move_s)

    def _result(
        self,
        ctx: ScenarioContext,
        target: str,
        phases: list[Phase],
        attempts: list[Attempt],
        windows: list[tuple[str, float, float]],
        phase_s: float,
        max_move_s: float,
    ) -> ScenarioResult:
        warmup = [a for a in attempts if a.started < windows[0][1]]
        attempts = [a for a in attempts if a.started >= windows[0][1]]
        rows, phases_data = [], []
        last_region = max((a for a in warmup if a.served), key=lambda a: a.started, default=Attempt(0)).region
        for phase, (name, start, end) in zip(phases, windows, strict=True):
            group = in_window(attempts, start, end)
            served = [a for a in group if a.served]
            ttfts = [a.ttft_s for a in served]
            good = partial(phase.belongs, target=target)
            moved = None if phase.name == "baseline" else moved_after_s(group, start, good)
            on_target = sum(1 for a in served if good(a.region))
            figures = {
                "phase": name,
                "seconds": end - start,
                "moved_s": moved,
                "requests": len(group),
                "per_region": per_region(group),
                "where_it_should_be": on_target,
                "ttft_p50_ms": percentile_ms(ttfts, 50),
                "ttft_p95_ms": percentile_ms(ttfts, 95),
                "failed_before_first_byte": sum(a.outcome == FAILED_BEFORE_FIRST_BYTE for a in group),
                "cut_mid_stream": sum(a.outcome == CUT_MID_STREAM for a in group),
                "flaps": flaps(last_region, group),
                "explorations": sum(1 for a in served if explored(a)),
            }
            phases_data.append(figures)
            if served:
                last_region = max(served, key=lambda a: a.started).region
            rows.append(
                [
                    name,
                    "-" if phase.name == "baseline" else seconds(moved),
                    str(len(group)),
                    ", ".join(f"{r} {n}" for r, n in figures["per_region"].items()) or "-",
                    ms(figures["ttft_p50_ms"]),
                    ms(figures["ttft_p95_ms"]),
                    str(figures["failed_before_first_byte"]),
                    str(figures["cut_mid_stream"]),
                    str(figures["flaps"]),
                ]
            )
        t0 = min(a.started for a in attempts)
        chart = traffic_chart(
            ctx.out_dir / f"{self.name}.png",
            attempts,
            t0,
            windows,
            f"degraded-link: the edge's link to {target} (spike +{SPIKE_MS:.0f} ms each way, "
            f"then {LOSS:.0%} loss)",
        )
        failed = sum(p["failed_before_first_byte"] for p in phases_data)
        total_flaps = sum(p["flaps"] for p in phases_data)
        notes = [
            f"Link edge-{target}: spike = +{SPIKE_MS:.0f} ms each way; loss = {LOSS:.0%} of chunks each way "
            "(a lost chunk arrives 200 ms late, as a retransmission would); the other phases restore its "
            "profile.",
            f"{RATE_PER_S:g} requests/s from Lagos through the edge ({len(attempts)} in all, after "
            f"{len(warmup)} to warm up); each phase lasts until traffic is where it belongs (at most "
            f"{max_move_s:.0f}s), then {phase_s:g}s more; the edge probes every {self.health_interval_s:g}s.",
            "moved: seconds from the change until every later request was served where it should be (away "
            f"from {target} in spike and loss, back on {target} after); flaps: region changes beyond the "
            "one a phase needs, not counting explorations (one request sent to a region whose figures went "
            "stale, to measure it again).",
            f"Failed before the first byte: {failed} (target 0); flaps: {total_flaps} (target 0); "
            f"explorations: {sum(p['explorations'] for p in phases_data)}.",
        ]
        return ScenarioResult(
            title=f"degraded-link: the Lagos edge's link to {target} degrades and recovers",
            columns=[
                "phase",
                "moved (s)",
                "requests",
                "served by",
                "TTFT p50 ms",
                "TTFT p95 ms",
                "failed before 1st byte",
                "cut mid-stream",
                "flaps",
            ],
            rows=rows,
            notes=notes,
            chart=str(chart),
            data={
                "target": target,
                "phases": phases_data,
                "failed_before_first_byte": failed,
                "flaps": total_flaps,
                "requests": len(attempts),
                "attempts": [a.row(t0) for a in attempts],
            },
        )
