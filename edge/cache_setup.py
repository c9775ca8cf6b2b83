"""Building the edge's response cache from its config, and its lifetime beside the app's.

A cache that cannot be opened (an unwritable or corrupt folder, a missing embedding model) never stops the
edge: it starts without the cache (or without its semantic level), says why in the log and in ``/health``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from cache.embedder import EmbedderLoadError, embedded_model_dir, load_embedder, read_shape
from cache.embedder_pool import EmbedderPool
from cache.response_cache import ResponseCache, threshold_for
from edge.config import EdgeConfig
from edge.state import EdgeState

log = logging.getLogger("nearshore.edge.cache")


def make_cache(config: EdgeConfig) -> tuple[ResponseCache | None, str]:
    """The cache, or None and why not."""
    settings = config.cache
    if not settings.enabled:
        return None, "disabled"
    folder = (
        Path(settings.folder).expanduser()
        if settings.folder
        else Path(config.ledger_db).expanduser().parent / "cache"
    )
    try:
        model_dir = (
            Path(settings.embedder_path).expanduser() if settings.embedder_path else embedded_model_dir()
        )
        dim = read_shape(model_dir).hidden
    except (EmbedderLoadError, OSError, ValueError) as exc:
        log.warning("response cache: no embedding model (%s); exact hits only", exc)
        model_dir, dim = None, 0
    path = str(model_dir) if model_dir is not None else ""
    # Loaded on the first cacheable request (its lookup loses that race, nothing waits): an edge that never
    # sees one never holds the model (~200 MB with its runtime).
    pool = EmbedderPool(lambda: load_embedder(path), source=path or "<none>", load_when="lazy")
    try:
        cache = ResponseCache(
            folder,
            pool,
            dim or 1,
            settings.size_limit_mb << 20,
            threshold_for(settings.target_false_hit_rate),
        )
    except Exception as exc:  # an unwritable or corrupt folder: serve without a cache
        log.warning("response cache at %s cannot be opened (%s): serving without it", folder, exc)
        return None, f"cannot open {folder}: {exc}"
    if model_dir is None:
        cache.semantic_off = "no embedding model"
    return cache, ""


def cache_lifetime(state: EdgeState):
    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        cache = state.cache
        if cache is not None:
            await cache.embedder.start()
        yield
        if cache is not None:
            await cache.embedder.close()
            cache.close()

    return lifetime
