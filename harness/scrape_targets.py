"""Prometheus targets for a running topology: its ports change on every start, so the launcher writes them.

The scrape config (``configs/prometheus/<topology>.yml``, or ``lagos.yml`` for a topology without its own)
is copied into ``<run_dir>/prometheus/`` beside what it reads: ``targets/edge.json`` and
``targets/regions.json`` (Prometheus' file-based service discovery) and ``cluster-ca.pem``. Every process
that exposes ``/metrics`` is a target: the edge's operator listener and each regional node (never through
an emulated link: monitoring is not what the user's traffic feels).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "prometheus"
DEFAULT_CONFIG = "lagos.yml"


class _Region(Protocol):
    name: str
    url: str  # the node itself, no emulated link


class RunningTopology(Protocol):
    """What this module reads of :class:`harness.launcher.RunningTopology` (which calls it)."""

    name: str
    run_dir: str
    metrics_url: str
    cluster_ca: str

    @property
    def regions(self) -> Sequence[_Region]: ...


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return f"{parts.hostname}:{parts.port}"


def scrape_targets(running: RunningTopology) -> dict[str, list[dict[str, object]]]:
    """File-SD target groups by file name: the edge's metrics listener and each region's node."""
    topology = {"topology": running.name}
    edge = [
        {"targets": [_host_port(running.metrics_url)], "labels": {**topology, "edge": f"{running.name}-edge"}}
    ]
    regions = [
        {"targets": [_host_port(r.url)], "labels": {**topology, "region": r.name}} for r in running.regions
    ]
    return {"edge.json": edge, "regions.json": regions}


def scrape_config_for(topology: str) -> Path:
    own = CONFIGS / f"{topology}.yml"
    return own if own.is_file() else CONFIGS / DEFAULT_CONFIG


def write_prometheus_folder(running: RunningTopology) -> Path:
    """Write the run's Prometheus folder; returns the config file to start Prometheus with."""
    folder = Path(running.run_dir) / "prometheus"
    (folder / "targets").mkdir(parents=True, exist_ok=True)
    config = folder / f"{running.name}.yml"
    shutil.copyfile(scrape_config_for(running.name), config)
    shutil.copyfile(running.cluster_ca, folder / "cluster-ca.pem")
    for name, groups in scrape_targets(running).items():
        target = folder / "targets" / name
        partial = target.with_suffix(".tmp")  # Prometheus watches the file: never let it read half of one
        partial.write_text(json.dumps(groups, indent=2) + "\n")
        partial.replace(target)
    return config
