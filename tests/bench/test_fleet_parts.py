"""``python -m bench.edge.fleet_parts`` keeps working: a tiny run of two parts over a real PostgreSQL and
Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.edge.fleet_parts import main


@pytest.mark.slow
def test_fleet_parts_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    argv = ["--parts", "alone,all", "--clients", "4", "--seconds", "0.3", "--rounds", "2", "--json", str(out)]
    assert main([*argv, "--logs", str(tmp_path / "logs")]) == 0
    rows = {row["part"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"alone", "all"}
    for row in rows.values():
        assert row["errors"] == 0 and row["rps"] > 0 and row["cpu_ms_per_request"] > 0
    config = (tmp_path / "logs" / "edge-all" / "edge.toml").read_text()
    assert 'backend = "redis"' in config and 'backend = "postgres"' in config
