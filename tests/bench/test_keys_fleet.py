"""``nearshore bench keys`` keeps working: a tiny run over both key stores (PostgreSQL and SQLite)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cli.bench import add_keys_arguments, run_keys


@pytest.mark.slow
def test_bench_keys_tiny_run_measures_both_stores(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_keys_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(
        [
            "--edges",
            "2",
            "--rounds",
            "2",
            "--requests",
            "5",
            "--json",
            str(out),
            "--logs",
            str(tmp_path / "logs"),
        ]
    )
    assert run_keys(args) == 0
    report = json.loads(out.read_text())
    assert [b["backend"] for b in report["backends"]] == ["postgres", "sqlite"]
    for backend in report["backends"]:
        assert backend["samples"] == 4  # every edge's stream of every revoked key was ended by its edge
        for part in ("create_seen_ms", "rpm_lowered_held_ms", "revoke_ended_stream_ms", "request_ms"):
            assert set(backend[part]) == {"p50", "p99", "max"} and backend[part]["p50"] > 0
