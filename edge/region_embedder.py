"""The response cache's questions embedded at a region (``cache.embed = "region"``): its ``/v1/embeddings``
over the edge's warm pools, for an edge that should not hold the embedding model (~200 MB with its runtime).

The nearest routable replica serving the model answers (the router's round trips order them); a region
that fails or answers something else is skipped. Nothing here is trusted: the answer is checked as the
edge checks every embeddings answer (one vector per input) and the vectors' size is checked too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec
import numpy as np

from cache.embedder_pool import OutOfScope
from edge.provider import CredentialUnavailable
from edge.region_answer import MAX_VECTOR_BYTES, UpstreamFault, check_embeddings, read_bounded
from edge.upstream import UPSTREAM_ERRORS, UpstreamPool


class _Vector(msgspec.Struct):
    index: int
    embedding: list[float]


class _Vectors(msgspec.Struct):
    data: list[_Vector]


_vectors = msgspec.json.Decoder(_Vectors)


class RegionEmbedder:
    """The same ``embed``/``start``/``close`` as the local embedder pool, the work done at a region."""

    def __init__(self, pool: UpstreamPool, model: str, dim: int, timeout_s: float = 2.0) -> None:
        self.pool = pool
        self.model = model
        self.dim = dim
        self.timeout_s = timeout_s
        self.source = f"a region's /v1/embeddings ({model})"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def embed_background(
        self, texts: Sequence[str], regions: frozenset[str] | None = None
    ) -> np.ndarray:
        """The audit's embeddings: at a region they queue behind no local lookup, so as any other."""
        return await self.embed(texts, regions)

    async def embed(self, texts: Sequence[str], regions: frozenset[str] | None = None) -> np.ndarray:
        """The texts' vectors from the nearest replica serving the model among ``regions`` (the request's
        data-residency scope; None: any): a question goes only where the request itself may go."""
        body = msgspec.json.encode({"model": self.model, "input": list(texts)})
        headers = {"Content-Type": "application/json", **self.pool.headers}
        now = time.monotonic()
        replicas = [
            u
            for u in self.pool.upstreams
            if self.model in u.replica.models
            and u.replica.health.routable(now)
            and (regions is None or u.replica.region in regions)
        ]
        if not replicas and regions is not None:
            raise OutOfScope(f"no region the request may reach ({', '.join(sorted(regions))}) embeds")
        replicas.sort(key=lambda u: u.replica.latency.rtt_ms)
        failures = []
        for upstream in replicas:
            try:
                out = upstream.outgoing("/v1/embeddings", headers, body, self.model)  # a provider's way
                timeout_s = self.timeout_s
                response = await upstream.pool.request("POST", out.path, out.headers, out.body, timeout_s)
                try:
                    raw = await read_bounded(response, MAX_VECTOR_BYTES * len(texts) + 4096, self.timeout_s)
                    if response.status != 200:
                        raise UpstreamFault.bad(f"HTTP {response.status}")
                    check_embeddings(response, raw, len(texts))
                finally:
                    response.close()
                answer = _vectors.decode(raw)
            except (
                TimeoutError,
                UpstreamFault,
                CredentialUnavailable,
                msgspec.DecodeError,
                msgspec.ValidationError,
                *UPSTREAM_ERRORS,
            ) as exc:
                failures.append(f"{upstream.name}: {type(exc).__name__} {exc}"[:120])
                continue
            vectors = np.array(
                [v.embedding for v in sorted(answer.data, key=lambda v: v.index)], dtype=np.float32
            )
            if vectors.shape != (len(texts), self.dim) or not np.all(np.isfinite(vectors)):
                failures.append(
                    f"{upstream.name}: vectors of shape {vectors.shape}, not ({len(texts)}, {self.dim})"
                )
                continue
            return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        raise RuntimeError(
            "no region could embed the question: " + ("; ".join(failures) or "none serves " + self.model)
        )
