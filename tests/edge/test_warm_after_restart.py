"""A region that restarts gets its warm connections back from the edge's probes, before users need them.

The edge opens ``warm_connections`` to every replica at start. A region that restarted had lost them all,
and only the probe's own connection came back: the first requests after its return each opened one, paying
the TCP and TLS handshakes (one to three round trips across an ocean) on top of their first token. The
router measured those first answers as the region's speed and sent its traffic away again (the
region-outage scenario's traffic came back after 18-22 s in two runs of four, and not at all in one CI run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from edge.config import UpstreamConfig
from edge.upstream import UpstreamPool
from geo.catalog import GeoConfig, RegionSpec
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv

WARM = 3


def pacer_on(port: int, folder: Path, log_name: str) -> ManagedProcess:
    argv = nearshore_argv("pacer", "--port", str(port), "--name", "london")
    process = ManagedProcess("london", argv, folder / log_name).start()
    process.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
    return process


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s:g} s: {what}") from None


@pytest.mark.slow
async def test_a_restarted_region_gets_its_warm_connections_back_from_the_probes(tmp_path: Path):
    port = free_port()
    process = pacer_on(port, tmp_path, "first.log")
    pool = UpstreamPool(
        [RegionSpec(name="london", url=f"http://127.0.0.1:{port}")],
        UpstreamConfig(warm_connections=WARM, health_interval_s=0.1),
        GeoConfig(),
        ["gemma-3-270m"],
    )
    try:
        await pool.start()
        upstream = pool.upstreams[0]
        health = upstream.replica.health
        assert upstream.pool.idle_connections == WARM
        process.stop()  # every connection it held goes with it
        await until(lambda: not health.probed_up, "the probes see it down")
        await until(lambda: upstream.pool.idle_connections == 0, "its connections are gone")
        process = pacer_on(port, tmp_path, "second.log")
        await until(lambda: health.probed_up, "the probes see it up")
        # Before any request: the spares are open again (the old code kept the probe's one alone).
        await until(lambda: upstream.pool.idle_connections >= WARM, "the spares are back")
    finally:
        await pool.close()
        process.stop()
