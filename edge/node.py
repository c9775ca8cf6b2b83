"""Build and run an edge proxy from its config."""

from __future__ import annotations

import asyncio
import logging
import resource
import sqlite3
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from cache.audit import AuditBook
from edge.app import EdgeState, create_app, create_metrics_app
from edge.billing import REGION_SEP, PriceTable
from edge.cache_audit import Auditor
from edge.cache_setup import cache_lifetime, make_cache
from edge.config import EdgeConfig, FallbackConfig, file_problems, open_named_file, value_problems
from edge.degraded_policy import check_degraded, make_degraded
from edge.guard import GuardedRunner, GuardSettings, head_timer_middleware
from edge.inflight import STOP_GRACE_S, end_revoked
from edge.key_backend import key_lifetime, open_keys, warn_without_keys
from edge.keys_admin import admin_token
from edge.ledger import Ledger
from edge.limits import RateLimiter
from edge.limits_memory import MemoryLimiter
from edge.metrics import EdgeMetrics
from edge.pipeline import Pipeline
from edge.pool_gate import make_gates
from edge.response_store import ResponseStore
from edge.spend_budget import BudgetBook, SharedBudgets
from edge.stages import default_pipeline
from edge.token_count import make_counter
from edge.upstream import UpstreamPool
from geo.catalog import GeoConfig, check_catalog, edge_place
from geo.locate import GeoDatabaseError, Location, Locator
from geo.rightsize import check_aliases
from nearshore.gc_settle import settle_after_start
from nearshore.httpkit import install_uvloop
from nearshore.listen import Address, Listener, inherit, listen, serve, server_address, start_sites
from nearshore.tls import ensure_dev_certificate, server_context

log = logging.getLogger("nearshore.edge")


def make_locator(geo: GeoConfig) -> Locator:
    """The GeoIP reader; a database that cannot be used stops the start with the key and the path."""
    place = edge_place(geo)
    edge = Location(place.latitude, place.longitude, place.country, place.continent, geo.city)
    try:
        return Locator(
            geo.database or None, edge, geo.trusted_proxies, fallback_to_embedded=geo.fallback_to_embedded
        )
    except GeoDatabaseError as exc:
        raise ValueError(f"geo.database: {exc}") from None


def check_fallbacks(fallbacks: FallbackConfig, models: list[str]) -> list[str]:
    """Every chain names served models, none itself."""
    problems = []
    for table, chains in (("fallbacks.models", fallbacks.models), ("fallbacks.context", fallbacks.context)):
        for model, chain in chains.items():
            if model not in models:
                problems.append(f"{table}: {model!r} is not in models")
            for fallback in chain:
                if fallback not in models:
                    problems.append(f"{table}.{model}: fallback {fallback!r} is not in models")
                elif fallback == model:
                    problems.append(f"{table}.{model}: a model cannot fall back to itself")
    return problems


def check_config(config: EdgeConfig) -> None:
    """Rules a schema cannot say; each message names the key."""
    if problems := value_problems(config) + file_problems(config):
        raise ValueError("; ".join(problems))
    if not config.regions:
        raise ValueError("regions: at least one region is needed ([[regions]] name = ..., url = ...)")
    problems = (
        check_catalog(config.regions, config.geo, config.models)
        + check_aliases(config.aliases, config.models)
        + check_fallbacks(config.fallbacks, config.models)
        + check_degraded(config)
    )
    if problems:
        raise ValueError("; ".join(problems))
    if bool(config.tls.cert) != bool(config.tls.key):
        raise ValueError("tls.cert and tls.key go together")
    files = {
        "tls.cert": config.tls.cert,
        "tls.key": config.tls.key,
        "upstream.ca": config.upstream.ca,
        "upstream.client_cert": config.upstream.client_cert,
        "upstream.client_key": config.upstream.client_key,
        "tokenizer.gguf": config.tokenizer.gguf,
        # a missing GeoIP file is the locator's to refuse, or to replace with the embedded one
        "geo.database": "" if config.geo.fallback_to_embedded else config.geo.database,
    }
    for key, path in files.items():
        if path and not Path(path).expanduser().is_file():
            raise ValueError(f"{key}: file not found: {path}")
    if bool(config.upstream.client_cert) != bool(config.upstream.client_key):
        raise ValueError("upstream.client_cert and upstream.client_key go together")
    _check_prices(config)
    if config.server.workers > 1 and config.limits.backend != "redis":
        raise ValueError(
            'server.workers: more than one worker needs limits.backend = "redis" (each worker is its own '
            "process: only a shared store keeps rate limits and budgets exact across them)"
        )


