"""Building the edge's response cache from its config, and its lifetime beside the app's.

A cache that cannot be opened (an unwritable or corrupt folder, a missing embedding model) never stops the
edge: it starts without the cache (or without its semantic level), says why in the log and in ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from cache.decision import semantic_check
from cache.dictionary import build_apart
from cache.embedder import EmbedderLoadError, embedded_model_dir, load_embedder, read_shape
from cache.embedder_pool import EmbedderPool
from cache.response_cache import ResponseCache, threshold_for
from cache.settings import CacheSettings
from cache.store import StoreLimits
from edge.config import EdgeConfig
from edge.region_embedder import RegionEmbedder
from edge.state import EdgeState
from edge.upstream import UpstreamPool

log = logging.getLogger("nearshore.edge.cache")
MINILM_DIM = 384  # all-MiniLM-L6-v2's vectors


def make_cache(config: EdgeConfig, upstreams: UpstreamPool) -> tuple[ResponseCache | None, str]:
    """The cache, or None and why not."""
    settings = config.cache
    if not settings.enabled:
        return None, "disabled"
    folder = (
        Path(settings.folder).expanduser()
        if settings.folder
        else Path(config.ledger_db).expanduser().parent / "cache"
    )
    embedder, dim, why_not = _embedder(settings, upstreams)
    try:
        cache = ResponseCache(
            folder,
            embedder,  # type: ignore[arg-type]  # the local pool or a region: the same three calls
            dim or 1,
            settings.size_limit_mb << 20,
            threshold_for(settings.target_false_hit_rate),
            store_limits(settings, semantic=not why_not),
            # the live audit learns each partition's own judge threshold (cache/audit_judge.py)
            semantic_check(
                settings.judge,
                settings.judge_path,
                settings.target_false_hit_rate,
                learns=True,
                threshold=settings.judge_threshold,
            ),
            ttl_s=settings.ttl_s,  # what a scope stored this long ago is no longer held
        )
    except Exception as exc:  # an unwritable or corrupt folder: serve without a cache
        log.warning("response cache at %s cannot be opened (%s): serving without it", folder, exc)
        return None, f"cannot open {folder}: {exc}"
    if why_not:
        cache.semantic_off = why_not
    if settings.share_redis_url:
        from cache.city_share import CityShare  # redis only where a city shares its cache

        cache.share = CityShare(
            settings.share_redis_url,
            cache.store,
            dim or 1,
            folder,
            settings.share_stream_max,
            kind=_vector_kind(settings, why_not),
            reindex=cache.index_later,
            learn=cache.learn,
        )
    return cache, ""


def _vector_kind(settings: CacheSettings, why_not: str) -> str:
    """What makes this edge's vectors (cache.city_share.vector_kind): its edges use only their own kind."""
    from cache.city_share import vector_kind

    if why_not:
        return ""
    if settings.embed == "region":
        return vector_kind(None, settings.region_model)
    path = settings.embedder_path
    return vector_kind(Path(path).expanduser() if path else embedded_model_dir())


def store_limits(settings: CacheSettings, semantic: bool) -> StoreLimits:
    return StoreLimits(
        read_cache_bytes=settings.read_cache_mb << 20,
        max_maps=settings.max_maps,
        map_idle_s=settings.map_idle_s,
        index_memory_bytes=settings.index_memory_mb << 20,
        max_partitions=settings.max_partitions,
        # no semantic level: no index files, so the entries keep the whole limit
        index_share=settings.index_share if semantic and settings.semantic else 0.0,
    )


def _embedder(
    settings: CacheSettings, upstreams: UpstreamPool
) -> tuple[EmbedderPool | RegionEmbedder, int, str]:
    """Who embeds the questions, the vectors' size, and why there is no semantic level ("" if there is)."""
    if not settings.semantic:  # exact hits only: no question is ever embedded, no model loaded
        return EmbedderPool(lambda: load_embedder(""), source="<none>"), 0, "cache.semantic = false"
    try:
        model_dir = (
            Path(settings.embedder_path).expanduser() if settings.embedder_path else embedded_model_dir()
        )
        dim = read_shape(model_dir).hidden
    except (EmbedderLoadError, OSError, ValueError) as exc:
        model_dir, dim = None, 0
        why = f"no embedding model ({exc})"
    if settings.embed == "region":
        # The regions serve the same model: its folder (if this edge has it) gives the size, else MiniLM's.
        return RegionEmbedder(upstreams, settings.region_model, dim or MINILM_DIM), dim or MINILM_DIM, ""
    if model_dir is None:
        log.warning("response cache: %s; exact hits only", why)
        return EmbedderPool(lambda: load_embedder(""), source="<none>"), 0, why
    backend = settings.embedder_backend
    path = str(model_dir)
    # Loaded on the first cacheable request (its lookup loses that race, nothing waits): an edge that never
    # sees one never holds the model (~200 MB with its runtime).
    return (
        EmbedderPool(lambda: load_embedder(path, backend=backend), source=path, load_when="lazy"),
        dim,
        "",
    )


def cache_lifetime(state: EdgeState):
    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        cache = state.cache
        shared: asyncio.Task | None = None
        if cache is not None:
            await cache.embedder.start()
            if not cache.semantic_off:  # the verifier's word list, built apart and read off the loop
                state.in_background(build_apart())
            if cache.share is not None:
                shared = asyncio.create_task(cache.share.run())
        yield
        if shared is not None:
            shared.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shared
        if cache is not None:
            await cache.embedder.close()
            cache.close()

    return lifetime
