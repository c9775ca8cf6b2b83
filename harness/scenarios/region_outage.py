"""``region-outage``: the region serving Lagos dies under load, then comes back. How long until the edge
takes it out and users are served from elsewhere, did any request fail, and how long until it is back?

Clients in Lagos stream steadily through the edge (``traffic.SteadyLoad``). Once the edge's round trips
have settled, the region serving them (London: the nearest) is killed (SIGKILL, no goodbye). Every request
that had not started streaming must be served by another region (target: 0 failed before the first byte);
a stream already under way when its region died is either continued by another region or cut (target 0).
Then the region's node is started again, and the edge must let it back in and send traffic to it again.

Timings come from the edge's operator ``/health`` (each region's status as the router sees it, sampled
every 100 ms: ``up``, ``down (...)`` after failed probes, ``ejected ...`` after failed requests) and from
the requests themselves.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from harness.scenarios.base import ScenarioContext, ScenarioResult
from harness.scenarios.charts import traffic_chart
from harness.scenarios.traffic import (
    CUT_MID_STREAM,
    FAILED_BEFORE_FIRST_BYTE,
    OK,
    Attempt,
    HealthWatch,
    SteadyLoad,
    in_window,
    moved_after_s,
    ms,
    one_request,
    per_region,
    percentile_ms,
    seconds,
    until,
)
from harness.topology import nearest_region

__all__ = ["Attempt", "RegionOutage"]

RATE_PER_S = 2.0
MAX_TOKENS = 24  # about a second of streaming each: a few streams are under way at the kill
PHASE_S = 8.0  # traffic before the kill, and after each step has settled (``--phase-s``)
WARMUP_PROBES = 3  # a few probes and requests before anything is measured
MAX_WAIT_S = 40.0  # for the edge to take the region out, or to let it back in


class RegionOutage:
    name: ClassVar[str] = "region-outage"
    description: ClassVar[str] = (
        "kill the serving region under load, then restart it: ejection, failover, cut streams, recovery"
    )
    health_interval_s: ClassVar[float] = 1.0
    phase_names: ClassVar[tuple[str, ...]] = ()

    # One request and its verdict (tests call it on scripted servers).
    _one = staticmethod(one_request)

    def run(self, ctx: ScenarioContext) -> ScenarioResult:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: ScenarioContext) -> ScenarioResult:
        phase_s = ctx.phase_s or PHASE_S
        load = SteadyLoad(ctx.running, rate_per_s=RATE_PER_S, max_tokens=MAX_TOKENS)
        watch = HealthWatch(ctx.running.metrics_url)
        stop = asyncio.Event()
        marks: dict[str, float] = {}
        victim = nearest_region(ctx.topology).name

        async def drive() -> None:
            nonlocal victim
            try:
                # Warm up, and start from where traffic belongs at rest: the nearest region.
                begun = time.perf_counter()
                await asyncio.sleep(WARMUP_PROBES * self.health_interval_s)
                await until(lambda: load.settled(begun, lambda r: r == victim), MAX_WAIT_S)
                marks["start"] = time.perf_counter()
                await asyncio.sleep(phase_s)
                victim = _serving(load.attempts) or victim  # the one serving Lagos now
                ctx.launcher.kill_region(victim)
                marks["kill"] = time.perf_counter()
                await until(lambda: _status(watch, victim) not in ("up", "loading"), MAX_WAIT_S)
                await until(lambda: load.settled(marks["kill"], lambda r: r != victim), MAX_WAIT_S)
                await asyncio.sleep(phase_s)
                marks["restart"] = time.perf_counter()
                ctx.launcher.restart_region(victim)
                await asyncio.to_thread(ctx.launcher.wait_region, victim)
                marks["ready"] = time.perf_counter()
                await until(lambda: _status(watch, victim) == "up", MAX_WAIT_S)
                await until(lambda: load.settled(marks["restart"], lambda r: r == victim), MAX_WAIT_S)
                await asyncio.sleep(phase_s)
                marks["end"] = time.perf_counter()
            finally:
                marks.setdefault("end", time.perf_counter())
                stop.set()

        await asyncio.gather(drive(), load.run(stop), watch.run(stop))
        return self._result(ctx, victim, load.attempts, watch, marks)

    def _result(
        self,
        ctx: ScenarioContext,
        victim: str,
        attempts: list[Attempt],
        watch: HealthWatch,
        marks: dict[str, float],
    ) -> ScenarioResult:
        start, kill, restart, end = marks["start"], marks["kill"], marks["restart"], marks["end"]
        attempts = [a for a in attempts if a.started >= start]
        ejected_at = watch.first(kill, victim, lambda s: s not in ("up", "loading"))
        back_at = watch.first(marks["ready"], victim, lambda s: s == "up")
        not_victim = lambda region: region != victim  # noqa: E731
        moved = moved_after_s(in_window(attempts, kill, restart), kill, not_victim)
        returned = moved_after_s(in_window(attempts, restart, end), restart, lambda r: r == victim)
        # Streams under way at the kill: sent before it, first token before it, not ended before it.
        in_flight = [
            a
            for a in attempts
            if a.started < kill and a.served and a.started + a.ttft_s < kill and a.ended > kill
        ]
        failovers = sorted(a.started + a.ttft_s for a in in_window(attempts, kill, restart) if a.served)
        first_answer_ms = (failovers[0] - kill) * 1000 if failovers else float("nan")
        phases = [
            ("before the kill", start, kill),
            ("after the kill", kill, restart),
            ("after the restart", restart, end),
        ]
        rows, phase_data = [], []
        for label, a, b in phases:
            group = in_window(attempts, a, b)
            ttfts = [x.ttft_s for x in group if x.served]
            figures = {
                "phase": label,
                "requests": len(group),
                "ok": sum(x.outcome == OK for x in group),
                "failed_before_first_byte": sum(x.outcome == FAILED_BEFORE_FIRST_BYTE for x in group),
                "cut_mid_stream": sum(x.outcome == CUT_MID_STREAM for x in group),
                "ttft_p50_ms": percentile_ms(ttfts, 50),
                "ttft_p95_ms": percentile_ms(ttfts, 95),
                "per_region": per_region(group),
            }
            phase_data.append(figures)
            rows.append(
                [
                    label,
                    str(figures["requests"]),
                    str(figures["ok"]),
                    str(figures["failed_before_first_byte"]),
                    str(figures["cut_mid_stream"]),
                    ms(figures["ttft_p50_ms"]),
                    ms(figures["ttft_p95_ms"]),
                    ", ".join(f"{r} {n}" for r, n in figures["per_region"].items()) or "-",
                ]
            )
        failed = sum(p["failed_before_first_byte"] for p in phase_data)
        cut = [a for a in in_flight if a.outcome == CUT_MID_STREAM]
        data = {
            "victim": victim,
            "ejected_after_s": _since(ejected_at, kill),
            "status_at_ejection": _status_at(watch, victim, ejected_at),
            "moved_after_s": moved,
            "first_answer_elsewhere_ms": first_answer_ms,
            "failed_before_first_byte": failed,
            "in_flight_at_kill": len(in_flight),
            "cut_mid_stream": len(cut),
            "continued": len(in_flight) - len(cut),
            "restart_ready_after_s": marks["ready"] - restart,
            "routable_again_after_s": _since(back_at, restart),
            "traffic_back_after_s": returned,
            "phases": phase_data,
            "requests": len(attempts),
            "attempts": [a.row(start) for a in attempts],
        }
        ready_s = data["restart_ready_after_s"]
        notes = [
            f"{victim} was killed (SIGKILL) after {kill - start:.0f}s of {RATE_PER_S:g} requests/s from "
            f"Lagos, then started again {restart - kill:.0f}s later; the edge probes every "
            f"{self.health_interval_s:g}s.",
            f"After the kill: taken out at the edge {_after(data['ejected_after_s'])} (its /health: "
            f"{data['status_at_ejection']!r}); traffic moved {_after(moved)}; the first answer from "
            f"elsewhere reached a user after {ms(first_answer_ms)} ms.",
            f"Failed before the first byte: {failed} (target 0). Streams under way at the kill: "
            f"{len(in_flight)}; cut mid-answer: {len(cut)} (target 0), completed: {data['continued']}.",
            f"After the restart: the node was ready after {ready_s:.1f}s, routable at the edge "
            f"{_after(data['routable_again_after_s'])}, traffic back on {victim} {_after(returned)}.",
        ]
        chart = traffic_chart(
            ctx.out_dir / f"{self.name}.png",
            attempts,
            start,
            phases,
            f"region-outage: {victim} killed under load, then restarted",
            events=[("killed", kill), ("restarted", restart)]
            + ([("taken out", ejected_at)] if ejected_at else [])
            + ([("routable", back_at)] if back_at else []),
        )
        return ScenarioResult(
            title=f"region-outage: {victim} dies under load and comes back",
            columns=[
                "phase",
                "requests",
                "ok",
                "failed before 1st byte",
                "cut mid-stream",
                "TTFT p50 ms",
                "TTFT p95 ms",
                "served by",
            ],
            rows=rows,
            notes=notes,
            chart=str(chart),
            data=data,
        )


def _after(value: float | None) -> str:
    text = seconds(value)
    return "never" if text == "never" else f"after {text}s"


def _serving(attempts: list[Attempt]) -> str:
    """The region that served the latest request whose answer has started."""
    served = [a for a in attempts if a.region and a.outcome != FAILED_BEFORE_FIRST_BYTE]
    return served[-1].region if served else ""


def _status(watch: HealthWatch, region: str) -> str:
    return watch.samples[-1][1].get(region, "") if watch.samples else ""


def _status_at(watch: HealthWatch, region: str, at: float | None) -> str:
    return next((s.get(region, "") for t, s in watch.samples if t == at), "")


def _since(at: float | None, since: float) -> float | None:
    return None if at is None else at - since