def _check_prices(config: EdgeConfig) -> None:
    # A served name without a price would be billed $0 even on a budgeted key: say so at start instead.
    for model in config.models:
        price = config.prices.get(model)
        if price is None:
            raise ValueError(
                f'prices."{model}": no price for a served model (input, cached_input, output; or free = true)'
            )
        if problem := price.problem():
            raise ValueError(f'prices."{model}": {problem}')
    regions = {r.name for r in config.regions}
    for name, price in config.prices.items():
        if REGION_SEP not in name:
            continue
        model, region = name.split(REGION_SEP, 1)
        if model not in config.models or region not in regions:
            raise ValueError(
                f'prices."{name}": a region\'s own price names a served model and a region '
                f"(models: {', '.join(config.models)}; regions: {', '.join(sorted(regions))})"
            )
        if problem := price.problem():
            raise ValueError(f'prices."{name}": {problem}')


def check_files(config: EdgeConfig) -> None:
    """The ledger and key store open as the edge will open them, or one line naming the setting: a
    ``server.workers`` supervisor checks before it starts any worker (else each would print it)."""
    files = [("ledger_db", config.ledger_db)]
    if config.keys.backend == "sqlite":
        files.append(("keys_db", config.keys_db))
    for key, path in files:
        open_named_file(key, Path(path).expanduser(), _open_sqlite).close()
    open_named_file("responses.db", config.responses.path(config.ledger_db), _open_sqlite).close()


