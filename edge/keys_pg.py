"""API keys in PostgreSQL, so that a city's edges share one key table (``keys.backend = "postgres"``).

The table holds what the SQLite store holds (the secret only as its sha256). Every edge keeps the same
in-memory copy the SQLite store keeps (:class:`edge.keys.KnownKeys`: requests never query), and keeps it
exact by push, not by polling the table: a trigger sends each changed key_id on the channel
``nearshore_keys`` (whoever changed the row: ``nearshore keys``, the admin API, plain SQL), and the edge,
LISTENing, reads those rows again. The copy is only ever written from rows read back from the table, one
reader at a time, so a request in flight that still holds an old record can never bring it back.

Out of reach (PostgreSQL stopped, the network gone): the edge keeps serving the keys it knows for
``keys.offline_grace_s``, answers a key it does not know 503 ``keys_unavailable`` (it may have been created
meanwhile), and after the grace answers every key so; it reconnects on its own and reloads the whole table
(changes made while it was away sent no notice it could hear).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from edge.keys import KEY_PREFIX, ApiKey, KeyChange, KnownKeys, hash_secret, new_key
from edge.pg_schema import CONNECT_TIMEOUT_S, PG_ERRORS, StoreError, Table, connect, explain
from edge.pg_url import postgres_url_problem

log = logging.getLogger("nearshore.keys")

TABLE = "nearshore_api_keys"
CHANNEL = "nearshore_keys"
# The table's layout; a table left by another release says its version in nearshore_schema.
SCHEMA_VERSION = 1
_COLUMNS = (
    "key_id",
    "secret_sha256",
    "tenant",
    "tier",
    "rpm",
    "tpm",
    "models",
    "budget_usd",
    "revoked",
    "created_at",
    "updated_at",
    "debug",
    "substitute",
)
_DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key_id        TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    tier          TEXT NOT NULL,
    rpm           BIGINT NOT NULL,
    tpm           BIGINT NOT NULL,
    models        TEXT[] NOT NULL,
    budget_usd    DOUBLE PRECISION,
    revoked       BOOLEAN NOT NULL DEFAULT FALSE,
    created_at    DOUBLE PRECISION NOT NULL,
    updated_at    DOUBLE PRECISION NOT NULL,
    debug         BOOLEAN NOT NULL DEFAULT FALSE,
    substitute    BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE OR REPLACE FUNCTION nearshore_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', COALESCE(NEW.key_id, OLD.key_id));
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER nearshore_key_changed AFTER INSERT OR UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION nearshore_key_changed();
"""
# How often a quiet listening connection is asked whether it still answers (a vanished host closes no socket).
_PING_EVERY_S = 2.0
_RECONNECT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)


class KeysUnavailable(ConnectionError):
    """An admin operation found PostgreSQL out of reach (the request path is served from the copy)."""


_TABLE = Table("keys", SCHEMA_VERSION, TABLE, _DDL, _COLUMNS)
_Errors = PG_ERRORS
KeyStoreError = StoreError


def check_url(url: str, setting: str = "keys.postgres_url") -> None:
    if problem := postgres_url_problem(url, setting):
        raise KeyStoreError(problem)


def _record(row: Any) -> tuple[ApiKey, str]:
    key = ApiKey(
        key_id=row["key_id"],
        tenant=row["tenant"],
        tier=row["tier"],
        rpm=row["rpm"],
        tpm=row["tpm"],
        models=list(row["models"]),
        budget_usd=row["budget_usd"],
        revoked=row["revoked"],
        created_at=row["created_at"],
        debug=row["debug"],
        substitute=row["substitute"],
    )
    return key, row["secret_sha256"]


