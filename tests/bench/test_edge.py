"""``nearshore bench edge`` keeps working: a tiny run, direct and through the edge (plain and TLS), with
its route stage off beside it, an edge in fleet mode (a real PostgreSQL and Redis) and an edge with TLS on
beside it, the bare Python relay (the runtime's floor) and the edge's frame without its stages."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cli.bench import add_edge_arguments, run_edge


@pytest.mark.slow
def test_bench_edge_tiny_run(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_edge_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(
        [
            "--concurrency", "2",
            "--streams", "4",
            "--waves", "1",
            "--rounds", "1",
            "--tokens", "4",
            "--interval-ms", "10",
            "--no-nginx",
            "--floor",
            "--no-litellm",
            "--rps-rates", "20",
            "--rps-seconds", "0.5",
            "--unary-concurrency", "4",
            "--unary-seconds", "0.5",
            "--routing", "on,off",
            "--fleet",
            "--tls",
            "--json", str(out),
            "--logs", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    assert run_edge(args) == 0
    report = json.loads(out.read_text())

    rows = {row["path"]: row for row in report["streams"]}
    # the edge with its route stage, without, in fleet mode, and with TLS on
    # floor: the bare relay; frame: aiohttp, the edge's pool and SSE relay, no stages; lean: the frame on the
    # lean server core (edge/h1_server.py)
    assert set(rows) == {"direct", "edge", "edge-off", "edge-fleet", "edge-https", "floor", "frame", "lean"}
    for row in rows.values():
        assert row["errors"] == 0, row["first_error"]
        assert row["streams"] == 4
        assert row["ttft_p50_ms"] >= 10  # the pacer's first token takes one interval
    assert all(rows[path]["cpu_ms_per_stream"] > 0 for path in ("edge", "floor", "frame", "lean"))
    assert any(t["target"].startswith("no bunching") for t in report["targets"])
    throughput = {row["path"]: row for row in report["throughput"]}
    assert set(throughput) == {
        "direct",
        "edge-unary",
        "edge-unary-off",
        "edge-unary-fleet",
        "edge-unary-https",
        "floor",
        "frame",
        "lean",
    }  # no nginx
    unary = ("edge-unary", "edge-unary-off", "edge-unary-fleet", "edge-unary-https", "floor", "frame", "lean")
    for path in unary:
        assert throughput[path]["rps"] > 0 and throughput[path]["errors"] == 0
    routing = {entry["part"]: entry for entry in report["routing"]}
    assert set(routing) == {"streams x2", "non-streamed"}
    assert all(e["cpu_ms_on"] > 0 and e["cpu_ms_off"] > 0 for e in routing.values())
    fleet = {entry["part"]: entry for entry in report["fleet"]}
    assert set(fleet) == {"streams x2", "non-streamed"}
    assert all(e["cpu_ms_on"] > 0 and e["cpu_ms_off"] > 0 for e in fleet.values())
    tls = {entry["part"]: entry for entry in report["tls"]}
    assert set(tls) == {"streams x2", "non-streamed"}
    assert all(e["cpu_ms_on"] > 0 and e["cpu_ms_off"] > 0 for e in tls.values())
    assert "enabled = true" in (tmp_path / "logs" / "edge-https" / "edge.toml").read_text()
    config = (tmp_path / "logs" / "edge-fleet" / "edge.toml").read_text()
    assert 'backend = "postgres"' in config and "share_redis_url" in config  # its key lives in PostgreSQL

    steps = report["rps"]["steps"]
    assert {s["path"] for s in steps} == {"edge-rps", "edge-tls"}
    assert all(s["errors"] == 0 and s["direct_errors"] == 0 for s in steps), steps
