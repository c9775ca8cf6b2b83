"""``lagos-ttft``: how long a user in Lagos waits for the first token, and where the time goes.

(a) direct to London on a new connection: TCP, TLS and the request each cross the last mile and the ocean;
(b) through the Lagos edge: the user's handshakes cross only the last mile, and the edge's warm connection
    crosses the ocean once;
(c) a cache hit at the edge: the same question again, answered in Lagos (the other paths skip the cache);
(d) the floor: one round trip of the emulated Lagos-London link plus the region's own time to first token,
    with the speed-of-light floor for the great-circle distance beside it.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import time
from pathlib import Path
from typing import ClassVar

from harness.launcher import HEALTH_INTERVAL_S
from harness.scenarios.base import ScenarioContext, ScenarioResult
from harness.scenarios.probe import Phases, probe
from nearshore import tls
from netem.geo_floor import floor_rtt_ms
from netem.profiles import load_profile

QUESTION = "Say hello to Lagos."


def link_rtt_ms(profile_name: str) -> float:
    return load_profile(profile_name).rtt_ms


class LagosTtft:
    name: ClassVar[str] = "lagos-ttft"
    description: ClassVar[str] = "time to first token for a Lagos user: direct, through the edge, the floor"
    health_interval_s: ClassVar[float] = HEALTH_INTERVAL_S  # nothing moves: probes only keep pools warm
    phase_names: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: ScenarioContext) -> ScenarioResult:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: ScenarioContext) -> ScenarioResult:
        t, running = ctx.topology, ctx.running
        region = (
            next(r for r in t.regions if r.name == "london")
            if any(r.name == "london" for r in t.regions)
            else t.regions[0]
        )
        endpoints = next(e for e in running.regions if e.name == region.name)
        payload = {
            "model": "gemma-3-270m",
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        }
        direct_ctx = tls.client_context(
            ca=Path(running.cluster_ca), cert=Path(running.client_cert), key=Path(running.client_key)
        )
        edge_ctx = tls.client_context(ca=Path(running.edge_ca))
        cached_auth = {"Authorization": f"Bearer {running.api_key}"}
        auth = {**cached_auth, "Cache-Control": "no-cache, no-store"}  # (b) crosses the ocean every time
        direct: list[Phases] = []
        via_edge: list[Phases] = []
        hits: list[Phases] = []
        await probe(endpoints.direct, "/v1/chat/completions", payload, {}, direct_ctx)  # warm the model
        await probe(running.edge_url, "/v1/chat/completions", payload, auth, edge_ctx)
        await probe(running.edge_url, "/v1/chat/completions", payload, cached_auth, edge_ctx)  # stored
        await self._until_cached(running.edge_url, payload, cached_auth, edge_ctx)
        for _ in range(ctx.repeats):
            direct.append(await probe(endpoints.direct, "/v1/chat/completions", payload, {}, direct_ctx))
            via_edge.append(await probe(running.edge_url, "/v1/chat/completions", payload, auth, edge_ctx))
            hits.append(await probe(running.edge_url, "/v1/chat/completions", payload, cached_auth, edge_ctx))
        for p in direct + via_edge + hits:
            if p.status != 200:
                raise RuntimeError(f"a probe got HTTP {p.status}")

        last_mile = link_rtt_ms(t.user.link)
        ocean = link_rtt_ms(region.link)
        light = floor_rtt_ms(t.user.city, region.city)

        def med(values: list[float]) -> float:
            return statistics.median(values)

        def ms(values: list[float]) -> float:
            return med(values) * 1000

        region_ttft = med([p.server_timing.get("ttft", 0.0) for p in via_edge])
        edge_ms = med([p.server_timing.get("edge", 0.0) for p in via_edge])
        floor = ocean + region_ttft
        expected_edge = floor + 3 * last_mile
        rows = [
            self._row("(a) direct to London, new connection", direct, last_mile + ocean),
            self._row("(b) through the Lagos edge", via_edge, last_mile),
            self._row("(c) cache hit at the edge", hits, last_mile),
            [
                "(d) floor: 1 link RTT + region TTFT",
                f"{floor:.0f}",
                "",
                f"{ocean:.0f}",
                f"{region_ttft:.0f}",
                f"light in fibre: {light:.0f} ms RTT",
            ],
        ]
        through_edge = ms([p.ttft_s for p in via_edge])
        hit_ttft = ms([p.ttft_s for p in hits])
        hit_after_handshakes = ms([p.first_token_s for p in hits])
        direct_ttft = ms([p.ttft_s for p in direct])
        gap = (through_edge - expected_edge) / expected_edge * 100
        crossings = (direct_ttft - region_ttft) / (last_mile + ocean)
        notes = [
            f"Emulated RTTs: last mile ({t.user.link}) {last_mile:.0f} ms, ocean ({region.link}) "
            f"{ocean:.0f} ms; great-circle floor {t.user.city}-{region.city} {light:.0f} ms.",
            f"Through the edge: {through_edge:.0f} ms; floor {floor:.0f} ms + 3 last-mile RTTs "
            f"{3 * last_mile:.0f} ms (TCP, TLS, request) = {expected_edge:.0f} ms expected; "
            f"off by {gap:+.1f}% (edge processing {edge_ms:.1f} ms).",
            f"Direct: {direct_ttft:.0f} ms, {crossings:.1f} round trips of last mile + ocean: "
            "TCP, TLS and the request each cross the ocean.",
            f"Cache hit: {hit_ttft:.0f} ms in all; after its handshakes, the answer's first token took "
            f"{hit_after_handshakes:.0f} ms, against one {t.user.city.title()}-{region.name.title()} round "
            f"trip of {ocean:.0f} ms: it never crossed the ocean.",
            f"Medians of {ctx.repeats} requests each, every one on a new connection. A userspace link "
            "accepts at once and charges TCP's handshake round trip on the connection's first byte, so "
            "'handshakes' holds TCP's and TLS's round trips together.",
        ]
        chart = self._chart(ctx.out_dir, direct, via_edge, floor, light)
        return ScenarioResult(
            title=f"lagos-ttft: time to first token for a user in {t.user.city.title()} (ms)",
            columns=["path", "TTFT", "handshakes", "propagation", "region TTFT", "note"],
            rows=rows,
            notes=notes,
            chart=str(chart),
            data={
                "through_edge_ms": through_edge,
                "direct_ms": direct_ttft,
                "floor_ms": floor,
                "expected_edge_ms": expected_edge,
                "gap_pct": gap,
                "last_mile_rtt_ms": last_mile,
                "ocean_rtt_ms": ocean,
                "light_rtt_ms": light,
                "region_ttft_ms": region_ttft,
                "cache_hit_ms": hit_ttft,
                "cache_hit_after_handshakes_ms": hit_after_handshakes,
                "hits_from_cache": sum("cache" in p.server_timing for p in hits),
                "repeats": ctx.repeats,
            },
        )

    @staticmethod
    async def _until_cached(
        url: str, payload: dict, auth: dict[str, str], context: ssl.SSLContext, wait_s: float = 30.0
    ) -> None:
        """Wait until the edge answers the question from its cache. The answer is stored off the request's
        path, and the first store loads the cache's embedder: until both are done, the edge shares the
        cores with that load and misses, and the first repeats would time the load, not the path."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if "cache" in (await probe(url, "/v1/chat/completions", payload, auth, context)).server_timing:
                return
            await asyncio.sleep(0.25)
        raise RuntimeError(f"the edge did not answer from its cache within {wait_s:g}s of storing the answer")

    @staticmethod
    def _row(label: str, runs: list[Phases], crossing_ms: float) -> list[str]:
        def ms(values: list[float]) -> float:
            return statistics.median(values) * 1000

        ttft = ms([p.ttft_s for p in runs])
        serve = statistics.median([p.server_timing.get("ttft", 0.0) for p in runs])
        propagation = ms([p.first_token_s for p in runs]) - serve
        return [
            label,
            f"{ttft:.0f}",
            f"{ms([p.tcp_s + p.tls_s for p in runs]):.0f}",
            f"{propagation:.0f}",
            f"{serve:.0f}",
            f"= {ttft / crossing_ms:.1f} path RTTs",
        ]

    def _chart(
        self, out_dir: Path, direct: list[Phases], via_edge: list[Phases], floor: float, light: float
    ) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        def parts(runs: list[Phases]) -> list[float]:
            serve = statistics.median([p.server_timing.get("ttft", 0.0) for p in runs])
            first = statistics.median([p.first_token_s for p in runs]) * 1000
            return [statistics.median([p.tcp_s + p.tls_s for p in runs]) * 1000, first - serve, serve]

        labels = ["direct to London", "through the Lagos edge", "floor", "speed of light"]
        serve = parts(via_edge)[2]
        bars = [parts(direct), parts(via_edge), [0, floor - serve, serve], [0, light, 0]]
        names = ["handshakes (TCP + TLS)", "request propagation", "region (queue + prefill)"]
        colours = ["#66c2a5", "#fc8d62", "#e78ac3"]
        fig, ax = plt.subplots(figsize=(9, 3.6))
        for i, (name, colour) in enumerate(zip(names, colours, strict=True)):
            left = [sum(b[:i]) for b in bars]
            ax.barh(labels, [b[i] for b in bars], left=left, color=colour, label=name)
        for y, b in enumerate(bars):
            ax.text(sum(b) + 5, y, f"{sum(b):.0f} ms", va="center")
        ax.invert_yaxis()
        ax.set_xlabel("time to first token (ms), medians")
        ax.set_title("A user in Lagos: time to first token")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "lagos-ttft.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
