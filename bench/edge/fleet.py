"""``bench edge --fleet``: the edge in a city's fleet mode beside the same edge alone, side by side in one
run (issue 35: what fleet mode costs a request).

Fleet mode is what the Kubernetes overlay runs: the keys in PostgreSQL (``keys.backend = "postgres"``,
changes pushed), every ledger row also shipped to PostgreSQL (``ledger.postgres_url``), the rate limits in
Redis (``limits.backend = "redis"``) and the cache shared through Redis (``cache.share_redis_url``). The
edge alone keeps its keys and ledger in SQLite files, its limits in memory and its cache to itself. One
PostgreSQL and one Redis, on this machine's loopback, serve the run; the edges, paths and load are the
same as for the edge alone (TLS off, one worker).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from pathlib import Path

from bench import peers
from bench.peers import Endpoint
from harness.postgres import PostgresServer
from harness.redis_server import RedisServer

SUFFIX = "-fleet"  # the path name of the edge in fleet mode, beside the edge alone


class CityStores:
    """The run's PostgreSQL and Redis, as a city's edges share them; ``stop()`` removes both."""

    def __init__(self, logs: Path) -> None:
        self.postgres = PostgresServer().start()
        try:
            self.redis = RedisServer(logs / "redis").start()
        except BaseException:
            self.postgres.remove()
            raise
        os.environ.update(self.postgres.env)  # the edges' password (PGPASSWORD), as a Secret gives it

    def sections(self) -> dict[str, dict[str, object]]:
        """The edge config's sections that make an edge one of the city's."""
        url = self.postgres.url()
        return {
            "keys": {"backend": "postgres", "postgres_url": url},
            "ledger": {"postgres_url": url},
            "limits": {"backend": "redis", "redis_url": self.redis.url},
            "cache": {"share_redis_url": self.redis.url},
        }

    def new_key(self) -> str:
        """A key in the city's table that no limit stops (made as `nearshore keys create --postgres` does)."""
        from edge.keys import store_call
        from edge.keys_pg import PgKeyStore  # asyncpg: imported where the bench runs

        async def create() -> str:
            store = await PgKeyStore(self.postgres.url()).open()
            try:
                plaintext, _ = await store_call(store, "create", "bench", rpm=10**9, tpm=10**12)
            finally:
                await store_call(store, "close")
            return plaintext

        # In a thread of its own: the bench's runner owns this thread's event loop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, create()).result()

    def stop(self) -> None:
        self.redis.stop()
        self.postgres.remove()


def start_edge(logs: Path, name: str, pacer_url: str, stores: CityStores, *, tls: bool) -> Endpoint:
    """The bench's edge (peers.start_edge) in fleet mode, named ``name`` + SUFFIX."""
    return peers.start_edge(
        logs, name + SUFFIX, pacer_url, tls=tls, sections=stores.sections(), api_key=stores.new_key()
    )
