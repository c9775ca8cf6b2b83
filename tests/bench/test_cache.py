"""``nearshore bench cache`` at toy sizes: every part runs and reports, a filled folder is reused, and
through a real edge (over the pacer) stored questions and their paraphrases come from the cache while
misses go to the region, with and without a cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main


@pytest.mark.slow  # loads the embedding model, starts an edge and the pacer
def test_bench_cache_at_toy_sizes_reports_every_part(tmp_path: Path, capsys):
    argv = ["bench", "cache", "--sizes", "400", "--queries", "20", "--small-partitions", "30"]
    argv += ["--rows-per-partition", "3", "--peers", "", "--peer-sizes", "400", "--work-dir", str(tmp_path)]
    argv += [
        "--ttft-rows",
        "400",
        "--ttft-requests",
        "3",
        "--rtt-ms",
        "100",
        "--no-audit",  # the edges start with the live audit off (the default audits: tests/edge)
        "--json",
        str(tmp_path / "r.json"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    size = report["sizes"][0]
    assert size["rows"] == 400 and size["index"] == "full scan" and size["lookups"] == 20
    assert size["fill_s"] is not None and size["vector_bytes_per_entry"] == 384 * 4 + 16
    assert report["small_partitions"]["partitions"] == 30
    methods = [r["method"] for r in report["index_comparison"][0]["results"]]
    assert methods == ["numpy brute force", "numpy IVF (the store's)"]
    kinds = report["ttft"]["kinds"]
    assert kinds["exact hit"]["answered_by_cache"] == 3 and kinds["semantic hit"]["answered_by_cache"] == 3
    assert kinds["semantic hit, fp32 embedder"]["answered_by_cache"] == 3
    assert kinds["miss, cache on"]["answered_by_cache"] == 0 and kinds["miss, cache off"]["errors"] == 0
    assert kinds["exact hit"]["ttft_p50_ms"] < 100 <= kinds["miss, cache off"]["ttft_p50_ms"]
    assert set(kinds["huge question"]) == {"bytes", "repeats", "cache on", "cache off"}
    cost = kinds["miss cost"]  # the rounds' pairs, and the edge's own time before forwarding beside them
    assert cost["pairs"] == 3 and cost["ttft_median_ci95_ms"][0] <= cost["ttft_median_ms"]
    assert kinds["miss, cache on"]["edge_p50_ms"] > 0 and cost["edge_median_ms"] is not None
    assert "TTFT through an edge" in out and "the index at 400 rows" in out
    assert "what the cache adds to a miss (3 pairs)" in out
    assert report["ttft"]["audit"] is False and "no semantic hit audited" in out
    # A second run reuses the filled folder.
    assert (
        main([*argv[:-2], "--ttft-rows", "0", "--small-partitions", "0", "--json", str(tmp_path / "r2.json")])
        == 0
    )
    assert json.loads((tmp_path / "r2.json").read_text())["sizes"][0]["fill_s"] is None


def test_the_miss_cost_is_read_from_each_rounds_pair():
    """Drift that moves both misses of a round alike leaves the paired cost alone; a failed stream drops
    its round."""
    from bench.cache.ttft import paired_cost
    from harness.client import Stream

    def stream(ttft_ms: float, edge_ms: float, status: int = 200) -> Stream:
        return Stream(status=status, ttft_s=ttft_ms / 1e3, server_timing_ms={"edge": edge_ms}, error="")

    drift = [100.0, 140.0, 103.0, 180.0, 101.0]
    on = [stream(d + 0.3, 1.0) for d in drift] + [stream(500.0, 1.0, status=503)]
    off = [stream(d, 0.8) for d in drift] + [stream(100.0, 0.8)]
    cost = paired_cost(on, off)
    assert cost["pairs"] == 5
    assert cost["ttft_median_ms"] == pytest.approx(0.3)
    assert cost["ttft_median_ci95_ms"] == pytest.approx([0.3, 0.3])
    assert cost["edge_median_ms"] == pytest.approx(0.2)
    assert paired_cost([stream(1, 1, status=503)], [stream(1, 1)]) == {"pairs": 0}
