"""What the edge's PostgreSQL stores (keys, the fleet's bill) share: one table each, made if missing under
an advisory lock (two edges starting at once must not both make it), its version in ``nearshore_schema``,
and a failure to connect said in one line naming the setting."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import asyncpg

# What a lost or refused connection raises.
PG_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
CONNECT_TIMEOUT_S = 5.0
_DDL_LOCK = 0x6E73686F7265  # "nshore": one lock for every store's tables


_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS nearshore_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)
_SCHEMA_ROW = "INSERT INTO nearshore_schema VALUES ($1, $2) ON CONFLICT (component) DO NOTHING"


class StoreError(ValueError):
    """A PostgreSQL store cannot be used as configured: one line, naming the setting."""


async def ensure_table(
    conn: asyncpg.Connection,
    *,
    component: str,
    version: int,
    ddl: str,
    table: str,
    columns: Sequence[str],
    setting: str,
) -> None:
    """Make ``table`` with ``ddl`` if there is none and record its ``version``; StoreError when the table
    there is from another release (another version, or columns missing)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK)
        await conn.execute(_SCHEMA_TABLE)
        await conn.execute(_SCHEMA_ROW, component, version)
        await conn.execute(ddl)
        found = await conn.fetchval("SELECT version FROM nearshore_schema WHERE component = $1", component)
        present = {
            row["column_name"]
            for row in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
                "AND table_schema = current_schema()",
                table,
            )
        }
    missing = [c for c in columns if c not in present]
    if found != version or missing:
        what = f"schema version {found}" if found != version else f"no {', '.join(missing)}"
        raise StoreError(
            f"{setting}: the table {table} is from another release ({what}; this one reads version "
            f"{version}): migrate it, or point at another database"
        )


def explain(url: str, exc: BaseException, setting: str) -> StoreError:
    """A failed connection as one line naming ``setting``."""
    where = urlsplit(url)
    target = f"{where.hostname or 'localhost'}:{where.port or 5432}"
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        return StoreError(f"{setting}: PostgreSQL at {target} refused the credentials: {exc}")
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return StoreError(f"{setting}: {exc} (create it first: createdb)")
    if isinstance(exc, OSError | TimeoutError):
        return StoreError(f"{setting}: PostgreSQL at {target} cannot be reached: {exc or 'timed out'}")
    return StoreError(f"{setting}: {type(exc).__name__}: {exc}")
