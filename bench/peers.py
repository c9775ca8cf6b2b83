"""Every server a benchmark starts, in one place: the stand-in regions (``nearshore pacer``, ``nearshore
hostile``), a Nearshore edge or region, and the peers they are compared with: nginx, LiteLLM's proxy and
llama-cpp-python's server.

Each starter starts its process, waits until it answers, and returns an :class:`Endpoint`: where a client
sends, what it sends along (a key), what TLS it trusts, and the process tree whose CPU is the server's cost.
A starter that fails stops what it started and raises ``harness.procs.ProcessFailed``.

LiteLLM runs with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (without it, it fetches its price map at start, and
this machine has no internet), ``LITELLM_TELEMETRY_DISABLED=true``, ``LITELLM_LOG=ERROR``, no database (so no
spend logs, and ``disable_spend_logs: true`` besides) and a master key (it refuses to start without one).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import shutil
import ssl
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.cpu import process_cpu_s
from edge.keys import KeyStore
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.tls import ensure_dev_certificate
from nearshore.tomlw import dumps

MODEL = "gemma-3-270m"
JSON = {"Content-Type": "application/json"}
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Endpoint:
    """A started server as a client reaches it."""

    name: str
    url: str
    headers: dict[str, str]
    process: ManagedProcess | None = None  # None: nothing of ours to measure or stop
    ssl: ssl.SSLContext | None = None
    folder: Path | None = None  # its configs and databases, where it has any

    def cpu_s(self) -> float:
        return process_cpu_s(self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def started(
    process: ManagedProcess, ready_url: str, timeout_s: float, context: ssl.SSLContext | None = None
) -> ManagedProcess:
    """``process`` started and answering ``ready_url``; stopped again if it does not in time."""
    process.start()
    try:
        process.wait_http(ready_url, timeout_s=timeout_s, context=context)
    except BaseException:
        process.stop()
        raise
    return process


# --- Nearshore's own processes ---------------------------------------------------------------------------


def start_stand_in(logs: Path, command: str, name: str, **flags: object) -> Endpoint:
    """``nearshore pacer`` or ``nearshore hostile``, its flags as keywords (``interval_ms=20``)."""
    port = free_port()
    argv = [command, "--port", str(port), "--name", name]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    url = f"http://127.0.0.1:{port}"
    process = started(ManagedProcess(name, nearshore_argv(*argv), logs / f"{name}.log"), url + "/health", 30)
    return Endpoint(name, url, dict(JSON), process)


def start_edge(
    logs: Path,
    name: str,
    region_url: str,
    *,
    tls: bool,
    region_name: str = "pacer",
    upstream: dict[str, object] | None = None,
    regions: list[dict[str, object]] | None = None,
    geo: dict[str, object] | None = None,
    cache: dict[str, object] | None = None,
    sections: dict[str, dict[str, object]] | None = None,
    api_key: str = "",
) -> Endpoint:
    """An edge in front of one region (or the catalog ``regions``, with the ``geo`` section), with a key
    that no limit stops (the key rides in ``headers``); ``cache`` is its [cache] section, if given, and
    ``sections`` any others. ``api_key``: a key its key store already holds (else one is made in a SQLite
    file of its own)."""
    folder = logs / name
    folder.mkdir(parents=True, exist_ok=True)
    if not api_key:
        store = KeyStore(folder / "keys.sqlite3")
        try:
            api_key, _ = store.create(tenant="bench", rpm=10**9, tpm=10**12)
        finally:
            store.close()
    context = None
    if tls:
        cert, _ = ensure_dev_certificate(folder / "tls")  # made here, so the client can trust it at once
        context = ssl.create_default_context(cafile=str(cert))
    port = free_port()
    config: dict[str, object] = {
        "name": name,
        "keys_db": folder / "keys.sqlite3",
        "ledger_db": folder / "ledger.sqlite3",
        "server": {"port": port},
        "tls": {"enabled": tls, "dev_cert_dir": folder / "tls"},
        "metrics": {"port": 0},
        **({"upstream": upstream} if upstream else {}),
        **({"geo": geo} if geo else {}),
        **({"cache": cache} if cache is not None else {}),
        "regions": regions or [{"name": region_name, "url": region_url}],
        **(sections or {}),
    }
    (folder / "edge.toml").write_text(dumps(config))
    argv = nearshore_argv("edge", "--config", str(folder / "edge.toml"))
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    process = started(ManagedProcess(name, argv, logs / f"{name}.log"), url + "/health", 60, context)
    headers = {**JSON, "Authorization": f"Bearer {api_key}"}
    return Endpoint(name, url, headers, process, context, folder)


def start_region(
    logs: Path,
    model_path: str,
    threads: int,
    max_sequences: int,
    engine: str = "llama.cpp",
    engine_settings: dict | None = None,
) -> Endpoint:
    """``nearshore region`` on ``model_path`` with the ``engine`` ("llama.cpp" or "gpu": the torch engine,
    on CUDA when present, else the CPU), and any other ``[engine]`` settings; loading takes minutes on a
    busy machine the first time."""
    port = free_port()
    config = {
        "server": {"port": port},
        "model": {"path": model_path},
        "engine": {
            "kind": engine,
            "n_threads": threads,
            "max_sequences": max_sequences,
            **(engine_settings or {}),
        },
    }
    name = "nearshore" if engine == "llama.cpp" else f"nearshore-{engine}"
    (logs / f"{name}.toml").write_text(dumps(config))
    argv = nearshore_argv("region", "--config", str(logs / f"{name}.toml"))
    url = f"http://127.0.0.1:{port}"
    process = started(ManagedProcess(name, argv, logs / f"{name}.log"), url + "/health/ready", 300)
    return Endpoint(name, url, dict(JSON), process)


# --- the peers ---------------------------------------------------------------------------------------------


def start_llama_cpp_server(logs: Path, model_path: str, threads: int) -> Endpoint:
    """llama-cpp-python's OpenAI server on the same model and threads (the ``bench`` extra)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        model_path,
        "--model_alias",
        MODEL,
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        "4096",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--interrupt_requests",
        "False",
    ]
    url = f"http://127.0.0.1:{port}"
    process = started(ManagedProcess("llama_cpp.server", argv, logs / "peer.log"), url + "/v1/models", 120)
    return Endpoint("llama_cpp.server", url, dict(JSON), process)


