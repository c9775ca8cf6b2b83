"""One bill for a city's edges: every edge's ledger rows reach one PostgreSQL table, each exactly once
(``[ledger] postgres_url``).

The edge's own ledger file (and its spool) stays the durable buffer: a request is billed there before its
answer ends, as on one machine, and nothing on the request path waits for PostgreSQL. A shipper task reads
the rows after its mark (the ledger's rowids only grow: rows are never deleted) and inserts them into
``nearshore_usage`` with the request id as its key, ``ON CONFLICT DO NOTHING``; only once PostgreSQL has
committed does the mark move (a small file beside the ledger, replaced atomically). So a crash between the
two ships a batch again and PostgreSQL keeps one row each; PostgreSQL down for minutes costs nothing but
delay, the rows go as soon as it answers. At shutdown the shipper makes one last bounded attempt; an edge
started again on the same volume ships what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from edge.ledger import ReportRow, UsageRecord
from edge.pg_schema import CONNECT_TIMEOUT_S, PG_ERRORS, Table, connect, explain

log = logging.getLogger("nearshore.ledger")

TABLE = "nearshore_usage"
SCHEMA_VERSION = 1
SETTING = "ledger.postgres_url"
_FIELDS = UsageRecord.__struct_fields__
_PG_TYPES = {int: "BIGINT", float: "DOUBLE PRECISION", str: "TEXT"}
_COLUMNS = ("edge", *_FIELDS)
_DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (edge TEXT NOT NULL, "
    + ", ".join(
        f"{f.name} {_PG_TYPES[f.type]} NOT NULL{' PRIMARY KEY' if f.name == 'request_id' else ''}"
        for f in msgspec.structs.fields(UsageRecord)
    )
    + f"); CREATE INDEX IF NOT EXISTS {TABLE}_key_ts ON {TABLE} (key_id, ts)"
)
_TABLE = Table("ledger", SCHEMA_VERSION, TABLE, _DDL, _COLUMNS)
_MARKS = ", ".join(f"${i + 1}" for i in range(len(_COLUMNS)))
_INSERT = f"INSERT INTO {TABLE} ({', '.join(_COLUMNS)}) VALUES ({_MARKS}) ON CONFLICT (request_id) DO NOTHING"
_SELECT_AFTER = f"SELECT rowid, {', '.join(_FIELDS)} FROM usage WHERE rowid > ? ORDER BY rowid LIMIT ?"
BATCH_ROWS = 1000
SHIP_EVERY_S = 0.5
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
FINAL_SHIP_S = 10.0  # at shutdown, the most time spent on one last attempt
# One batch's insert; past it PostgreSQL is not answering on this connection (a server stopped mid-batch
# once held a shipper here for a minute, unaware): out of reach, the connection cut, the rows wait.
BATCH_TIMEOUT_S = 15.0


class Mark:
    """The last ledger rowid PostgreSQL has committed, for one target, in ``<ledger>.fleet-mark``; and the
    ledger's own id, made once, which names its edge in the city's table (pods of one Deployment share a
    config and a name; a volume is one edge's)."""

    def __init__(self, ledger: Path, url: str) -> None:
        self.path = ledger.with_name(ledger.name + ".fleet-mark")
        # Another database (a new fleet table) starts from the first row: re-sent rows are skipped there.
        self.target = hashlib.sha256(url.encode()).hexdigest()[:16]
        self.rowid = 0
        self.ledger_id = ""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            saved = json.loads(self.path.read_text())
            self.ledger_id = str(saved["ledger_id"])
            if saved["target"] == self.target:
                self.rowid = int(saved["rowid"])
        if not self.ledger_id:
            self.ledger_id = secrets.token_hex(4)
            self.advance(self.rowid)

    def advance(self, rowid: int) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        saved = {"target": self.target, "rowid": rowid, "ledger_id": self.ledger_id}
        temporary.write_text(json.dumps(saved))
        os.replace(temporary, self.path)
        self.rowid = rowid


class FleetLedger:
    """Ships one edge's ledger rows to the city's table; :meth:`run` until cancelled, then :meth:`close`."""

    def __init__(self, ledger_path: str | Path, url: str, edge: str) -> None:
        self.ledger_path = Path(ledger_path)
        self.url = url
        self.mark = Mark(self.ledger_path, url)
        self.edge = f"{edge}/{self.mark.ledger_id}"
        self.shipped_rows = 0  # since start
        self.behind = 0  # rows in the ledger not yet in PostgreSQL, as of the last look
        self.reachable = True
        self._conn: asyncpg.Connection | None = None
        self._reader = sqlite3.connect(f"file:{self.ledger_path}?mode=ro", uri=True, check_same_thread=False)
        self._reader.execute("PRAGMA busy_timeout = 1000")

    async def check(self) -> None:
        """At start: connect and make the table. A configuration that cannot work (refused credentials,
        no such database, a table from another release) is a StoreError, one line naming the setting; a
        server out of reach is only said (the rows wait in the ledger, as in any outage)."""
        try:
            await self._connect()
        except (OSError, TimeoutError) as exc:
            self.reachable = False
            log.warning("%s (the edge serves; its rows wait in the ledger)", explain(self.url, exc, SETTING))
        except PG_ERRORS as exc:
            raise explain(self.url, exc, SETTING) from None

    async def _connect(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            async with asyncio.timeout(BATCH_TIMEOUT_S):  # connecting, then the table checked
                self._conn = await connect(self.url, _TABLE, SETTING)
        return self._conn

    async def run(self) -> None:
        """Ship until cancelled: every SHIP_EVERY_S, everything after the mark, batch by batch."""
        failures = 0
        while True:
            try:
                await self.ship_all()
                if not self.reachable:
                    log.warning("%s: PostgreSQL is back; the bill is caught up", SETTING)
                self.reachable, failures = True, 0
                await asyncio.sleep(SHIP_EVERY_S)
            except sqlite3.Error as exc:  # the ledger file could not be read this time: the rows stay in it
                if not failures:
                    log.warning(
                        "%s: reading the ledger %s failed (%s); retrying", SETTING, self.ledger_path, exc
                    )
                await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
                failures += 1
            except Exception as exc:  # the shipper outlives any failure of its connection
                # PostgreSQL out of reach, the table replaced meanwhile (StoreError), or a connection left
                # mid-operation by a batch cut at its timeout (asyncpg's InternalClientError, "another
                # operation is in progress"): the connection goes, the rows wait in the ledger, the shipper
                # tries again. Before, anything but the first two ended the shipper for the edge's life.
                if self.reachable:
                    log.warning(
                        "%s: PostgreSQL out of reach (%s: %s): rows wait in the ledger",
                        SETTING,
                        type(exc).__name__,
                        exc,
                    )
                self.reachable = False
                self._cut()
                await asyncio.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)])
                failures += 1

    async def ship_all(self) -> int:
        """Ship every row after the mark; the rows shipped."""
        shipped = 0
        while True:
            rows = await asyncio.to_thread(self._rows_after, self.mark.rowid)
            if not rows:
                self.behind = 0
                if not shipped:  # a quiet edge still says at once when PostgreSQL has gone
                    await (await self._connect()).fetchval("SELECT 1", timeout=CONNECT_TIMEOUT_S)
                return shipped
            conn = await self._connect()
            async with asyncio.timeout(BATCH_TIMEOUT_S), conn.transaction():
                await conn.executemany(_INSERT, [(self.edge, *row[1:]) for row in rows])
            self.mark.advance(rows[-1][0])
            shipped += len(rows)
            self.shipped_rows += len(rows)
            self.behind = max(0, self.behind - len(rows))

    def _rows_after(self, rowid: int) -> list[tuple[Any, ...]]:
        rows = self._reader.execute(_SELECT_AFTER, (rowid, BATCH_ROWS)).fetchall()
        if rows:
            (last,) = self._reader.execute("SELECT coalesce(max(rowid), 0) FROM usage").fetchone()
            self.behind = last - rowid
        return rows

    async def close(self) -> None:
        """One last attempt, bounded: rows still in the ledger go at the next start on this volume."""
        self._cut()  # the shipping task was cancelled, perhaps mid-batch: a connection of its own
        try:
            async with asyncio.timeout(FINAL_SHIP_S):
                await self.ship_all()
        except Exception as exc:  # whatever it is, the process is stopping: the rows wait for the next start
            log.warning(
                "%s: %d rows not yet shipped at shutdown (%s); they go at the next start",
                SETTING,
                self.behind,
                exc or type(exc).__name__,
            )
        await self._drop()
        self._reader.close()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT_S)
            except Exception:  # one that will not close cleanly (mid-operation, server gone) is cut
                conn.terminate()

    def _cut(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()


def open_fleet_ledger(ledger_db: str, url: str, edge: str) -> FleetLedger:
    """The shipper, its table checked now (a wrong password or host stops the start in one line); the
    serving loop connects again (a connection belongs to its loop)."""
    fleet = FleetLedger(Path(ledger_db).expanduser(), url, edge)

    async def check() -> None:
        await fleet.check()
        await fleet._drop()

    asyncio.run(check())
    return fleet


def fleet_ledger_lifetime(fleet: FleetLedger):
    """Ship for as long as the app runs; at shutdown, one last bounded attempt."""

    async def lifetime(_app: object):
        task = asyncio.create_task(fleet.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await fleet.close()

    return lifetime


_REPORT = f"""
SELECT key_id, tenant, to_char(to_timestamp(ts) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, count(*),
       sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(cost_usd)
FROM {TABLE} WHERE ts >= $1 AND ts < $2
GROUP BY day, key_id, tenant ORDER BY day, key_id, tenant
"""


async def fleet_report(url: str, since: float | None, until: float | None, setting: str) -> list[ReportRow]:
    """Usage per key and UTC day across every edge of the city, as :meth:`Ledger.report` gives one's."""
    low = float("-inf") if since is None else since
    high = float("inf") if until is None else until
    try:
        conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S)
        try:
            exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", TABLE)
            rows = await conn.fetch(_REPORT, low, high) if exists else []
        finally:
            await conn.close()
    except PG_ERRORS as exc:
        raise explain(url, exc, setting) from None
    return [ReportRow.of(tuple(row)) for row in rows]
