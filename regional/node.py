"""Build and run a regional node from its config."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from nearshore.httpkit import install_uvloop, serve
from regional.app import create_app
from regional.config import RegionConfig
from regional.llama_engine import LlamaCppEngine
from regional.model_store import resolve_model_path
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


def build_region_app(config: RegionConfig) -> web.Application:
    check_config(config)
    try:
        model_path = resolve_model_path(config.model.path, config.model.cache_dir)
    except FileNotFoundError as exc:
        raise ValueError(f"model.path: {exc}") from exc
    engine = LlamaCppEngine(config.model.name, str(model_path), config.engine)
    try:
        safety = build_filter(config.safety.blocklist, config.safety.hook)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"safety.hook: {exc}") from exc
    return create_app(config, engine, RegionService(config, engine, safety))


def run_region(app: web.Application, config: RegionConfig, port: int | None = None) -> None:
    install_uvloop()
    host = config.server.host
    bound_port = config.server.port if port is None else port

    def announce(actual: int) -> None:
        log.info("region %s serving %s on http://%s:%d", config.name, config.model.name, host, actual)

    asyncio.run(serve(app, host, bound_port, on_ready=announce))
