"""``bench faults``' gateways, configured alike over the same hostile replicas: our edge and LiteLLM's
proxy, with the run's limits (first token, stall, deadline, attempts, circuit) in each one's own terms.

A layout (bench/faults/cases.py) names the region entries: in the usual one, replicas ``a`` and ``b`` serve
MODEL (one group for LiteLLM, two regions for the edge) and ``c`` serves FALLBACK, the fallback of MODEL
(and of SECOND) for any failure and for a context-length refusal. Neither gateway caches answers.
LiteLLM's config is written as JSON, which is YAML, so no YAML writer is needed.
"""

from __future__ import annotations

import json
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from bench.faults.cases import FALLBACK, MODEL, SECOND, Layout
from bench.peers import JSON, LITELLM_ENV, Endpoint, started
from edge.keys import KeyStore
from harness.procs import ManagedProcess, free_port
from nearshore.children import nearshore_argv
from nearshore.tls import ensure_dev_certificate
from nearshore.tomlw import dumps

PRICES = {
    MODEL: {"input": 1.0, "output": 2.0},
    SECOND: {"input": 1.0, "output": 2.0},
    FALLBACK: {"input": 2.0, "output": 4.0},
}
FALLBACKS = {MODEL: [FALLBACK], SECOND: [FALLBACK]}


@dataclass(frozen=True)
class Limits:
    """The run's limits, short so that it ends in minutes; both gateways get them."""

    ttft_s: float = 5.0  # first token (LiteLLM: stream_timeout, which is also its read timeout: a stall)
    stall_s: float = 5.0  # between events
    deadline_s: float = 30.0  # the whole request (LiteLLM: timeout, per call)
    max_attempts: int = 4  # requests to replicas per request (LiteLLM: 1 + num_retries, fallbacks apart)
    failures_to_eject: int = 3  # the circuit: failures in a row (LiteLLM: allowed_fails) ...
    ejection_s: float = 3.0  # ... then out for this long, every time (LiteLLM: cooldown_time)


def start_edge(logs: Path, replicas: dict[str, str], layout: Layout, limits: Limits) -> Endpoint:
    """Our edge over the replicas (name -> URL) as ``layout`` names them: TLS on (its development
    certificate), a key that no limit stops, the response cache off, FALLBACK the fallback for failures
    and for long contexts."""
    folder = logs / f"edge-{layout.name}"
    folder.mkdir(parents=True, exist_ok=True)
    store = KeyStore(folder / "keys.sqlite3")
    try:
        api_key, _ = store.create(tenant="bench-faults", rpm=10**9, tpm=10**12)
    finally:
        store.close()
    cert, _ = ensure_dev_certificate(folder / "tls")  # made here, so that the client trusts it at once
    context = ssl.create_default_context(cafile=str(cert))
    port = free_port()
    regions = [
        {"name": region.name, "url": replicas[region.replica], "models": list(region.models)}
        for region in layout.regions
    ]
    config: dict[str, object] = {
        "name": "edge-faults",
        "keys_db": folder / "keys.sqlite3",
        "ledger_db": folder / "ledger.sqlite3",
        "models": list(PRICES),
        "prices": PRICES,
        "server": {"port": port},
        "tls": {"enabled": True, "dev_cert_dir": folder / "tls"},
        "metrics": {"port": 0},
        "cache": {"enabled": False},
        "upstream": {
            "ttft_timeout_s": limits.ttft_s,
            "stall_timeout_s": limits.stall_s,
            "request_deadline_s": limits.deadline_s,
            "max_attempts": limits.max_attempts,
            # a unary answer's first byte: ttft_s plus this per token (60 tokens: 3 s)
            "unary_timeout_per_token_s": 0.05,
        },
        "geo": {
            "health": {
                "consecutive_failures": limits.failures_to_eject,
                "base_ejection_s": limits.ejection_s,
                "max_ejection_s": limits.ejection_s,  # no growth: each case starts with the circuit closed
            }
        },
        "fallbacks": {"models": FALLBACKS, "context": FALLBACKS},
        "regions": regions,
    }
    (folder / "edge.toml").write_text(dumps(config))
    url = f"https://127.0.0.1:{port}"
    argv = nearshore_argv("edge", "--config", str(folder / "edge.toml"))
    process = ManagedProcess("edge", argv, logs / f"edge-{layout.name}.log")
    started(process, url + "/health", 60, context)
    headers = {**JSON, "Authorization": f"Bearer {api_key}"}
    return Endpoint("nearshore edge", url, headers, process, context, folder)


def litellm_config(
    replicas: dict[str, str], layout: Layout, limits: Limits, master_key: str
) -> dict[str, object]:
    """LiteLLM's proxy config: a deployment per region entry and model (MODEL one group over its
    replicas), FALLBACK on c, the same limits."""
    deployments = [
        {
            "model_name": model,
            "litellm_params": {
                "model": f"openai/{model}",
                "api_base": f"{replicas[region.replica]}/v1",
                "api_key": "x",
                # the fault rides in the body's `user`, which LiteLLM sends only to models in its OpenAI
                # catalog unless allowed by name
                "allowed_openai_params": ["user"],
            },
        }
        for region in layout.regions
        for model in region.models
    ]
    return {
        "model_list": deployments,
        "router_settings": {
            "num_retries": limits.max_attempts - 1,
            "timeout": limits.deadline_s,
            "stream_timeout": limits.ttft_s,
            "fallbacks": [{model: chain} for model, chain in FALLBACKS.items()],
            "context_window_fallbacks": [{model: chain} for model, chain in FALLBACKS.items()],
            "allowed_fails": limits.failures_to_eject,
            "cooldown_time": limits.ejection_s,
        },
        "litellm_settings": {"telemetry": False},
        "general_settings": {"master_key": master_key, "disable_spend_logs": True},
    }


def start_litellm(
    logs: Path, litellm: Path, replicas: dict[str, str], layout: Layout, limits: Limits
) -> Endpoint:
    """LiteLLM's proxy from its own virtualenv, one worker, offline (peers.LITELLM_ENV)."""
    folder = logs / f"litellm-{layout.name}"
    folder.mkdir(parents=True, exist_ok=True)
    master_key = "sk-" + secrets.token_hex(32)
    conf = folder / "config.yaml"
    conf.write_text(json.dumps(litellm_config(replicas, layout, limits, master_key), indent=2))
    port = free_port()
    argv = [str(litellm), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("litellm", argv, logs / f"litellm-{layout.name}.log", env=LITELLM_ENV)
    started(process, url + "/health/liveliness", 180, None)
    headers = {**JSON, "Authorization": f"Bearer {master_key}"}
    return Endpoint("LiteLLM proxy", url, headers, process, folder=folder)
