"""What the edge's PostgreSQL stores (keys, the fleet's bill) share: one table each, made if missing under
an advisory lock (two edges starting at once must not both make it), its version in ``nearshore_schema``,
and a failure to connect said in one line naming the setting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg

# What a lost or refused connection raises.
PG_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
CONNECT_TIMEOUT_S = 5.0
_DDL_LOCK = 0x6E73686F7265  # "nshore": one lock for every store's tables


_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS nearshore_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)
_VERSION_OF = "SELECT version FROM nearshore_schema WHERE component = $1"
_SCHEMA_ROW = "INSERT INTO nearshore_schema VALUES ($1, $2) ON CONFLICT (component) DO NOTHING"


class StoreError(ValueError):
    """A PostgreSQL store cannot be used as configured: one line, naming the setting."""


@dataclass(frozen=True)
class Table:
    """One store's table: its component name and version in nearshore_schema, how to make it, and the
    columns this release reads."""

    component: str
    version: int
    name: str
    ddl: str
    columns: Sequence[str]


async def connect(url: str, table: Table, setting: str) -> asyncpg.Connection:
    """A connection with ``table`` made if there was none; raises what connecting raised, or StoreError
    when the table there is from another release."""
    conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
    try:
        await ensure_table(conn, table, setting)
    except BaseException:
        conn.terminate()
        raise
    return conn


async def ensure_table(conn: asyncpg.Connection, table: Table, setting: str) -> None:
    """Make ``table`` if there is none and record its version; StoreError when the table there is from
    another release (another version, or columns missing)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _DDL_LOCK)
        await conn.execute(_SCHEMA_TABLE)
        await conn.execute(_SCHEMA_ROW, table.component, table.version)
        await conn.execute(table.ddl)
        found = await conn.fetchval(
            "SELECT version FROM nearshore_schema WHERE component = $1", table.component
        )
        present = {
            row["column_name"]
            for row in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
                "AND table_schema = current_schema()",
                table.name,
            )
        }
    missing = [c for c in table.columns if c not in present]
    if found != table.version or missing:
        what = f"schema version {found}" if found != table.version else f"no {', '.join(missing)}"
        raise StoreError(
            f"{setting}: the table {table.name} is from another release ({what}; this one reads version "
            f"{table.version}): migrate it, or point at another database"
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
