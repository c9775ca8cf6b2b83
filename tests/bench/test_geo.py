"""``nearshore bench geo`` keeps working: a tiny run over two catalog sizes, its report and its JSON."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from bench.geo.route import CITIES, make_catalog, make_router
from cli.bench import add_geo_arguments, run_geo
from geo.catalog import GeoConfig, check_catalog


def test_catalogs_are_real_cities_jittered_and_valid() -> None:
    rng = random.Random(1)
    specs = make_catalog(100, rng)
    assert len({s.name for s in specs}) == 100 and check_catalog(specs, GeoConfig(), ["gemma-3-270m"]) == []
    for spec, (_, lat, lon, country, _) in zip(specs, CITIES * 3, strict=False):
        assert abs(spec.latitude - lat) <= 0.5 and abs(spec.longitude - lon) <= 0.5
        assert spec.country == country
    router = make_router(10, rng)
    assert len(router.replicas) > 10  # some regions have two replicas
    assert all(r.latency.measured for r in router.replicas)


def test_bench_geo_tiny_run(tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    add_geo_arguments(parser)
    out = tmp_path / "geo.json"
    args = parser.parse_args(
        ["--sizes", "3,10", "--requests", "300", "--working-set", "50", "--json", str(out)]
    )
    assert run_geo(args) == 0
    printed = capsys.readouterr().out
    assert "client_address + locate" in printed and "lookup + decision < 50 us p99 at 10 regions" in printed
    report = json.loads(out.read_text())
    assert [t["phase"] for t in report["locate"]] == ["hit", "miss"]
    sizes = {t["num_regions"]: t for t in report["sizes"]}
    assert set(sizes) == {3, 10}
    for t in sizes.values():
        assert t["num_requests"] == 300 and t["num_replicas"] >= t["num_regions"]
        assert 0 < t["decision_p50_us"] <= t["decision_p99_us"]
        assert 0 < t["lookup_p50_us"] <= t["lookup_p99_us"]
        assert t["total_p50_us"] <= t["total_p99_us"] <= t["total_max_us"]
        assert t["refused"] < t["num_requests"] // 10  # the made-up catalogs serve nearly everyone
    assert report["target"]["value_us"] == sizes[10]["total_p99_us"]