def _open_sqlite(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA schema_version")  # a file that is not a database says so here, not at connect
    except BaseException:
        db.close()
        raise
    return db


def make_limiter(config: EdgeConfig) -> RateLimiter:
    if config.limits.backend == "redis":
        from edge.limits_redis import RedisLimiter  # redis-py: loaded only by an edge that uses it

        # Each process falls back alone while Redis is away: to its share of every key's limits.
        processes = config.limits.edges * config.server.workers
        return RedisLimiter(config.limits.redis_url, fail_mode=config.limits.fail_mode, workers=processes)
    return MemoryLimiter()


def build_edge_app(
    config: EdgeConfig, pipeline: Pipeline | None = None, metrics: Listener | None = None
) -> web.Application:
    """The edge from its config; ``pipeline`` replaces the default stages (tests add one); ``metrics``: the
    metrics listener already bound (else the app binds ``metrics.port`` when it starts)."""
    check_config(config)
    limiter = make_limiter(config)
    ledger = open_named_file("ledger_db", Path(config.ledger_db).expanduser(), Ledger)
    keys = open_keys(config)
    token = admin_token(config.admin.token_file)
    responses = open_named_file(
        "responses.db",
        config.responses.path(config.ledger_db),
        lambda path: ResponseStore(
            path, config.responses.keep_days, max_tenant_bytes=config.responses.max_tenant_bytes
        ),
    )
    warn_without_keys(keys)
    # Edges (and workers) that share limits through Redis share budgets there too.
    budget = None
    if config.limits.backend == "redis":
        from edge.limits_redis import RedisLimiter

        assert isinstance(limiter, RedisLimiter)
        budget = SharedBudgets(limiter, BudgetBook(ledger.spent_usd))
    state = EdgeState(
        config=config,
        keys=keys,
        limiter=limiter,
        ledger=ledger,
        responses=responses,
        prices=PriceTable(config.prices),
        counter=make_counter(config.tokenizer.gguf),
        pool=UpstreamPool(config.regions, config.upstream, config.geo, config.models),
        metrics=EdgeMetrics(tenant_labels=config.metrics.tenant_labels),
        budget=budget,  # type: ignore[arg-type]
        locator=make_locator(config.geo),
        admin_token=token,
    )
    state.gates = make_gates(config.pools, state.pool.router.replicas)
    state.cache, state.cache_off = make_cache(config, state.pool)
    if state.cache is not None:
        settings = config.cache
        state.cache.audit = AuditBook(
            settings.target_false_hit_rate,
            settings.audit_share,
            settings.audit_first_hits,
            settings.audit_window,
        )
        state.auditor = Auditor(state.cache, config, state.metrics, state.prices, state.in_background)
    state.aliases = {a.name: a for a in config.aliases}
    state.degraded = make_degraded(config)
    if pipeline is None and not config.geo.route:
        pipeline = default_pipeline().without("route")
    app = create_app(state, pipeline)
    app.middlewares.insert(0, head_timer_middleware(config.server.keepalive_timeout_s))
    app.cleanup_ctx.append(key_lifetime(keys, lambda: end_revoked(state.inflight, state.keys)))
    app.cleanup_ctx.append(cache_lifetime(state))
    if config.ledger.postgres_url:
        from edge.ledger_pg import fleet_ledger_lifetime, open_fleet_ledger  # asyncpg only where used

        state.fleet_ledger = open_fleet_ledger(config.ledger_db, config.ledger.postgres_url, config.name)
        app.cleanup_ctx.append(fleet_ledger_lifetime(state.fleet_ledger))
    if config.metrics.port:
        app.cleanup_ctx.append(_metrics_listener(state, metrics))
    return app


def _metrics_listener(state: EdgeState, bound: Listener | None):
    """Serve /metrics (and /health) for the operator on their own listener, loopback by default."""

    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        listener = bound or listen(metrics_address(state.config))
        runner = web.AppRunner(create_metrics_app(state), access_log=None)
        await runner.setup()
        await start_sites(runner, listener)
        log.info("metrics on http://%s:%d/metrics", listener.address.host, listener.port)
        yield
        await runner.cleanup()

    return lifetime


@dataclass
class EdgeListeners:
    """The edge's sockets, bound before it is built: a port that is taken stops the start at once."""

    server: Listener
    metrics: Listener | None  # None with metrics.port = 0


def metrics_address(config: EdgeConfig, worker: int | None = None) -> Address:
    """The operator's listener; worker ``i`` of ``server.workers`` has ``metrics.port + i`` of its own."""
    m = config.metrics
    if worker is None:
        return Address("metrics.port", m.host, m.port)
    n = config.server.workers
    why = f"metrics.port + {worker}, because server.workers = {n}: worker i listens on metrics.port + i"
    return Address("metrics.port", m.host, m.port + worker, why=why)


def open_listeners(
    config: EdgeConfig, port: int | None, worker: int | None, inherited: dict[str, list[int]]
) -> EdgeListeners:
    """Bind the edge's listeners, or take over those its supervisor bound (``inherited``: fds by setting);
    ``port``: the command line's ``--port``."""

    def one(address: Address) -> Listener:
        fds = inherited.get(address.setting)
        return inherit(address, fds) if fds else listen(address)

    server = one(server_address(config.server.host, config.server.port, port))
    return EdgeListeners(server, one(metrics_address(config, worker)) if config.metrics.port else None)


def edge_tls_context(config: EdgeConfig) -> ssl.SSLContext | None:
    if not config.tls.enabled:
        return None
    if config.tls.cert:
        return server_context(Path(config.tls.cert), Path(config.tls.key))
    cert, key = ensure_dev_certificate(Path(config.tls.dev_cert_dir).expanduser())
    log.info("serving HTTPS with the development certificate %s", cert)
    return server_context(cert, key)


def _raise_fd_limit() -> None:
    # Thousands of idle client connections each hold a descriptor.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_edge(app: web.Application, config: EdgeConfig, listener: Listener, worker: int | None = None) -> None:
    """Serve on ``listener`` until SIGTERM; ``worker``: one of ``server.workers`` processes sharing it."""
    install_uvloop()
    _raise_fd_limit()
    context = edge_tls_context(config)
    host = config.server.host
    scheme = "https" if context else "http"
    server = config.server
    # TLS is the runner's: it counts and times each socket from accept, handshake included.
    settings = GuardSettings(server.header_timeout_s, server.max_connections, tls=context)
    runner = GuardedRunner(
        app,
        settings=settings,
        handler_cancellation=True,
        access_log=None,
        # Bodies are inflated by nearshore.bodies, bounded, with OpenAI-shaped errors for every encoding.
        auto_decompress=False,
        keepalive_timeout=server.keepalive_timeout_s,
        # The app's own drain (edge/inflight.py) gives the requests in flight server.shutdown_timeout_s and
        # then ends those still running; what aiohttp waits for after that is a margin, not a second wait.
        shutdown_timeout=STOP_GRACE_S,
    )

    def announce(actual: int) -> None:
        settle_after_start()  # serving now: start-up's objects leave the collector's scans
        log.info(
            "edge %s%s serving on %s://%s:%d -> %s",
            config.name,
            "" if worker is None else f" (worker {worker + 1} of {config.server.workers})",
            scheme,
            host,
            actual,
            ", ".join(f"{r.name} ({', '.join(r.urls())})" for r in config.regions),
        )

    asyncio.run(serve(runner, listener, on_ready=announce))
