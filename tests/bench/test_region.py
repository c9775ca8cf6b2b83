"""``nearshore bench region --schema``: the constrained and free runs alternate on one node, and the node's
own counters give each mode's step time and the grammar's cost per token (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_region_bench_reports_the_grammars_share_of_the_step_from_the_nodes_counters(tmp_path):
    out = tmp_path / "region.json"
    argv = ["bench", "region", "--concurrency", "2", "--max-tokens", "6", "--schema", "--repeats", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "nearshore", *argv, "--no-peer", "--json", str(out), "--logs", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = {row["server"]: row for row in json.loads(out.read_text())}
    free, constrained = rows["nearshore"], rows["nearshore+json"]
    # Both modes decode their whole budget (the schema outlasts it), twice each: they compare step for step.
    assert free["tokens"] == constrained["tokens"] == 2 * 2 * 6 and not free["errors"] + constrained["errors"]
    assert free["step_ms"] > 0 and constrained["step_ms"] > 0
    assert free["grammar_us_per_token"] == 0 and free["grammar_share"] == 0
    assert constrained["grammar_us_per_token"] > 0 and 0 < constrained["grammar_share"] < 1
    assert "of the step time" in result.stdout and "2 pairs" in result.stdout