class PgKeyStore(KnownKeys):
    """The key table in PostgreSQL. One instance per process, on one event loop. Admin calls and the
    watcher share one connection (a lock keeps them apart; notices arrive between them)."""

    def __init__(self, url: str, offline_grace_s: float = 300.0, setting: str = "keys.postgres_url") -> None:
        check_url(url, setting)
        self.url = url
        self.setting = setting
        self.offline_grace_s = offline_grace_s
        self._cache = {}
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._changed: asyncio.Queue[str | None] = asyncio.Queue()  # key ids; None: the connection ended
        # When the store was last found out of reach (None: it is reachable), on the monotonic clock.
        self._lost_at: float | None = None
        self.reloads = 0  # whole-table loads since the start (each reconnection makes one)

    def __repr__(self) -> str:
        return f"PgKeyStore({urlsplit(self.url).hostname!r}, keys={len(self._cache)})"

    # --- reachability --------------------------------------------------------------------------------

    def out_of_reach(self) -> bool:
        return self._lost_at is not None

    def out_of_reach_s(self) -> float:
        return 0.0 if self._lost_at is None else time.monotonic() - self._lost_at

    def trusted(self) -> bool:
        return self._lost_at is None or time.monotonic() - self._lost_at < self.offline_grace_s

    # --- connection -----------------------------------------------------------------------------------

    async def open(self) -> PgKeyStore:
        """Connect, make the table if there is none, LISTEN, and load the copy; KeyStoreError (one line
        naming the setting) when it cannot."""
        try:
            await self._connect()
        except KeyStoreError:
            raise
        except _Errors as exc:
            raise explain(self.url, exc, self.setting) from None
        return self

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(*_Errors):
                await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT_S)

    async def _connect(self) -> None:
        conn = await connect(self.url, _TABLE, self.setting)
        try:
            # LISTEN before the load: a change committed in between is then both loaded and notified.
            await conn.add_listener(CHANNEL, self._on_notice)
            conn.add_termination_listener(self._on_end)
            rows = await conn.fetch(f"SELECT * FROM {TABLE}")
        except BaseException:
            conn.terminate()
            raise
        self._cache = {row["key_id"]: _record(row) for row in rows}
        self._conn = conn
        self._lost_at = None
        self.reloads += 1

    def _on_notice(self, conn: object, _pid: int, _channel: str, key_id: str) -> None:
        self._changed.put_nowait(key_id)

    def _on_end(self, conn: object) -> None:
        """The connection ended (the server went, the network broke): wake the watcher. A connection this
        store closed itself is no longer its connection by then, and says nothing."""
        if conn is self._conn:
            self._changed.put_nowait(None)

    # --- keeping the copy exact (a task on the edge's loop) -------------------------------------------

    async def watch(self, reloaded: Callable[[], object] | None = None) -> None:
        """Apply every notified change to the copy until cancelled; ``reloaded`` runs after each change
        (the edge ends the requests in flight of keys revoked meanwhile). Reconnects when the store goes."""
        attempt = 0
        # The notices' queue belongs to this (the serving) loop; nothing before it could be waited on.
        self._changed = asyncio.Queue()
        while True:
            try:
                if self._conn is None or self._conn.is_closed():
                    await self._connect()
                    if attempt:
                        log.warning(
                            "%s: PostgreSQL is back; %d keys reloaded", self.setting, len(self._cache)
                        )
                    attempt = 0
                    if reloaded is not None:
                        reloaded()
                changed = await self._next_changes()
                if changed:
                    await self._reload(changed)
                    if reloaded is not None:
                        reloaded()
            except (*_Errors, StoreError) as exc:  # StoreError: the table was replaced meanwhile
                if self._lost_at is None:
                    self._lost_at = time.monotonic()
                    log.warning(
                        "%s: PostgreSQL out of reach (%s): known keys served %.0f s more, unknown ones 503",
                        self.setting,
                        exc or type(exc).__name__,
                        self.offline_grace_s,
                    )
                await self.close()
                await asyncio.sleep(_RECONNECT_BACKOFF_S[min(attempt, len(_RECONNECT_BACKOFF_S) - 1)])
                attempt += 1

    async def _next_changes(self) -> set[str]:
        """The key ids changed since the last call (waiting for at least one, or a ping's worth of time);
        raises when the connection has ended or stopped answering."""
        try:
            first = await asyncio.wait_for(self._changed.get(), _PING_EVERY_S)
        except TimeoutError:
            async with self._lock:
                await self._live().fetchval("SELECT 1", timeout=_PING_EVERY_S)
            return set()
        pending = [first]
        while not self._changed.empty():
            pending.append(self._changed.get_nowait())
        if None in pending:
            raise ConnectionResetError("the connection to PostgreSQL ended")
        return set(pending)  # type: ignore[arg-type]

    async def _reload(self, key_ids: Iterable[str]) -> None:
        wanted = list(key_ids)
        async with self._lock:
            rows = await self._live().fetch(f"SELECT * FROM {TABLE} WHERE key_id = ANY($1::text[])", wanted)
        copy = dict(self._cache)
        for key_id in wanted:
            copy.pop(key_id, None)  # deleted rows stay gone
        copy.update((row["key_id"], _record(row)) for row in rows)
        self._cache = copy  # replaced whole: the request path never sees a half-applied batch

    def _live(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            raise ConnectionResetError("not connected to PostgreSQL")
        return self._conn

    @contextlib.asynccontextmanager
    async def _admin(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection for one admin operation, alone on it; PostgreSQL out of reach is
        KeysUnavailable (the admin API's 503), a value it refuses stays the caller's error."""
        async with self._lock:
            try:
                yield self._live()
            except (OSError, TimeoutError, asyncpg.InterfaceError) as exc:
                raise KeysUnavailable(f"{self.setting}: PostgreSQL out of reach: {exc}") from None

    # --- admin ----------------------------------------------------------------------------------------

    async def create(self, tenant: str, **settings: object) -> tuple[str, ApiKey]:
        """Issue a key: ``(plaintext, record)``; the plaintext exists only in the return value."""
        while True:
            secret, key = new_key(tenant, **settings)
            values = (
                key.key_id,
                hash_secret(secret),
                key.tenant,
                key.tier,
                key.rpm,
                key.tpm,
                key.models,
                key.budget_usd,
                key.revoked,
                key.created_at,
                key.created_at,
                key.debug,
                key.substitute,
            )
            marks = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
            async with self._admin() as conn:
                try:
                    await conn.execute(
                        f"INSERT INTO {TABLE} ({', '.join(_COLUMNS)}) VALUES ({marks})", *values
                    )
                except asyncpg.UniqueViolationError:  # a key_id collision (1 in 2**48 per pair)
                    continue
            self._cache = {**self._cache, key.key_id: (key, values[1])}
            return f"{KEY_PREFIX}{key.key_id}-{secret}", key

    async def update(self, key_id: str, change: KeyChange) -> ApiKey | None:
        """Change a key's limits or rights; None when there is no such key."""
        async with self._admin() as conn, conn.transaction():
            row = await conn.fetchrow(f"SELECT * FROM {TABLE} WHERE key_id = $1 FOR UPDATE", key_id)
            if row is None:
                return None
            key = change.applied_to(_record(row)[0])
            await conn.execute(
                f"UPDATE {TABLE} SET tier = $2, rpm = $3, tpm = $4, models = $5, budget_usd = $6, "
                "debug = $7, substitute = $8, updated_at = $9 WHERE key_id = $1",
                key_id,
                key.tier,
                key.rpm,
                key.tpm,
                key.models,
                key.budget_usd,
                key.debug,
                key.substitute,
                time.time(),
            )
        return key

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key; False when there is no such key or it was already revoked."""
        async with self._admin() as conn:
            status = await conn.execute(
                f"UPDATE {TABLE} SET revoked = TRUE, updated_at = $2 WHERE key_id = $1 AND NOT revoked",
                key_id,
                time.time(),
            )
        return status != "UPDATE 0"

    async def list(self) -> list[ApiKey]:
        async with self._admin() as conn:
            rows = await conn.fetch(f"SELECT * FROM {TABLE} ORDER BY created_at, key_id")
        return [_record(row)[0] for row in rows]

    async def get(self, key_id: str) -> ApiKey | None:
        async with self._admin() as conn:
            row = await conn.fetchrow(f"SELECT * FROM {TABLE} WHERE key_id = $1", key_id)
        return None if row is None else _record(row)[0]
