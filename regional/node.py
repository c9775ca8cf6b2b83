"""Build and run a regional node from its config."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

from aiohttp import web

from nearshore.api_runner import ApiRunner
from nearshore.httpkit import install_uvloop
from nearshore.listen import Listener, serve
from nearshore.tls import server_context
from regional.app import SERVICE, create_app
from regional.config import RegionConfig
from regional.embeddings import EmbeddingsService
from regional.engine_select import make_engine
from regional.model_store import EmbeddedModelError, embedded_model, resolve_model_path
from regional.safety import build_filter
from regional.service import RegionService

log = logging.getLogger("nearshore.region")


def check_config(config: RegionConfig) -> None:
    """Cross-field rules a schema cannot say; the message names the key."""
    e = config.engine
    if e.context_window > e.kv_cache_tokens:
        raise ValueError("engine.context_window must not exceed engine.kv_cache_tokens")
    if e.max_sequences > e.batch_tokens:
        raise ValueError("engine.max_sequences must not exceed engine.batch_tokens")
    if e.batch_tokens > e.kv_cache_tokens:
        raise ValueError("engine.batch_tokens must not exceed engine.kv_cache_tokens")
    m, emb = config.model, config.embeddings
    if emb.enabled and (shared := {emb.model, *emb.aliases} & {m.name, *m.aliases}):
        raise ValueError(f"embeddings.model: {sorted(shared)[0]!r} also names the chat model")
    try:
        embedded_model(m.path)  # an unknown embedded name is refused before the listener is bound
    except EmbeddedModelError as exc:
        raise ValueError(f"model.path: {exc}") from None
    _check_tls(config)


MIN_SECRET_CHARS = 16


def _check_tls(config: RegionConfig) -> None:
    s = config.server
    if s.tls_cert and not s.tls_key:
        raise ValueError("server.tls_key: needed with server.tls_cert")
    if s.tls_key and not s.tls_cert:
        raise ValueError("server.tls_cert: needed with server.tls_key")
    if s.client_ca and not s.tls_cert:
        raise ValueError("server.client_ca: needs server.tls_cert and server.tls_key (mutual TLS is TLS)")
    for key in ("tls_cert", "tls_key", "client_ca"):
        path = getattr(s, key)
        if path and not Path(path).is_file():
            raise ValueError(f"server.{key}: file not found: {path}")
    if s.shared_secret and len(s.shared_secret) < MIN_SECRET_CHARS:
        raise ValueError(f"server.shared_secret: use at least {MIN_SECRET_CHARS} characters")


def server_ssl_context(config: RegionConfig) -> ssl.SSLContext | None:
    """The node's TLS context, or None for plain HTTP; a file that does not load is a config error."""
    s = config.server
    if not s.tls_cert:
        return None
    try:
        return server_context(Path(s.tls_cert), Path(s.tls_key), Path(s.client_ca) if s.client_ca else None)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        keys = "server.tls_cert/server.tls_key" + ("/server.client_ca" if s.client_ca else "")
        raise ValueError(f"{keys}: cannot load: {exc}") from exc


def build_region_app(config: RegionConfig) -> web.Application:
    check_config(config)
    server_ssl_context(config)  # fail now, as a config error, not when the server starts
    try:
        model_path = resolve_model_path(config.model.path, config.model.cache_dir)
    except (FileNotFoundError, EmbeddedModelError) as exc:
        raise ValueError(f"model.path: {exc}") from exc
    engine = make_engine(config.model.name, str(model_path), config.engine)
    try:
        safety = build_filter(config.safety.blocklist, config.safety.hook)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"safety.hook: {exc}") from exc
    embeddings = EmbeddingsService(config.embeddings) if config.embeddings.enabled else None
    return create_app(config, engine, RegionService(config, engine, safety), embeddings)


def run_region(app: web.Application, config: RegionConfig, listener: Listener) -> None:
    """Serve on ``listener`` (bound before the app was built) until SIGTERM or the engine fails for good."""
    install_uvloop()
    host = config.server.host
    ssl_context = server_ssl_context(config)
    scheme = "https" if ssl_context else "http"
    if config.server.shared_secret and not ssl_context:
        log.warning("server.shared_secret is set on plain HTTP: the secret crosses the network in clear")

    def announce(actual: int) -> None:
        log.info("region %s serving %s on %s://%s:%d", config.name, config.model.name, scheme, host, actual)

    # Bodies are inflated by read_json, within max_body_bytes, so that a bad or unknown Content-Encoding
    # is an OpenAI-shaped error instead of aiohttp's plain-text 400 and a logged traceback; a request that
    # is not HTTP is one too (ApiRunner).
    runner = ApiRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
    exit_on_failure = ExitOnEngineFailure(config.engine.failed_exit_delay_s)
    app[SERVICE].engine.on_fatal = exit_on_failure
    asyncio.run(
        serve(runner, listener, on_ready=announce, ssl_context=ssl_context, stop=exit_on_failure.stop)
    )
    if exit_on_failure.reason is not None:
        log.critical(
            "region %s exits with status %d: %s", config.name, EXIT_ENGINE_FAILED, exit_on_failure.reason
        )
        raise SystemExit(EXIT_ENGINE_FAILED)


# EX_SOFTWARE: the node cannot serve any more; its supervisor should start it again.
EXIT_ENGINE_FAILED = 70


class ExitOnEngineFailure:
    """The engine's fatal handler: stop serving ``delay_s`` after the engine fails for good.

    Until then every request already gets 503 and /health/ready says why, so that probes and edges learn
    the reason before the process goes away.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.stop = asyncio.Event()
        self.reason: str | None = None

    def __call__(self, reason: str) -> None:  # on the event loop
        if self.reason is None:
            self.reason = reason
            log.critical("engine failed: %s; exiting in %.1fs", reason, self.delay_s)
            asyncio.get_running_loop().call_later(self.delay_s, self.stop.set)