NGINX_CONF = """daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream pacer {{
        server {upstream};
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port}{tls};
        location / {{
            proxy_pass http://pacer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


NGINX_HTTPS = "nginx-https"  # nginx terminating TLS, beside nginx without


def start_nginx(logs: Path, nginx: str, upstream_url: str, *, tls: bool = False) -> Endpoint:
    """nginx as a plain reverse proxy, one worker, no buffering: the floor for a proxy on this machine;
    with ``tls``, terminating TLS with the edge's development certificate ("nginx-https")."""
    name = NGINX_HTTPS if tls else "nginx"
    folder = logs / name
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = folder / "nginx.conf"
    upstream = upstream_url.removeprefix("http://")
    listen, context = "", None
    if tls:
        cert, key = ensure_dev_certificate(folder / "tls")
        listen = f" ssl;\n        ssl_certificate {cert};\n        ssl_certificate_key {key}"
        context = ssl.create_default_context(cafile=str(cert))
    conf.write_text(NGINX_CONF.format(dir=folder, upstream=upstream, port=port, tls=listen))
    argv = [nginx, "-c", str(conf), "-p", str(folder), "-e", str(folder / "nginx-error.log")]
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    process = started(ManagedProcess(name, argv, logs / f"{name}.log"), url + "/health", 30, context)
    return Endpoint(name, url, dict(JSON), process, context, folder)


