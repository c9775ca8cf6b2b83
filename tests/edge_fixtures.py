"""Start real pacer and edge processes for the edge tests."""

from __future__ import annotations

import contextlib
import sqlite3
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from edge.config import EdgeConfig
from edge.key_backend import KEY_REFRESH_S
from edge.keys import KeyStore
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.tls import ensure_dev_certificate
from nearshore.tomlw import dumps

# How long a process may take to answer /health: a guard against a hang, not a measure of speed (three
# workers on two cores have taken an edge past 15 s).
START_TIMEOUT_S = 120
# How long a test waits for what a process does on its own (a socket closed, a key revoked, a worker gone):
# also a guard against a hang; the wait ends as soon as it happens.
EVENTUALLY_S = 60


@dataclass
class Pacer:
    url: str
    process: ManagedProcess


@dataclass
class Edge:
    url: str
    process: ManagedProcess
    folder: Path
    keys_db: Path
    ledger_db: Path
    ca: Path  # the development certificate the edge serves: clients trust it as their CA
    metrics_url: str = ""  # the operator's listener: /metrics and /health, plain HTTP on loopback
    extra: list[ManagedProcess] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)  # every key made through new_key, for the log check

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def ledger_rows(self) -> list[dict]:
        """Every usage row the edge wrote, oldest first."""
        db = sqlite3.connect(self.ledger_db)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute("SELECT * FROM usage ORDER BY ts")]
        finally:
            db.close()

    def ledger_rows_once(self, count: int, timeout_s: float = 10.0) -> list[dict]:
        """The ledger's rows once it holds at least ``count`` (a row is written just after its answer,
        off the request's path), or all it holds after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while len(rows := self.ledger_rows()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return rows

    def new_key(self, **fields: object) -> str:
        """A key made as `nearshore keys create` makes it, returned once the edge has loaded it."""
        store = KeyStore(self.keys_db)
        try:
            plaintext, _ = store.create(**{"tenant": "test", **fields})
        finally:
            store.close()
        self.issued.append(plaintext)
        self.wait_for_key(plaintext)
        return plaintext

    def assert_no_secret_in_logs(self) -> None:
        """No key's secret part appears in any log the edge or its regions wrote (issue 7, item 10)."""
        logs = [p for p in self.folder.parent.rglob("*.log") if p.is_file()]
        assert logs
        # "ns-" + 12 hex + "-" + the secret (base64url: it may hold "-" itself)
        secrets = [key[len("ns-") + 13 :] for key in self.issued]
        for log in logs:
            text = log.read_text(errors="replace")
            leaked = [secret for secret in secrets if secret in text]
            assert not leaked, f"{log} holds the secret of {len(leaked)} key(s)"

    def wait_for_key(self, plaintext: str, timeout_s: float = 5.0) -> None:
        """Wait until the edge accepts the key (GET /v1/models costs no rate limit), then one more refresh
        period so that other edges on the same keys file have it too."""
        request = urllib.request.Request(
            self.url + "/v1/models", headers={"Authorization": f"Bearer {plaintext}"}
        )
        context = self.ssl_context() if self.url.startswith("https") else None
        deadline = time.monotonic() + timeout_s
        while True:
            with (
                contextlib.suppress(urllib.error.HTTPError),
                urllib.request.urlopen(request, timeout=2, context=context) as response,
            ):
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, "the edge did not load a new key"
            time.sleep(0.02)
        time.sleep(KEY_REFRESH_S)

    def stop(self) -> None:
        self.process.stop()
        for p in self.extra:
            p.stop()


def worker_metrics_urls(edge: Edge) -> list[str]:
    """Each of a two-worker edge's metrics endpoints (worker i on metrics.port + i)."""
    base = int(edge.metrics_url.rsplit(":", 1)[1])
    return [f"http://127.0.0.1:{port}/metrics" for port in (base, base + 1)]


def wait_for_both_workers(edge: Edge, timeout_s: float = START_TIMEOUT_S) -> None:
    """The public /health answers once one worker listens: wait for each one's metrics."""
    deadline = time.monotonic() + timeout_s
    for url in worker_metrics_urls(edge):
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, f"no worker answers at {url}"
                time.sleep(0.1)


