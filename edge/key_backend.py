"""Which key store an edge reads (``[keys] backend``), opened at start, kept fresh while it runs.

SQLite (one machine): the file named by ``keys_db``, watched for other processes' commits. PostgreSQL (a
city's edges): the table read at start, then every change pushed to each edge (edge/keys_pg.py). A store
that cannot be used stops the start with one line naming its setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from edge.config import EdgeConfig, open_named_file
from edge.key_watch import refresh_keys
from edge.keys import KeyStore, KnownKeys

log = logging.getLogger("nearshore.edge")

# How often the SQLite store is asked whether another process committed (one PRAGMA, off the request path)
# where its files cannot be watched; where they can, a commit is checked when the kernel says the file was
# written, and this slower poll is a backstop (an idle edge polling ten times a second spent 2.5 ms of CPU a
# second; once a second, 0.3 ms).
KEY_REFRESH_S = 0.1
KEY_WATCHED_REFRESH_S = 1.0


def open_keys(config: EdgeConfig) -> KnownKeys:
    """The store with its copy loaded; ValueError (one line naming the setting) when it cannot be used."""
    if config.keys.backend == "postgres":
        from edge.keys_pg import PgKeyStore  # asyncpg only where it is used

        store = PgKeyStore(config.keys.postgres_url, config.keys.offline_grace_s)
        # Read the table now, on a loop of its own: a wrong password or host stops the start here. The
        # serving loop connects again (a connection belongs to its loop) and listens from then on.
        asyncio.run(_load_once(store))
        return store
    return open_named_file("keys_db", Path(config.keys_db).expanduser(), KeyStore)


async def _load_once(store: KnownKeys) -> None:
    from edge.keys_pg import PgKeyStore

    assert isinstance(store, PgKeyStore)
    await store.open()
    await store.close()


def warn_without_keys(store: KnownKeys) -> None:
    """A store with no usable key (a mistyped keys_db, most often) answers every request 401: say so at
    start. Not a refusal: keys created after the start work at once."""
    if store.active_keys():
        return
    if isinstance(store, KeyStore):
        what = "is new and empty" if store.created else "holds no active key"
        log.warning(
            "keys_db: the key store %s %s: every request gets 401 until keys are created "
            "(nearshore keys create --db %s --tenant NAME)",
            store.path,
            what,
            store.path,
        )
    else:
        log.warning(
            "keys.postgres_url: the key table holds no active key: every request gets 401 until keys are "
            "created (nearshore keys create --postgres URL --tenant NAME)"
        )


def key_lifetime(store: KnownKeys, reloaded: Callable[[], object]):
    """Keep the copy fresh for as long as the app runs (keys created, changed or revoked elsewhere);
    ``reloaded`` runs after each change (the edge ends the requests in flight of revoked keys)."""

    async def lifetime(_app: web.Application) -> AsyncIterator[None]:
        if isinstance(store, KeyStore):
            task = asyncio.create_task(refresh_keys(store, KEY_REFRESH_S, reloaded, KEY_WATCHED_REFRESH_S))
        else:
            task = asyncio.create_task(store.watch(reloaded))  # type: ignore[attr-defined]
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if not isinstance(store, KeyStore):
            await store.close()  # type: ignore[attr-defined]

    return lifetime
