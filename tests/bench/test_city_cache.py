"""``python -m bench.cache.city`` keeps working: a tiny run (a lone edge beside two sharing one cache
through a real Redis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cache.city import main


@pytest.mark.slow
def test_city_cache_bench_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "city.json"
    assert main(["--questions", "3", "--json", str(out), "--logs", str(tmp_path / "logs")]) == 0
    report = json.loads(out.read_text())
    assert report["hits_each"] == 9  # three rounds of three exact repeats, on each side
    for part in ("hit_lone_ms", "hit_shared_ms", "follow_ms"):
        assert report[part]["p50"] > 0
