"""Exact and semantic response cache at the edge (see DESIGN.md, step 2)."""

from cache.embedder import DEFAULT_NAME, Embedder, EmbedderLoadError, MiniLMEmbedder, load_embedder
from cache.embedder_pool import Embedded, EmbedderBusy, EmbedderPool, TooManyTokens

__all__ = [
    "DEFAULT_NAME",
    "Embedded",
    "Embedder",
    "EmbedderBusy",
    "EmbedderLoadError",
    "EmbedderPool",
    "MiniLMEmbedder",
    "TooManyTokens",
    "load_embedder",
]
