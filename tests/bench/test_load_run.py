"""``nearshore bench load`` end to end: a real edge (TLS, keys, limits, response cache) over a real pacer,
and the pacer itself beside it, loaded by the CLI in its own process."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from nearshore.children import nearshore_argv
from tests.edge_fixtures import start_edge, start_pacer

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
LATENCY_FIELDS = {"count", "mean", "p50", "p90", "p95", "p99"}


def _bench(*flags: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    argv = nearshore_argv("bench", "load", *flags)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, check=False)


@pytest.mark.slow
def test_sweep_and_closed_loop_against_an_edge_and_its_pacer_side_by_side(tmp_path):
    pacer = start_pacer(tmp_path, name="pacer", tokens=6, interval_ms=10)
    edge = start_edge(tmp_path / "edge", [("pacer", pacer.url)], cache={"store_truncated": True})
    edge.extra.append(pacer.process)
    try:
        key = edge.new_key(rpm=100_000, tpm=10_000_000)
        out = tmp_path / "load.json"
        charts = tmp_path / "charts"
        done = _bench(
            "--url", edge.url, "--url", pacer.url, "--api-key", key, "--ca", str(edge.ca),
            "--rates", "2,5", "--seconds", "3", "--concurrency", "2",
            "--repeat-share", "0.3", "--paraphrase-share", "0.2", "--output-tokens", "fixed:6",
            "--slo", "ttft=2s,itl=1s", "--prices", str(REPO / "configs" / "edge.toml"),
            "--ceiling-s", "1", "--json", str(out), "--charts", str(charts), "--logs", str(tmp_path / "logs"),
            "--seed", "1",  # arrivals: 13 and 16 at 5 rps (a random draw is below 6 about one run in 200)
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "generator ceiling" in done.stdout and "knee" in done.stdout
        assert "sent" in done.stderr and "in flight" in done.stderr  # the progress line
        report = json.loads(out.read_text())
        edge_name, pacer_name = edge.url.split("//")[1], pacer.url.split("//")[1]
        steps = report["steps"]
        assert [(s["endpoint"], s["step"]) for s in steps] == [
            (name, step) for step in ("2 rps", "5 rps", "closed 2") for name in (edge_name, pacer_name)
        ]
        for s in steps:
            assert s["ok"] == s["sent"] > 0, s
            assert s["errors"] == {} and s["refused"] == {}
            for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
                assert set(s[metric]) == LATENCY_FIELDS and s[metric]["p99"] > 0
            assert s["ttft_ms"]["p50"] > 0 and s["e2e_ms"]["p50"] > 0  # (a cache hit's gaps can be 0)
            assert s["request_rps"] > 0 and s["output_tokens_per_s"] > 0
            assert 0 < s["goodput_rps"] <= s["request_rps"] + 1e-9
            assert s["usd_per_million_tokens"] > 0
        # open loop: each endpoint got about its rate (3 s at 5 rps: 15 expected)
        five = [s for s in steps if s["step"] == "5 rps"]
        assert all(6 <= s["sent"] <= 30 for s in five)
        # the edge answers from its cache the repeats and paraphrases; the pacer has no cache header
        edge_cache = {k: sum(s["cache"].get(k, 0) for s in steps if s["endpoint"] == edge_name) for k in
                      ("HIT", "SEMANTIC", "MISS")}  # fmt: skip
        assert edge_cache["MISS"] > 0 and edge_cache["HIT"] > 0, edge_cache
        assert all(set(s["cache"]) == {"none"} for s in steps if s["endpoint"] == pacer_name)
        assert report["ceiling"]["requests_per_s"] > 50 and report["ceiling"]["errors"] == 0
        assert set(report["knee_rps"]) == {edge_name, pacer_name}
        assert report["settings"]["api_key"] == ["<set>"] and key not in out.read_text()
        written = sorted(p.name for p in charts.iterdir())
        assert written == ["goodput_vs_rate.png", "latency_cdf.png", "over_time.png"]
        assert all((charts / name).read_bytes().startswith(PNG) for name in written)
    finally:
        edge.stop()


@pytest.mark.slow
def test_refusals_are_counted_and_a_soak_reports_growth(tmp_path):
    """A key allowed 3 requests a minute, loaded at 6 rps: the edge's 429s are counted as refusals, not
    errors; the soak samples the edge's and pacer's memory and descriptors."""
    pacer = start_pacer(tmp_path, name="pacer", tokens=4, interval_ms=5)
    edge = start_edge(tmp_path / "edge", [("pacer", pacer.url)])
    edge.extra.append(pacer.process)
    try:
        key = edge.new_key(rpm=3)
        out = tmp_path / "soak.json"
        done = _bench(
            "--url", edge.url, "--api-key", key, "--ca", str(edge.ca), "--rate", "6", "--soak", "4s",
            "--sample-s", "0.5", "--pid", f"edge={edge.process.proc.pid}", "--pid",
            f"pacer={pacer.process.proc.pid}", "--ceiling-s", "0", "--json", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(out.read_text())
        assert report["ceiling"] is None
        (step,) = report["steps"]
        assert step["step"] == "soak 6 rps"
        assert step["refused"].get("429", 0) >= step["sent"] - 4 > 0, step
        assert 1 <= step["ok"] <= 4 and step["errors"] == {}
        growth = {g["name"]: g for g in report["soak"]}
        assert set(growth) == {"edge", "pacer"}
        for g in growth.values():
            assert g["samples"] >= 6 and g["rss_first_mib"] > 10 and g["fds_first"] > 3
            assert not math.isnan(g["rss_slope_mib_per_h"]) and not g["exited"]
        assert "soak: growth" in done.stdout
    finally:
        edge.stop()


@pytest.mark.slow
def test_bad_flags_are_a_usage_error():
    done = _bench("--url", "http://127.0.0.1:9", "--rates", "1,-1", "--ceiling-s", "0", timeout_s=60)
    assert done.returncode == 2 and "rates must be positive" in done.stderr
    done = _bench("--url", "http://127.0.0.1:9", "--ceiling-s", "0", timeout_s=60)
    assert done.returncode == 2 and "--rate, --rates or --concurrency" in done.stderr


@pytest.mark.slow
def test_up_targets_read_the_running_topology(tmp_path):
    """``--up edge --up REGION``: the edge with the topology's key and certificate, the region's direct path
    with the cluster's client certificate, as `nearshore up`'s state.json lists them."""
    from nearshore import tls

    pacer = start_pacer(tmp_path, name="r1", tokens=3, interval_ms=5)
    edge = start_edge(tmp_path / "edge", [("r1", pacer.url)])
    edge.extra.append(pacer.process)
    try:
        ca_dir = tmp_path / "pki" / "ca"
        tls.create_cluster_ca(ca_dir)
        cert, key = tls.issue_certificate(ca_dir, "edge", tmp_path / "pki" / "certs", client=True)
        region = {"name": "r1", "url": pacer.url, "via_edge_link": pacer.url, "direct": pacer.url}
        state = {
            "name": "test", "run_dir": str(tmp_path), "edge_url": edge.url, "edge_local_url": edge.url,
            "api_key": edge.new_key(rpm=10_000), "edge_ca": str(edge.ca),
            "cluster_ca": str(ca_dir / "ca.pem"),
            "client_cert": str(cert), "client_key": str(key), "control_url": "", "regions": [region],
            "pids": [edge.process.proc.pid, pacer.process.proc.pid],
        }  # fmt: skip
        (tmp_path / "state.json").write_text(json.dumps(state))
        out = tmp_path / "up.json"
        done = _bench(
            "--up", "edge", "--up", "r1", "--up-state", str(tmp_path / "state.json"), "--concurrency", "1",
            "--seconds", "1", "--ceiling-s", "0", "--json", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        steps = json.loads(out.read_text())["steps"]
        assert [s["endpoint"] for s in steps] == ["edge", "r1-direct"]
        assert all(s["ok"] == s["sent"] > 0 for s in steps), steps
        done = _bench(
            "--up", "nowhere", "--up-state", str(tmp_path / "state.json"), "--rate", "1", "--ceiling-s", "0"
        )
        assert done.returncode == 2 and "has edge, r1" in done.stderr
    finally:
        edge.stop()
