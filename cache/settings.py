"""The response cache's settings: the ``[cache]`` section of an edge's config."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field


class CacheSettings(Struct, forbid_unknown_fields=True, kw_only=True):
    """Every setting with its meaning is also in configs/edge.toml's [cache] section."""

    enabled: bool = True
    # The cache folder (several edge processes on one machine may share it); empty: beside the ledger.
    folder: str = ""
    # Entries and the semantic index's files together (the least recently used out first).
    size_limit_mb: Annotated[int, Meta(ge=1)] = 1024
    # Of the limit, the share kept for the index files (entries get the rest; 0 without a semantic level).
    index_share: Annotated[float, Meta(ge=0, lt=1)] = 0.5
    # Partitions with index files in the folder (past it, the least recently used lose theirs: their entries
    # still hit exactly), and what one edge process holds for them: memory-mapped ones (an open file each),
    # memory for the small ones read whole, seconds before an unused map is closed, memory for IVF indexes.
    max_partitions: Annotated[int, Meta(ge=1)] = 10_000
    max_maps: Annotated[int, Meta(ge=1)] = 64
    read_cache_mb: Annotated[int, Meta(ge=1)] = 64
    map_idle_s: Annotated[float, Meta(gt=0)] = 60.0
    index_memory_mb: Annotated[int, Meta(ge=1)] = 256
    ttl_s: Annotated[float, Meta(gt=0)] = 24 * 3600.0
    # The semantic level (an embedding of the last user turn, searched in the request's partition).
    semantic: bool = True
    # What the operator accepts: the share of semantic hits that may answer a different question. The
    # similarity threshold follows from it through the calibration curve (`nearshore cache-eval`), and the
    # live audit holds each partition to it: one whose measured rate is above it (the lower end of its 95%
    # interval) serves exact hits only until the rate is back.
    target_false_hit_rate: Annotated[float, Meta(ge=0, le=1)] = 0.01
    # The live audit: a semantic hit's region answer (already on its way) let finish in the background,
    # judged against the cached answer, never sent nor billed to the tenant (its cost is in /metrics).
    # Audited: every one of a partition's first `audit_first_hits` semantic hits, then `audit_share` of them.
    audit_share: Annotated[float, Meta(ge=0, le=1)] = 0.05
    audit_first_hits: Annotated[int, Meta(ge=0)] = 20
    audit_window: Annotated[int, Meta(ge=10)] = 200  # verdicts a partition's rate is measured over
    audit_max_concurrent: Annotated[int, Meta(ge=0)] = 4  # audits in flight at once (beyond: not audited)
    audit_timeout_s: Annotated[float, Meta(gt=0)] = 120.0  # the most an audited answer may take
    # Only temperature-0 requests are cached, except for these tenants' keys.
    any_temperature_tenants: list[str] = field(default_factory=list)
    # Who may be answered from whose entries: "tenant" (every key of a tenant shares them: one key's users
    # can plant an answer that another key's users get for the same question), "key" (each API key its
    # own), "user" (each key's end users, by the request's `user` field, apart; requests without one share
    # their key's scope).
    scope: Literal["tenant", "key", "user"] = "tenant"
    # Tenants whose keys share one scope across tenants (otherwise each tenant's entries are its own).
    shared_tenants: list[str] = field(default_factory=list)
    # Store answers cut at max_tokens (finish_reason "length") too.
    store_truncated: bool = False
    # A cached answer costs this share of the model's price (input and output).
    price_factor: Annotated[float, Meta(ge=0, le=1)] = 0.1
    # Where questions are embedded: on this edge (default) or by the nearest region's /v1/embeddings (an
    # edge that should not hold the model), which serves region_model.
    embed: Literal["local", "region"] = "local"
    region_model: str = "all-minilm-l6-v2"
    # A sentence-transformers folder replacing the embedded all-MiniLM-L6-v2.
    embedder_path: str = ""
    # What runs it: "auto-int8" (int8 matrix products in ONNX Runtime, 3x faster per query here, the same
    # threshold and false hits on the labelled sets: cache/embedder.py), "auto" (fp32), or one by name.
    embedder_backend: Literal["auto-int8", "auto", "numpy", "onnxruntime", "onnxruntime-int8"] = "auto-int8"
    # The pair judge decides the candidates the verifier cannot explain (its certain vetoes stay); its
    # probability threshold follows from target_false_hit_rate (cache/decision.py, JUDGE_CALIBRATION).
    judge: bool = True
    judge_path: str = ""  # a judge file replacing the shipped cache/data/judge/judge.safetensors
    # The judge's threshold where the live audit has not learned a partition's own (cache/audit_judge.py):
    # 0 takes it from target_false_hit_rate; 1.01 lets the judge serve only where the audit proved it.
    judge_threshold: Annotated[float, Meta(ge=0, le=1.01)] = 0.0
    # One cache for a city's edges (cache/city_share.py): each edge's stores, replacements and evictions
    # go to a stream in this Redis and every other edge applies them to its own store. "": this edge alone.
    share_redis_url: str = ""
    # The changes the stream keeps (a new edge rebuilds its replica from them).
    share_stream_max: Annotated[int, Meta(ge=1000)] = 200_000
