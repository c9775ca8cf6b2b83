"""Geo-routing's configuration at the edge: a bad GeoIP file or region catalog stops the start, and the
one line it prints names the file and the key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.procs import free_port
from nearshore.children import nearshore_argv
from nearshore.tomlw import dumps

pytestmark = pytest.mark.slow


def _bad_config(folder: Path, name: str, geo: dict[str, object], regions: list[dict[str, object]]) -> Path:
    path = folder / f"{name}.toml"
    config = {
        "keys_db": folder / f"{name}-keys.sqlite3",
        "ledger_db": folder / f"{name}-ledger.sqlite3",
        "server": {"port": free_port()},
        "tls": {"enabled": False},
        "metrics": {"port": 0},
        "geo": geo,
        "regions": regions,
    }
    path.write_text(dumps(config))
    return path


def test_a_bad_geoip_file_or_catalog_stops_the_start_naming_file_and_key(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"
    corrupt = tmp_path / "corrupt.mmdb"
    corrupt.write_bytes(b"not a maxmind database" * 100)
    missing = tmp_path / "no-such.mmdb"
    one = [{"name": "london", "url": url}]
    cases = {
        "missing": ({"database": str(missing)}, one, ["geo.database", str(missing)]),
        "corrupt": ({"database": str(corrupt)}, one, ["geo.database", str(corrupt)]),
        "no-replica": ({}, [{"name": "london", "city": "london"}], ["regions[0] (london): no replica"]),
        "duplicate": ({}, one + one, ["regions[1] (london): the name 'london' is used twice"]),
        "unknown-model": (
            {},
            [{"name": "london", "url": url, "models": ["gpt-9"]}],
            ["regions[0] (london).models: gpt-9 not in the edge's models"],
        ),
        "unknown-region": (
            {"residency": [{"name": "eu", "continents": ["EU"], "regions": ["london", "mars"]}]},
            one,
            ["geo.residency[0] (eu).regions: unknown region 'mars'"],
        ),
    }
    runs = {}
    for name, (geo, regions, _) in cases.items():
        path = _bad_config(tmp_path, name, geo, regions)
        argv = nearshore_argv("edge", "--config", str(path))
        runs[name] = (path, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        for name, (path, proc) in runs.items():
            output = proc.communicate(timeout=60)[0].decode(errors="replace")
            assert proc.returncode == 2, (name, output)  # a config error, not a crash nor a start
            assert "config error" in output and str(path) in output, (name, output)
            for expected in cases[name][2]:
                assert expected in output, (name, output)
    finally:
        for _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