def start_floor(logs: Path, upstream_url: str) -> Endpoint:
    """The bare byte relay in Python on uvloop (bench/edge/floor.py): the runtime's cost, nothing else."""
    return _start_relay(logs, "floor", "bench.edge.floor", upstream_url)


def start_frame(logs: Path, upstream_url: str) -> Endpoint:
    """The edge's serving parts without its stages (bench/edge/frame.py): aiohttp, the pool, the relay."""
    return _start_relay(logs, "frame", "bench.edge.frame", upstream_url)


def start_lean_frame(logs: Path, upstream_url: str) -> Endpoint:
    """The same frame on the lean HTTP/1.1 server core (bench/edge/frame_lean.py, edge/h1_server.py)."""
    return _start_relay(logs, "lean", "bench.edge.frame_lean", upstream_url)


def _start_relay(logs: Path, name: str, module: str, upstream_url: str) -> Endpoint:
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", module, "--port", str(port), "--upstream", upstream_url]
    url = f"http://127.0.0.1:{port}"
    process = started(ManagedProcess(name, argv, logs / f"{name}.log"), url + "/health", 30)
    return Endpoint(name, url, dict(JSON), process)


LITELLM_MODEL = """  - model_name: {model}
    litellm_params:
      model: openai/{upstream_model}
      api_base: {upstream}/v1
      api_key: {upstream_key}
"""
LITELLM_CONF = """model_list:
{models}litellm_settings:
  telemetry: false
general_settings:
  master_key: {master_key}
  disable_spend_logs: true
"""
LITELLM_ENV = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: no fetch of the price map at start
    "LITELLM_TELEMETRY_DISABLED": "true",
}


def start_litellm(
    logs: Path,
    litellm: Path,
    upstream_url: str,
    upstream_model: str = MODEL,
    upstream_key: str = "x",
    also: Sequence[str] = (),
) -> Endpoint:
    """LiteLLM's proxy, one worker, from its own virtualenv, serving MODEL from ``upstream_url`` (which
    calls it ``upstream_model`` and wants ``upstream_key``), and each model in ``also`` from there by its
    own name; the client sends its master key."""
    folder = logs / "litellm"
    folder.mkdir(parents=True, exist_ok=True)
    master_key = "sk-" + secrets.token_hex(32)
    served = [(MODEL, upstream_model), *((name, name) for name in also)]
    entries = "".join(
        LITELLM_MODEL.format(
            model=name, upstream=upstream_url, upstream_model=theirs, upstream_key=upstream_key
        )
        for name, theirs in served
    )
    conf = folder / "config.yaml"
    conf.write_text(LITELLM_CONF.format(models=entries, master_key=master_key))
    port = free_port()
    argv = [str(litellm), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("litellm", argv, logs / "litellm.log", env=LITELLM_ENV)
    started(process, url + "/health/liveliness", 180)
    return Endpoint("litellm", url, {**JSON, "Authorization": f"Bearer {master_key}"}, process, folder=folder)


def find_nginx(choice: str) -> str | None:
    if choice:
        return shutil.which(choice)
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def find_litellm(choice: str) -> Path | None:
    path = Path(choice)
    for candidate in (path, REPO / path) if not path.is_absolute() else (path,):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def versions(nginx: str | None, litellm: Path | None) -> dict[str, str]:
    found = {"python": platform.python_version(), "aiohttp": aiohttp.__version__, "cpus": str(os.cpu_count())}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if nginx:
            out = subprocess.run([nginx, "-v"], capture_output=True, text=True, timeout=10)
            found["nginx"] = (out.stderr or out.stdout).strip().split("/")[-1]
        if litellm:
            query = "import importlib.metadata as m; print(m.version('litellm'))"
            out = subprocess.run(
                [str(litellm.parent / "python"), "-c", query], capture_output=True, text=True, timeout=30
            )
            found["litellm"] = out.stdout.strip()
    return found
