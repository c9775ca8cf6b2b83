"""The round trip the router routes by is the path's, not the path's plus a connection's handshakes.

The edge's probes of /health time each region's round trip. A probe that has to open its connection (every
warm-up probe, and any probe while streams hold every pooled connection) also waits for TCP's and TLS's
handshakes: counted as a round trip, that made a region look two or three times farther than it is, for
the first seconds after start and again whenever it got busy (issue 9's scenarios: the region serving
Lagos looked farther the more it served, so traffic flapped between London and Johannesburg).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from edge.config import UpstreamConfig
from edge.opened import UpstreamTiming
from edge.upstream import UpstreamPool
from geo.catalog import GeoConfig, RegionSpec
from netem.link import LinkEmulator
from netem.profiles import load_profile
from tests.edge_fixtures import start_pacer


@pytest.mark.slow
async def test_probe_round_trips_leave_out_the_handshakes_of_new_connections(tmp_path: Path):
    pacer = start_pacer(tmp_path, "london")
    host, port = pacer.url.removeprefix("http://").split(":")
    profile = load_profile("lagos-london")  # 50 ms each way
    link = LinkEmulator("edge-london", "127.0.0.1:0", (host, int(port)), profile, seed=1)
    await link.start()
    pool = UpstreamPool(
        [RegionSpec(name="london", url=f"http://127.0.0.1:{link.port}")],
        UpstreamConfig(warm_connections=3, health_interval_s=3600),
        GeoConfig(),
        ["gemma-3-270m"],
    )
    try:
        await pool.start()  # warm-up probes open their connections; one more reuses one
        upstream = pool.upstreams[0]
        assert upstream.pool.idle_connections == 3
        rtt = upstream.replica.latency.rtt
        # One round trip of the link (jitter 2 ms each way, loopback and event-loop time on top), never the
        # two of a connection's first request across the emulated link.
        low, high = profile.rtt_ms * 0.9, profile.rtt_ms * 1.3
        assert rtt.samples == 1 and low < rtt.value < high, rtt
        for _ in range(2):
            await pool.probe(upstream)  # on a warm connection: one round trip each
        assert rtt.samples == 3 and low < rtt.value < high, rtt
    finally:
        await pool.close()
        await link.stop()
        pacer.process.stop()


async def test_a_first_token_teaches_the_router_without_handshakes_or_the_grammar_build(tmp_path: Path):
    pacer = start_pacer(tmp_path, "london")
    pool = UpstreamPool(
        [RegionSpec(name="london", url=pacer.url)],
        UpstreamConfig(warm_connections=1, health_interval_s=3600),
        GeoConfig(),
        ["gemma-3-270m"],
    )
    try:
        await pool.start()
        upstream = pool.upstreams[0]
        stream = {"content-type": "text/event-stream"}

        def head(after_s: float, connect_s: float, headers: dict[str, str]) -> None:
            """A head ``after_s`` after it was forwarded, as the edge's attempt takes it in."""
            response = SimpleNamespace(headers=headers, content_type="text/event-stream", connect_s=connect_s)
            timing = UpstreamTiming(forwarded_at=100.0)
            timing.head_arrived(response, 100.0 + after_s)  # type: ignore[arg-type]
            pool.answered(upstream, response, timing.replica_first_byte_s, "gemma-3-270m")  # type: ignore[arg-type]

        # Its head came 230 ms after it was forwarded, 200 of them opening its connection.
        head(0.23, 0.2, stream)
        ttft = upstream.replica.latency.ttft
        assert ttft.samples == 1 and ttft.value == pytest.approx(30.0)
        head(0.03, 0.0, stream)
        assert ttft.samples == 2 and ttft.value == pytest.approx(30.0)
        # 1.43 s, of which the region says 1.4 s went on building the request's grammar.
        timing = {"server-timing": "tokenize;dur=0.4, grammar;dur=1400.0, queue;dur=0.1, prefill;dur=9"}
        head(1.43, 0.0, {**stream, **timing})
        assert ttft.samples == 3 and ttft.value == pytest.approx(30.0)
    finally:
        await pool.close()
        pacer.process.stop()
