"""``bench edge``'s side-by-side arithmetic (bench/edge/paired.py, report.py): an edge beside the same edge
with one thing changed, nginx with TLS beside nginx without, and the edge against nginx with TLS on both."""

from __future__ import annotations

import pytest

from bench.edge import paired, report


def row(path: str, level: int, cpu_ms: float, ttft_ms: float = 10.0) -> dict:
    return {
        "path": path,
        "concurrency": level,
        "cpu_ms_per_stream": cpu_ms,
        "ttft_p50_ms": ttft_ms,
        "ttft_p99_ms": ttft_ms + 1,
        "e2e_p50_ms": ttft_ms + 20,
    }


ROWS = [
    row("edge", 10, 2.0),
    row("edge-https", 10, 3.0, 11.0),
    row("nginx", 10, 0.5),
    row("nginx-https", 10, 0.8),
]
THROUGHPUT = [
    {"path": "edge-unary", "cpu_ms_per_request": 0.4, "rps": 2000.0},
    {"path": "edge-unary-https", "cpu_ms_per_request": 0.5, "rps": 1600.0},
    {"path": "nginx", "cpu_ms_per_request": 0.04, "rps": 8000.0},
    {"path": "nginx-https", "cpu_ms_per_request": 0.05, "rps": 6400.0},
]


def test_an_edge_with_tls_is_compared_with_the_edge_without_per_stream_and_per_request():
    entries = {e["part"]: e for e in paired.compare(ROWS, THROUGHPUT, "edge-https", "edge")}
    assert set(entries) == {"streams x10", "non-streamed"}
    assert entries["streams x10"]["added_us"] == pytest.approx(1000.0)
    assert entries["streams x10"]["added_pct"] == pytest.approx(50.0)
    assert entries["streams x10"]["ttft_p50_added_ms"] == pytest.approx(1.0)
    assert entries["non-streamed"]["rps"] == [1600.0, 2000.0]


def test_a_peer_keeps_its_name_in_the_non_streamed_part():
    assert paired.unary_path("edge-fleet") == "edge-unary-fleet"
    assert paired.unary_path("nginx-https") == "nginx-https"
    entries = {e["part"]: e for e in paired.compare(ROWS, THROUGHPUT, "nginx-https", "nginx")}
    assert entries["non-streamed"]["added_us"] == pytest.approx(10.0)
    assert paired.compare(ROWS, None, "edge-off", "edge") == []  # a path that did not run: nothing


def test_with_tls_on_both_the_edge_is_set_against_nginx(capsys: pytest.CaptureFixture[str]):
    report.print_tls_ratios(ROWS, THROUGHPUT)
    line = capsys.readouterr().out
    assert "x10 3.00 vs 0.80 ms (3.8x)" in line
    assert "non-streamed requests/s 0.25x nginx's" in line
    report.print_tls_ratios(ROWS[:1], None)  # no TLS paths ran: no line
    assert capsys.readouterr().out == ""


def test_on_a_step_clock_the_targets_leave_ttft_out_and_keep_cpu_and_throughput():
    rows = [
        {**row("edge", level, 2.0), "ttft_p50_overhead_ms": 0.1, "bunched_pct": 0.0} for level in (1, 10, 50)
    ] + [{**row("nginx", level, 0.5), "bunched_pct": 0.0} for level in (1, 10, 50)]
    own_clock = {t["target"] for t in report.targets(rows, THROUGHPUT)}
    on_steps = {t["target"] for t in report.targets(rows, THROUGHPUT, ttft=False)}
    assert {t for t in own_clock if t.startswith("+TTFT")} == {
        "+TTFT p50 < 0.5 ms at x1",
        "+TTFT p50 < 3 ms at x50",
    }
    assert on_steps == {t for t in own_clock if not t.startswith("+TTFT")}
    assert "CPU per streamed request within 2x nginx's at x10" in on_steps
    assert "non-streamed throughput at least half of nginx's" in on_steps
