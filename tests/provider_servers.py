"""What the tests of third-party servers as providers share: llama-cpp-python's own server on the
embedded model (started as a real process, requiring a key), the names and key it is started with, and an
official openai client of an edge."""

from __future__ import annotations

import sys
from pathlib import Path

import openai

from harness.procs import ManagedProcess, free_port
from nearshore.tls import client_context
from regional.model_store import resolve_model_path
from tests.edge_fixtures import Edge

THEIR_MODEL = "served-gemma"  # what the provider calls the model the edge serves as MODEL
EMBEDDER = "all-minilm-l6-v2"  # the region's embedding model
SECRET = "sk-provider-4f0c9e1d2b7a"


def llama_cpp_server(
    folder: Path, key: str, tls: tuple[Path, Path] | None = None, ca: Path | None = None
) -> tuple[ManagedProcess, str]:
    """llama_cpp.server on the embedded model, answering only with ``key``; ``tls``: serving HTTPS with
    that certificate and key (``ca``: the CA that signed it, to wait for it)."""
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(resolve_model_path(""))]
    argv += ["--model_alias", THEIR_MODEL, "--chat_format", "gemma", "--api_key", key]
    # By default it ends the stream it is writing whenever another request arrives (the edge's probe too),
    # and ends it as if whole: a server that serves more than one caller must not.
    argv += ["--n_ctx", "2048", "--n_threads", "2", "--interrupt_requests", "False"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    if tls is not None:
        argv += ["--ssl_certfile", str(tls[0]), "--ssl_keyfile", str(tls[1])]
    process = ManagedProcess("llama_cpp.server", argv, folder / "server.log").start()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    context = client_context(ca) if ca is not None else None
    try:
        process.wait_http(
            url + "/v1/models", timeout_s=180, context=context, headers={"Authorization": f"Bearer {key}"}
        )
    except Exception:
        process.stop()
        raise
    return process, url


def client_of(edge: Edge, key: str) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=edge.ssl_context())
    return openai.OpenAI(base_url=edge.url + "/v1", api_key=key, http_client=http, max_retries=0)