def start_pacer(folder: Path, name: str = "pacer", **flags: object) -> Pacer:
    """A stand-in region that streams at a fixed pace (``nearshore pacer``), e.g. ``tokens=12``."""
    return _stand_in("pacer", folder, name, flags)


def start_hostile(folder: Path, name: str = "hostile", **flags: object) -> Pacer:
    """A hostile region (``nearshore hostile``): its flags as for the pacer, e.g. ``mode="hang"``."""
    return _stand_in("hostile", folder, name, flags)


def _stand_in(command: str, folder: Path, name: str, flags: dict[str, object]) -> Pacer:
    port = free_port()
    args = [command, "--port", str(port), "--name", name]
    for flag, value in flags.items():
        args += [f"--{flag.replace('_', '-')}", str(value)]
    process = ManagedProcess(name, nearshore_argv(*args), folder / f"{name}.log").start()
    url = f"http://127.0.0.1:{port}"
    process.wait_http(url + "/health", timeout_s=START_TIMEOUT_S)
    return Pacer(url, process)


def start_edge(
    folder: Path,
    regions: list[tuple[str, str] | dict[str, object]],
    keys_db: Path | None = None,
    ledger_db: Path | None = None,
    **sections: dict[str, object],
) -> Edge:
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    keys_db = keys_db or folder / "keys.sqlite3"
    ledger_db = ledger_db or folder / "ledger.sqlite3"
    # The edge reads keys created before it starts; make sure the file exists.
    KeyStore(keys_db).close()
    top = sections.pop("top", {})
    server = {"port": port, **sections.pop("server", {})}
    metrics = {"port": free_port(), **sections.pop("metrics", {})}
    tls = {"dev_cert_dir": str(folder / "tls"), **sections.pop("tls", {})}
    config = folder / "edge.toml"
    config.write_text(
        dumps(
            {
                "keys_db": keys_db,
                "ledger_db": ledger_db,
                **top,
                "server": server,
                "tls": tls,
                "metrics": metrics,
                **sections,
                # (name, url), or a whole catalog entry (city, replicas, models, ...)
                "regions": [r if isinstance(r, dict) else {"name": r[0], "url": r[1]} for r in regions],
            }
        )
    )
    tls_on = tls.get("enabled", True)
    ca = folder / "tls" / "dev-cert.pem"
    context = None
    if tls_on:  # made before the edge starts (it takes the same one): the client trusts it at once
        ca, _ = ensure_dev_certificate(folder / "tls")
        context = ssl.create_default_context(cafile=str(ca))
    process = ManagedProcess(
        "edge", nearshore_argv("edge", "--config", str(config)), folder / "edge.log"
    ).start()
    url = f"{'https' if tls_on else 'http'}://127.0.0.1:{port}"
    try:
        process.wait_http(url + "/health", timeout_s=START_TIMEOUT_S, context=context)
    except Exception:
        process.stop()
        raise
    metrics_url = f"http://127.0.0.1:{metrics['port']}" if metrics["port"] else ""
    return Edge(url, process, folder, keys_db, ledger_db, ca, metrics_url)


def edge_over_pacer(
    folder: Path, name: str, sections: dict[str, dict[str, object]] | None = None, **pacer_flags: object
) -> Edge:
    """An edge whose one region is a pacer started with ``pacer_flags``; stopping the edge stops both."""
    pacer = start_pacer(folder, name=name, **pacer_flags)
    try:
        edge = start_edge(folder / "edge", [(name, pacer.url)], **(sections or {}))
    except Exception:
        pacer.process.stop()
        raise
    edge.extra.append(pacer.process)
    return edge


def prices_with(own: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Every served model's own price (as the edge's defaults give it), and ``own``: regions' prices."""
    served = {m: msgspec.structs.asdict(p) for m, p in EdgeConfig().prices.items()}
    return {**{m: {k: v for k, v in p.items() if v is not None} for m, p in served.items()}, **own}
