"""The deployment files against what the harness runs: deploy/compose's edge serves the Lagos topology as
`nearshore up`'s launcher writes its edge config."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from edge.billing import Price
from harness.launcher import RegionEndpoints, catalog
from harness.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]


def test_the_compose_edge_serves_the_topology_as_the_launcher_writes_it():
    """deploy/compose's edge.toml and `nearshore up`'s edge config name the same models, prices, size alias
    and regions (each region's models, pool and local), so the two cannot drift apart."""
    topology = load_topology("lagos")
    written = catalog(topology, [RegionEndpoints(r.name, "", "", "") for r in topology.regions])
    compose = tomllib.loads((ROOT / "deploy" / "compose" / "config" / "edge.toml").read_text())
    assert compose["models"] == written["models"]
    assert compose["aliases"] == written["aliases"]

    def prices(table: dict) -> dict:
        return {model: msgspec.convert(price, Price) for model, price in table.items()}

    assert prices(compose["prices"]) == prices(written["prices"])
    fields = ("name", "city", "models", "pool", "local")
    assert [{k: r[k] for k in fields} for r in compose["regions"]] == [
        {k: r[k] for k in fields} for r in written["regions"]
    ]
