"""Where ``bench load`` sends: ``--url`` endpoints (any OpenAI-compatible server) or ``--up`` targets of the
topology ``nearshore up`` is running (its ``state.json``): ``edge`` as the user reaches it (last-mile link,
the printed key, the edge's development certificate), or a region's name for its direct path (last mile and
ocean links, mutual TLS with the cluster CA and the client certificate the launcher issued)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from harness.launcher import RunningTopology
from nearshore.tls import client_context

JSON = {"Content-Type": "application/json"}
MAX_TARGETS = 2  # side by side


@dataclass
class Target:
    name: str
    url: str  # base URL: /v1/chat/completions is added
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool


@dataclass(frozen=True)
class TargetFlags:
    url: list[str]
    api_key: list[str]
    ca: list[str]
    client_cert: str
    client_key: str
    insecure: bool
    up: list[str]
    up_state: str


def _one_per(values: list[str], count: int, flag: str) -> list[str]:
    """One value for every URL, or one per URL in order."""
    if len(values) <= 1:
        return (values or [""]) * count
    if len(values) != count:
        raise ValueError(f"give one {flag} for all --url, or one per --url in the same order")
    return values


def _context(flags: TargetFlags, ca: str) -> ssl.SSLContext | bool:
    if flags.insecure:
        return False
    cert = Path(flags.client_cert) if flags.client_cert else None
    key = Path(flags.client_key) if flags.client_key else None
    if ca or cert:
        return client_context(ca=Path(ca) if ca else None, cert=cert, key=key)
    return True


def _auth(key: str) -> dict[str, str]:
    return {**JSON, "Authorization": f"Bearer {key}"} if key else dict(JSON)


def url_targets(flags: TargetFlags) -> list[Target]:
    count = len(flags.url)
    keys = _one_per(flags.api_key, count, "--api-key")
    cas = _one_per(flags.ca, count, "--ca")
    targets: list[Target] = []
    for n, url in enumerate(flags.url):
        name = urlsplit(url).netloc or url
        if any(t.name == name for t in targets):
            name = f"{name}#{n + 1}"
        base = url.rstrip("/").removesuffix("/v1")
        targets.append(Target(name, base, _auth(keys[n]), _context(flags, cas[n])))
    return targets


def up_targets(flags: TargetFlags) -> list[Target]:
    running = RunningTopology.load(Path(flags.up_state).expanduser() if flags.up_state else None)
    regions = {r.name: r for r in running.regions}
    targets: list[Target] = []
    for name in flags.up:
        if name == "edge":
            context = client_context(ca=Path(running.edge_ca))
            targets.append(Target("edge", running.edge_url, _auth(running.api_key), context))
        elif name in regions:
            cert, key = Path(running.client_cert), Path(running.client_key)
            context = client_context(ca=Path(running.cluster_ca), cert=cert, key=key)
            targets.append(Target(f"{name}-direct", regions[name].direct, dict(JSON), context))
        else:
            known = ", ".join(["edge", *regions])
            raise ValueError(f"--up {name!r}: the running topology {running.name} has {known}")
    return targets


def targets_of(flags: TargetFlags) -> list[Target]:
    targets = url_targets(flags) + (up_targets(flags) if flags.up else [])
    if not targets:
        raise ValueError("give --url (any OpenAI-compatible endpoint) or --up edge / --up REGION")
    if len(targets) > MAX_TARGETS:
        raise ValueError(f"at most {MAX_TARGETS} endpoints side by side")
    return targets
