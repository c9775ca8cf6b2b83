"""Bring a topology up as real processes behind emulated links, and take it down without orphans.

Order: a cluster CA and certificates; the regional nodes (mutual TLS: they serve only the edge); one
process holding every emulated link; the edge (HTTPS with a development certificate), whose warm pools
then cross the links. Besides the links the topology needs, a "direct" path per region chains the user's
last mile and the ocean link, so a scenario can compare a user calling a region without the edge.

The edge's catalog places each region in its topology city, so the edge routes as it would in the field:
to the region it expects to answer first (probed round trip, never below the fibre floor, and load). Its
probe interval is the launcher's ``health_interval_s``: scenarios that move traffic shorten it.

Every child dies with the launcher (a parent-death signal, see ``harness.procs``), and each run is
recorded so that the next one stops anything a killed run left behind (``harness.leftovers``).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec

from edge.config import DATA_DIR, EMBEDDING_MODEL, EMBEDDING_PRICE
from edge.keys import KeyStore
from harness.leftovers import RunRecord, stop_orphans
from harness.models import LARGE, MODELS, SMALL
from harness.procs import ManagedProcess, ProcessFailed, free_port
from harness.scrape_targets import write_prometheus_folder
from harness.topology import Topology, serves
from nearshore import tls, tomlw
from nearshore.children import nearshore_argv

RUNS = DATA_DIR / "runs"
CURRENT = RUNS / "current.json"
HOST = "127.0.0.1"
# How often the edge probes each region (`nearshore up`, the demo): traffic does not move there, so probes
# only keep the pools warm and the round trips current. Scenarios that move traffic pass a shorter one.
LINK_PORT_TRIES = 3
HEALTH_INTERVAL_S = 2.0
# The children nothing can be served without (every user path crosses both); regions can fail over.
ESSENTIAL = frozenset({"links", "edge"})


@dataclass
class RegionEndpoints:
    name: str
    url: str  # the node itself, no emulated link
    via_edge_link: str  # what the edge dials: the edge -> region link
    direct: str  # user -> region without the edge: last mile + ocean links chained


@dataclass
class RunningTopology:
    """What a client needs to talk to a running topology; also written to ``state.json``."""

    name: str
    run_dir: str
    edge_url: str  # as the user reaches it: through the last-mile link
    edge_local_url: str  # the edge itself, no link
    api_key: str
    edge_ca: str  # the edge's development certificate, to trust
    cluster_ca: str
    client_cert: str  # a certificate regions accept (for the direct path)
    client_key: str
    control_url: str  # the links' control API
    regions: list[RegionEndpoints] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    metrics_url: str = ""  # the edge's operator listener: /metrics and /health (loopback, plain HTTP)
    prometheus_config: str = ""  # a scrape config for this run's ports (harness.scrape_targets)
    # What `nearshore chat` and the demo ask: the instruction-tuned model where the topology serves it.
    chat_model: str = LARGE

    def save(self) -> Path:
        path = Path(self.run_dir) / "state.json"
        path.write_text(json.dumps(asdict(self), indent=2))
        RUNS.mkdir(parents=True, exist_ok=True)
        CURRENT.write_text(json.dumps({"state": str(path)}))
        return path

    @classmethod
    def load(cls, path: Path | None = None) -> RunningTopology:
        if path is None:
            if not CURRENT.exists():
                raise FileNotFoundError("no topology is running: start one with `nearshore up`")
            path = Path(json.loads(CURRENT.read_text())["state"])
        data = json.loads(path.read_text())
        data["regions"] = [RegionEndpoints(**r) for r in data["regions"]]
        return cls(**data)


class Launcher:
    def __init__(
        self,
        topology: Topology,
        run_dir: Path,
        progress: Callable[[str], None] = print,
        engine: dict[str, object] | None = None,
        seed: int = 1,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.topology = topology
        self.run_dir = run_dir
        self.progress = progress
        # The regions share this machine's cores: each gets its share, so that two regions decoding at once
        # do not oversubscribe them (llama.cpp's threads meet at a barrier every step: one thread the OS
        # gave to another region stalls its whole step).
        threads = max(1, (os.cpu_count() or 1) // len(topology.regions))
        self.engine = {
            "max_sequences": 8,
            "kv_cache_tokens": 8192,
            "context_window": 2048,
            "n_threads": threads,
            # Nor does each build the grammar engine's vocabulary before it is ready (1.7 s of CPU for Gemma,
            # five regions on this machine's cores): a region's first structured request builds it.
            "grammar_vocabulary": "first_use",
            **(engine or {}),
        }
        self.seed = seed
        self.health_interval_s = health_interval_s
        self.processes: list[ManagedProcess] = []
        self.by_name: dict[str, ManagedProcess] = {}
        self.record: RunRecord | None = None
        self.running: RunningTopology | None = None  # once started: what state.json says
        self._region_context: ssl.SSLContext | None = None  # the edge's client certificate, for readiness
        self._region_ports: dict[str, int] = {}

    def start(self) -> RunningTopology:
        """Start everything; on any failure, stop what was started and re-raise."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.record is not None:
            self.record.remove()
        if CURRENT.exists():
            try:
                if json.loads(CURRENT.read_text())["state"].startswith(str(self.run_dir)):
                    CURRENT.unlink()
            except (OSError, ValueError, KeyError):
                pass

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.run_dir / "logs" / f"{name}.log").start()
        self.processes.append(process)
        self.by_name[name] = process
        if self.record is not None and process.proc is not None:
            self.record.add(process.proc.pid)
        return process

    def _start_links(self, t: Topology, ports: dict[str, int]) -> tuple[int, int, list[RegionEndpoints], str]:
        """Start the links process on freshly picked ports: the edge's port behind the user's link, the
        user's side of that link, each region's endpoints, the control API's URL."""
        edge_port, control_port = free_port(), free_port()
        links: list[tuple[str, int, int, str]] = [("user-edge", free_port(), edge_port, t.user.link)]
        endpoints = []
        for region in t.regions:
            via, hop, direct = free_port(), free_port(), free_port()
            links.append((f"edge-{region.name}", via, ports[region.name], region.link))
            links.append((f"direct-{region.name}-lastmile", direct, hop, t.user.link))
            links.append((f"direct-{region.name}-ocean", hop, ports[region.name], region.link))
            endpoints.append(
                RegionEndpoints(
                    region.name,
                    f"https://{HOST}:{ports[region.name]}",
                    f"https://{HOST}:{via}",
                    f"https://{HOST}:{direct}",
                )
            )
        argv = ["link", "--control", f"{HOST}:{control_port}", "--seed", str(self.seed)]
        for name, listen, target, profile in links:
            argv += ["--link", f"{name}={HOST}:{listen}->{HOST}:{target}@{profile}"]
        self.progress(
            f"[2/4] {len(links)} emulated links ({t.user.link}, {', '.join(r.link for r in t.regions)}) ..."
        )
        control_url = f"http://{HOST}:{control_port}"
        self._spawn("links", nearshore_argv(*argv)).wait_http(control_url + "/links", timeout_s=30)

        return edge_port, links[0][1], endpoints, control_url

    def _start(self) -> RunningTopology:
        t = self.topology
        started = time.monotonic()
        # Stopped rather than refused: their supervisor is dead, so nothing else would ever stop them.
        orphans = stop_orphans()
        if orphans:
            pids = ", ".join(map(str, orphans))
            self.progress(f"stopped {len(orphans)} process(es) left by a run whose launcher died: {pids}")
        self.record = RunRecord(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pki = self.run_dir / "pki"
        ca_dir, certs = pki / "ca", pki / "certs"
        if not (ca_dir / "ca.pem").exists():
            tls.create_cluster_ca(ca_dir, f"Nearshore {t.name} cluster CA")
        edge_cert, edge_key = tls.issue_certificate(ca_dir, "edge", certs, client=True)
        ca = ca_dir / "ca.pem"

        # 1. Regions, all loading at once.
        ports = {r.name: free_port() for r in t.regions}
        models = ", ".join(dict.fromkeys(r.model for r in t.regions))
        self.progress(f"[1/4] regions {', '.join(ports)}: loading the embedded models ({models}) ...")
        for region in t.regions:
            cert, key = tls.issue_certificate(ca_dir, region.name, certs, server=True)
            config = self.run_dir / f"region-{region.name}.toml"
            server = {
                "host": HOST,
                "port": ports[region.name],
                "tls_cert": cert,
                "tls_key": key,
                "client_ca": ca,
            }
            model = MODELS[region.model].region_section()
            config.write_text(
                tomlw.dumps({"name": region.name, "server": server, "model": model, "engine": self.engine})
            )
            self._spawn(f"region-{region.name}", nearshore_argv("region", "--config", str(config)))
        self._region_context = tls.client_context(ca=ca, cert=edge_cert, key=edge_key)
        self._region_ports = ports
        for region in t.regions:
            self.wait_region(region.name)
            self.progress(f"      region {region.name} ready ({time.monotonic() - started:.1f}s)")

        # 2. Every emulated link in one process. Its ports are picked free, then bound by another process:
        # one taken in between (by any connection's local port) is picked again, not the run's end.
        for attempt in range(1, LINK_PORT_TRIES + 1):
            try:
                edge_port, user_port, endpoints, control_url = self._start_links(t, ports)
                break
            except ProcessFailed as exc:
                if "address already in use" not in str(exc) or attempt == LINK_PORT_TRIES:
                    raise
                self.processes.remove(self.by_name.pop("links"))
                self.progress("      a link's port was taken before it bound: picking new ports")

        # 3. The edge, with a key for the user.
        keys_db = self.run_dir / "keys.sqlite3"
        store = KeyStore(keys_db)
        # debug: the demo's user may read the route explanation (the scenarios do).
        api_key, _ = store.create(tenant="lagos-user", tier="demo", rpm=10_000, tpm=10_000_000, debug=True)
        store.close()
        edge_config = self.run_dir / "edge.toml"
        metrics_port = free_port()
        edge_config.write_text(
            tomlw.dumps(
                {
                    "name": f"{t.name}-edge",
                    "keys_db": keys_db,
                    "ledger_db": self.run_dir / "ledger.sqlite3",
                    "server": {"host": HOST, "port": edge_port},
                    "tls": {"dev_cert_dir": self.run_dir / "tls"},
                    "upstream": {
                        "ca": ca,
                        "client_cert": edge_cert,
                        "client_key": edge_key,
                        "health_interval_s": self.health_interval_s,
                    },
                    "metrics": {"port": metrics_port},
                    "geo": {"city": t.edge.city},
                    # The embedded model is a base model: its answers run to max_tokens rather than stop,
                    # so the demo's cache keeps answers cut at max_tokens too (off by default).
                    "cache": {"store_truncated": True},
                    **catalog(t, endpoints),
                }
            )
        )
        self.progress("[3/4] edge: TLS, keys, limits, warm pools to every region ...")
        # The edge's certificate is made here, before it starts (it takes the same one), so the client
        # trusts it at once and no wait for the file depends on how fast the edge starts.
        edge_ca, _ = tls.ensure_dev_certificate(self.run_dir / "tls")
        edge = self._spawn("edge", nearshore_argv("edge", "--config", str(edge_config)))
        edge_context = tls.client_context(ca=edge_ca)
        edge.wait_http(f"https://{HOST}:{edge_port}/health", timeout_s=30, context=edge_context)

        running = RunningTopology(
            name=t.name,
            run_dir=str(self.run_dir),
            edge_url=f"https://{HOST}:{user_port}",
            edge_local_url=f"https://{HOST}:{edge_port}",
            api_key=api_key,
            edge_ca=str(edge_ca),
            cluster_ca=str(ca),
            client_cert=str(edge_cert),
            client_key=str(edge_key),
            control_url=control_url,
            regions=endpoints,
            pids=[p.proc.pid for p in self.processes if p.proc is not None],
            metrics_url=f"http://{HOST}:{metrics_port}",
            chat_model=SMALL if serves(t, SMALL) else LARGE,
        )
        running.prometheus_config = str(write_prometheus_folder(running))
        running.save()
        self.running = running
        self.progress(f"[4/4] up in {time.monotonic() - started:.1f}s; logs in {self.run_dir / 'logs'}")
        return running

    def kill_region(self, name: str) -> None:
        """SIGKILL a region's node: no goodbye, as a crashed machine."""
        process = self.by_name[f"region-{name}"]
        assert process.proc is not None
        process.proc.send_signal(signal.SIGKILL)
        process.proc.wait()

    def restart_region(self, name: str) -> None:
        """Start a killed region's node again, on its port and config; ``wait_region`` waits until it is
        ready. (Call it from the main thread: only there can its child be armed to die with the launcher.)"""
        self.restart(f"region-{name}")

    def restart(self, process_name: str) -> ManagedProcess:
        """Start an exited child again in place: same argv, config (so the same ports: peers reach it where
        they did) and log. Its new pid joins the run record and state.json, so a later run still stops it
        and ``--pids-from`` still finds it. Main thread only, as ``restart_region``."""
        process = self.by_name[process_name].restart()
        assert process.proc is not None
        if self.record is not None:
            self.record.add(process.proc.pid)
        if self.running is not None:
            self.running.pids = [p.proc.pid for p in self.processes if p.proc is not None]
            self.running.save()
        return process

    def wait_region(self, name: str) -> None:
        """Block until the region's node answers /health/ready (through no emulated link)."""
        url = f"https://{HOST}:{self._region_ports[name]}/health/ready"
        self.by_name[f"region-{name}"].wait_http(url, timeout_s=300, context=self._region_context)


def catalog(t: Topology, endpoints: list[RegionEndpoints]) -> dict[str, object]:
    """The edge config's models, prices, size alias and regions for the topology: each region serves its
    node's model (and its aliases) in that model's pool; the large-pool nodes are where the edge sends the
    embedding model's requests (every node serves ``/v1/embeddings``); a local region is the edge's degraded
    tier."""
    served = [MODELS[m] for m in dict.fromkeys(r.model for r in t.regions)]
    regions = []
    for e, r in zip(endpoints, t.regions, strict=True):
        model = MODELS[r.model]
        names = model.names + ([EMBEDDING_MODEL] if model.pool == "large" else [])
        entry: dict[str, object] = {"name": e.name, "url": e.via_edge_link, "city": r.city, "models": names}
        entry |= {"pool": model.pool, "local": r.local}
        regions.append(entry)
    names = [n for m in served for n in m.names] + [EMBEDDING_MODEL]
    prices = {n: m.price for m in served for n in m.names}
    embedding_price = msgspec.to_builtins(EMBEDDING_PRICE).items()
    prices[EMBEDDING_MODEL] = {k: v for k, v in embedding_price if v is not None}  # (TOML has no null)
    section: dict[str, object] = {"models": names, "prices": prices, "regions": regions}
    if {LARGE, SMALL} <= {m.name for m in served}:
        section["aliases"] = [{"name": "auto", "small": SMALL, "large": LARGE}]
    return section


def default_run_dir(topology: Topology) -> Path:
    return RUNS / f"{topology.name}-{os.getpid()}"
