"""The usage ledger: one durable row per request, committed before the response's last bytes leave.

Writes commit on the event loop's own thread, in groups: every record handed in during one turn of the
loop is inserted in one transaction at the end of that turn, then each waiter resumes. A commit in WAL
mode with ``synchronous=NORMAL`` writes the WAL without an fsync (tens of microseconds), which is cheaper
than handing records to a writer thread and back: waking a sleeping thread costs milliseconds on small
virtual machines, and the wait sits between a stream's last token and its ``[DONE]``.

Durability: a commit is in the WAL file (written to the OS, not fsynced) before :meth:`Ledger.record`
returns, so a killed or crashed process loses nothing it has acknowledged. Power loss or a kernel crash
may lose the last commits; surviving those would need ``synchronous=FULL`` (an fsync per commit, shared
by each group).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from pathlib import Path

import msgspec

log = logging.getLogger("nearshore.ledger")


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    ts: float  # epoch seconds
    key_id: str
    tenant: str
    model: str
    region: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cache_status: str  # "miss" | "exact" | "semantic" | "bypass"
    cost_usd: float
    status: str  # "ok" | "error" (the region failed or refused it) | "aborted" (the client left)
    http_status: int
    client_request_id: str = ""  # the id the client sent, if any (request_id is the edge's own, unique)
    error_code: str = ""  # the error the client got, e.g. "upstream_timeout"
    # A stream whose region died mid-answer and that another region finished: the first region (``region``
    # is the one that finished it).
    continued_from: str = ""
    # A fallback served it: the model the client asked for (``model`` is the one that served and priced it).
    fallback_from: str = ""
    attempts: int = 0  # requests sent to regions for it (failover, retries, fallbacks, continuations)
    bad_events: int = 0  # stream events from a region that did not parse and were skipped


class ReportRow(msgspec.Struct, frozen=True, kw_only=True):
    """One key's usage on one UTC day."""

    key_id: str
    tenant: str
    day: str  # YYYY-MM-DD, UTC
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float


_FIELDS = UsageRecord.__struct_fields__
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    request_id        TEXT NOT NULL,
    ts                REAL NOT NULL,
    key_id            TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    model             TEXT NOT NULL,
    region            TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    cached_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cache_status      TEXT NOT NULL,
    cost_usd          REAL NOT NULL,
    status            TEXT NOT NULL,
    http_status       INTEGER NOT NULL,
    client_request_id TEXT NOT NULL DEFAULT '',
    error_code        TEXT NOT NULL DEFAULT '',
    continued_from    TEXT NOT NULL DEFAULT '',
    fallback_from     TEXT NOT NULL DEFAULT '',
    attempts          INTEGER NOT NULL DEFAULT 0,
    bad_events        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_key_ts ON usage (key_id, ts);
"""
# Columns added since the first schema, for ledgers written by an older edge.
_ADDED_COLUMNS = {
    "client_request_id": "TEXT NOT NULL DEFAULT ''",
    "error_code": "TEXT NOT NULL DEFAULT ''",
    "continued_from": "TEXT NOT NULL DEFAULT ''",
    "fallback_from": "TEXT NOT NULL DEFAULT ''",
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "bad_events": "INTEGER NOT NULL DEFAULT 0",
}
_INSERT = f"INSERT INTO usage ({', '.join(_FIELDS)}) VALUES ({', '.join('?' * len(_FIELDS))})"
_REPORT = """
SELECT key_id, tenant, strftime('%Y-%m-%d', ts, 'unixepoch') AS day, count(*),
       sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(cost_usd)
FROM usage WHERE ts >= ? AND ts < ?
GROUP BY day, key_id, tenant ORDER BY day, key_id, tenant
"""

# A write waiting for its group's commit: the record and the future its writer awaits.
_Pending = tuple[UsageRecord, asyncio.Future[None]]


def _connect(path: Path) -> sqlite3.Connection:
    # Each connection is used by one thread at a time (the writer; readers under a lock), not one thread ever.
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    return db


class Ledger:
    """The ledger file: :meth:`record` from the event loop; reads from any thread.

    The reads are blocking SQLite queries: from an event loop, run them with ``asyncio.to_thread``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The read side: any thread, one query at a time.
        self._reader = _connect(self.path)
        self._reader.executescript(_SCHEMA)
        _add_missing_columns(self._reader)
        self._read_lock = threading.Lock()
        self._writer_db = _connect(self.path)
        self._pending: list[_Pending] = []
        self._flush_scheduled = False
        self._closed = False

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # --- the write side -------------------------------------------------------------------------------

    async def record(self, rec: UsageRecord) -> None:
        """Return once ``rec`` is committed; raise what the write raised if it failed.

        If the caller is cancelled while waiting, the row is still written.
        """
        if self._closed:
            raise RuntimeError("ledger is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((rec, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)  # after every callback ready now: their records join this commit
        await future

    async def close(self) -> None:
        """Write everything handed in so far, then close both connections."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        self._writer_db.close()
        with self._read_lock:
            self._reader.close()

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._write(self._writer_db, batch)
        except Exception as exc:  # a bug must not strand the waiters
            log.exception("ledger: unexpected error")
            _settle(batch, exc)

    def _write(self, db: sqlite3.Connection, batch: list[_Pending]) -> None:
        try:
            _insert(db, [rec for rec, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                request_id = getattr(batch[0][0], "request_id", "?")
                log.error("ledger write failed for request %s: %s", request_id, exc)
                _settle(batch, exc)
                return
            # One bad record must not fail the others that shared its commit: retry them one by one.
            log.warning("ledger group commit of %d failed (%s); retrying one by one", len(batch), exc)
            for pending in batch:
                self._write(db, [pending])
            return
        _settle(batch, None)

    # --- the read side --------------------------------------------------------------------------------

    def spent_usd(self, key_id: str) -> float:
        with self._read_lock:
            row = self._reader.execute(
                "SELECT coalesce(sum(cost_usd), 0.0) FROM usage WHERE key_id = ?", (key_id,)
            ).fetchone()
        return float(row[0])

    def report(self, since: float | None = None, until: float | None = None) -> list[ReportRow]:
        """Usage per key and UTC day for ``since <= ts < until`` (either bound may be open)."""
        bounds = (float("-inf") if since is None else since, float("inf") if until is None else until)
        with self._read_lock:
            rows = self._reader.execute(_REPORT, bounds).fetchall()
        return [
            ReportRow(
                key_id=key_id,
                tenant=tenant,
                day=day,
                requests=requests,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=completion,
                cost_usd=cost,
            )
            for key_id, tenant, day, requests, prompt, cached, completion, cost in rows
        ]


def _add_missing_columns(db: sqlite3.Connection) -> None:
    have = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for name, declaration in _ADDED_COLUMNS.items():
        if name not in have:
            try:
                db.execute(f"ALTER TABLE usage ADD COLUMN {name} {declaration}")
            except sqlite3.OperationalError as exc:  # another process added it a moment ago
                if "duplicate column" not in str(exc):
                    raise


def _insert(db: sqlite3.Connection, records: list[UsageRecord]) -> None:
    db.execute("BEGIN")
    try:
        db.executemany(_INSERT, [msgspec.structs.astuple(rec) for rec in records])
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # nothing to roll back if BEGIN itself failed
            db.execute("ROLLBACK")
        raise


def _settle(batch: list[_Pending], exc: BaseException | None) -> None:
    """Wake each waiter; one that was cancelled meanwhile is skipped (its row is written all the same)."""
    for _, future in batch:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
