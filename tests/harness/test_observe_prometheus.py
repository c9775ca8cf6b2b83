"""The Prometheus scrape config for the demo topology (configs/prometheus/lagos.yml, issue 12).

`nearshore up` picks free ports, so the launcher writes the run's targets beside a copy of the config: the
targets must be exactly the processes of the topology that expose /metrics, on their ports, and reachable
as Prometheus would reach them (the edge's listener in plain HTTP, each region over TLS trusting the
cluster CA, no client certificate).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

import pytest
import yaml

from edge.metrics_catalog import EDGE_METRICS
from harness.launcher import Launcher, RegionEndpoints, RunningTopology
from harness.scrape_targets import CONFIGS, write_prometheus_folder
from harness.topology import load_topology
from regional.metrics_catalog import REGION_METRICS
from tests.edge.test_observe_metrics import check_exposition

JOBS = {"nearshore-edge", "nearshore-region"}


def jobs(config: Path) -> dict[str, dict]:
    """Each job's scheme, CA and target groups, as Prometheus reads them (paths from the config's folder)."""
    parsed = yaml.safe_load(config.read_text())
    found = {}
    for job in parsed["scrape_configs"]:
        assert "static_configs" not in job, "ports change on every start: targets come from the run"
        groups = []
        for sd in job["file_sd_configs"]:
            for name in sd["files"]:
                groups += json.loads((config.parent / name).read_text())
        ca = job.get("tls_config", {}).get("ca_file")
        found[job["job_name"]] = {
            "scheme": job.get("scheme", "http"),
            "path": job.get("metrics_path", "/metrics"),
            "ca": config.parent / ca if ca else None,
            "groups": groups,
        }
    return found


def fake_run(tmp_path: Path) -> RunningTopology:
    """A running Lagos topology as the launcher records it, each process on a port of its own."""
    topology = load_topology("lagos")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    regions = [
        RegionEndpoints(r.name, f"https://127.0.0.1:{20001 + i}", f"https://127.0.0.1:{21001 + i}", "")
        for i, r in enumerate(topology.regions)
    ]
    return RunningTopology(
        name=topology.name,
        run_dir=str(tmp_path),
        edge_url="https://127.0.0.1:22000",
        edge_local_url="https://127.0.0.1:22001",
        api_key="",
        edge_ca="",
        cluster_ca=str(ca),
        client_cert="",
        client_key="",
        control_url="http://127.0.0.1:22002",
        regions=regions,
        metrics_url="http://127.0.0.1:22003",
    )


def test_lagos_config_targets_the_edge_metrics_listener_and_each_region_node(tmp_path):
    running = fake_run(tmp_path)
    config = write_prometheus_folder(running)
    assert config.read_text() == (CONFIGS / "lagos.yml").read_text()  # the committed file, verbatim
    found = jobs(config)
    assert set(found) == JOBS
    edge, regions = found["nearshore-edge"], found["nearshore-region"]
    assert edge["scheme"] == "http" and edge["path"] == "/metrics"
    assert [t for g in edge["groups"] for t in g["targets"]] == ["127.0.0.1:22003"]  # not the API port
    assert regions["scheme"] == "https" and regions["ca"].read_text() == "-----BEGIN CERTIFICATE-----\n"
    by_region = {g["labels"]["region"]: g["targets"] for g in regions["groups"]}
    # Every region of the topology, on its node's own port (not through an emulated link).
    names = [r.name for r in load_topology("lagos").regions]
    assert list(by_region) == names
    assert list(by_region.values()) == [[f"127.0.0.1:{20001 + i}"] for i in range(len(names))]
    assert all(g["labels"]["topology"] == "lagos" for job in found.values() for g in job["groups"])


def scrape(scheme: str, target: str, path: str, ca: Path | None) -> str:
    context = ssl.create_default_context(cafile=str(ca)) if scheme == "https" else None
    with urllib.request.urlopen(f"{scheme}://{target}{path}", timeout=10, context=context) as response:
        return response.read().decode()


@pytest.mark.slow
def test_a_launched_topology_is_scraped_through_its_written_config(tmp_path):
    topology_file = tmp_path / "lagos-one.toml"
    topology_file.write_text(
        'name = "lagos"\n[user]\ncity = "lagos"\nlink = "lagos-4g"\n[edge]\ncity = "lagos"\n'
        '[[regions]]\nname = "london"\ncity = "london"\nlink = "lagos-london"\n'
    )
    launcher = Launcher(
        load_topology(str(topology_file)),
        tmp_path / "run",
        progress=lambda _line: None,
        engine={"max_sequences": 2, "kv_cache_tokens": 1024, "context_window": 256, "n_threads": 1},
    )
    running = launcher.start()
    try:
        config = Path(running.prometheus_config)
        assert config == tmp_path / "run" / "prometheus" / "lagos.yml"
        found = jobs(config)
        [edge_target] = [t for g in found["nearshore-edge"]["groups"] for t in g["targets"]]
        [region_group] = found["nearshore-region"]["groups"]
        assert region_group["labels"]["region"] == "london"
        assert f"http://{edge_target}" == running.metrics_url
        assert f"https://{region_group['targets'][0]}" == running.regions[0].url
        edge = found["nearshore-edge"]
        check_exposition(scrape(edge["scheme"], edge_target, edge["path"], None), EDGE_METRICS)
        region = found["nearshore-region"]
        text = scrape(region["scheme"], region_group["targets"][0], region["path"], region["ca"])
        check_exposition(text, REGION_METRICS)
    finally:
        launcher.stop()


def test_compose_config_targets_each_compose_service_on_its_configured_port():
    import tomllib

    root = CONFIGS.parents[1]
    compose_dir = root / "deploy" / "compose"
    if not (compose_dir / "lagos.yml").is_file():
        pytest.skip("no compose topology in this checkout")
    compose = yaml.safe_load((compose_dir / "lagos.yml").read_text())
    config = yaml.safe_load((CONFIGS / "compose-lagos.yml").read_text())
    expected: dict[str, dict[str, str]] = {"nearshore-edge": {}, "nearshore-region": {}}
    for service, spec in compose["services"].items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in spec.get("volumes", []) if ":" in v}
        if (edge_toml := mounts.get("/etc/nearshore/edge.toml")) is not None:
            edge = tomllib.loads((compose_dir / edge_toml).read_text())
            expected["nearshore-edge"][f"{service}:{edge['metrics']['port']}"] = ""
        elif (region_toml := mounts.get("/etc/nearshore/region.toml")) is not None:
            region = tomllib.loads((compose_dir / region_toml).read_text())
            assert not region["server"].get("tls_cert"), "a TLS region needs scheme https here"
            expected["nearshore-region"][f"{service}:{region['server']['port']}"] = region["name"]
    for job in config["scrape_configs"]:
        name = job["job_name"]
        targets = {t: g["labels"].get("region", "") for g in job["static_configs"] for t in g["targets"]}
        assert targets == expected[name], name
    assert set(expected["nearshore-region"].values()) == {r.name for r in load_topology("lagos").regions}
