"""The usage ledger: one durable row per request, written before the response's last bytes leave.

Writes commit on the event loop's own thread, in groups: every record handed in during one turn of the
loop is inserted in one transaction at the end of that turn, then each waiter resumes. A commit in WAL
mode with ``synchronous=NORMAL`` writes the WAL without an fsync (tens of microseconds), which is cheaper
than handing records to a writer thread and back: waking a sleeping thread costs milliseconds on small
virtual machines, and the wait sits between a stream's last token and its ``[DONE]``. Copying the WAL into
the database (a checkpoint, which syncs both files) is left to a thread of the ledger's own
(:mod:`nearshore.wal_checkpoint`): SQLite's default ran it inside every ~350th commit, on the loop, for
5-10 ms each time here.

The loop never waits for the file longer than another worker's commit takes (a 5 ms busy timeout).
When the file cannot take a group (another process holds its write lock, the disk is full, it went
read-only), the rows go to the spool (:mod:`edge.ledger_spool`, as durable) and a replayer moves them
into the ledger, off the loop, once it takes writes again. Only when the spool cannot be written either
(the same full disk) are rows held in memory, retried, and new work refused (:meth:`Ledger.accepting`;
``/health`` says why) until the ledger or the spool takes them.

Durability: a commit is in the WAL file (written to the OS, not fsynced) before :meth:`Ledger.record`
returns, so a killed or crashed process loses nothing it has acknowledged. Power loss or a kernel crash
may lose the last commits; surviving those would need ``synchronous=FULL`` (an fsync per commit, shared
by each group). Rows held in memory (both files refused them) are lost if the process dies before either
takes them: at most the requests in flight when the disk filled, as new ones are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from pathlib import Path

import msgspec

from edge.ledger_spool import Spool
from edge.sqlite_columns import add_missing_columns
from nearshore.wal_checkpoint import WalCheckpointer, leave_checkpoints_out

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
    # What the response cache did (edge/stages/cache.py): "bypass" (not looked up: no cache, or a request it
    # does not keep, such as an embedding or a sampled answer), "miss" (looked up; a region answered), or
    # the hit that answered: "exact" or "semantic" (a semantic lookup may find the exact question too).
    cache_status: str
    cost_usd: float
    status: str  # "ok" | "error" (the region failed or refused it) | "aborted" (the client left)
    http_status: int
    client_request_id: str = ""  # the id the client sent, if any (request_id is the edge's own, unique)
    error_code: str = ""  # the error the client got, e.g. "upstream_timeout"
    # A stream whose region died mid-answer and that another region finished: the first region (``region``
    # is the one that finished it).
    continued_from: str = ""
    # A continued answer: each region that served part of it and its completion tokens, "a:6,b:14" (the
    # cost is each part at its region's price, the prompt at the first's).
    served_by: str = ""
    # A fallback served it: the model the client asked for (``model`` is the one that served and priced it).
    fallback_from: str = ""
    attempts: int = 0  # requests sent to regions for it (failover, retries, fallbacks, continuations)
    bad_events: int = 0  # stream events from a region that did not parse and were skipped
    # What shaped the answer: "tools", "json_schema", "json_object", "guided_json" (regex, grammar, choice),
    # or "" for free text; and how many choices it asked for (n): its completion tokens are all of theirs.
    output: str = ""
    choices: int = 1
    # "cable-cut": every remote region of its model was unreachable and the degraded tier answered it (the
    # cache: see cache_status; a local region: see region) or refused it (edge/degraded.py); else "".
    degraded: str = ""


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

    @classmethod
    def of(cls, row: tuple) -> ReportRow:
        """From a report query's row: key_id, tenant, day, requests, the three token sums, the cost."""
        key_id, tenant, day, requests, prompt, cached, completion, cost = row
        return cls(
            key_id=key_id,
            tenant=tenant,
            day=day,
            requests=requests,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            cost_usd=cost,
        )


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
    served_by         TEXT NOT NULL DEFAULT '',
    fallback_from     TEXT NOT NULL DEFAULT '',
    attempts          INTEGER NOT NULL DEFAULT 0,
    bad_events        INTEGER NOT NULL DEFAULT 0,
    output            TEXT NOT NULL DEFAULT '',
    choices           INTEGER NOT NULL DEFAULT 1,
    degraded          TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS usage_key_ts ON usage (key_id, ts);
CREATE INDEX IF NOT EXISTS usage_request ON usage (request_id);
"""
# Columns added since the first schema, for ledgers written by an older edge.
_ADDED_COLUMNS = {
    "client_request_id": "TEXT NOT NULL DEFAULT ''",
    "error_code": "TEXT NOT NULL DEFAULT ''",
    "continued_from": "TEXT NOT NULL DEFAULT ''",
    "fallback_from": "TEXT NOT NULL DEFAULT ''",
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "bad_events": "INTEGER NOT NULL DEFAULT 0",
    "output": "TEXT NOT NULL DEFAULT ''",
    "choices": "INTEGER NOT NULL DEFAULT 1",
    "degraded": "TEXT NOT NULL DEFAULT ''",
    "served_by": "TEXT NOT NULL DEFAULT ''",
}
_INSERT = f"INSERT INTO usage ({', '.join(_FIELDS)}) VALUES ({', '.join('?' * len(_FIELDS))})"
# A replayed row is written unless its request already has one (a crash between commit and spool removal).
_INSERT_NEW = (
    f"INSERT INTO usage ({', '.join(_FIELDS)}) SELECT {', '.join('?' * len(_FIELDS))} "
    "WHERE NOT EXISTS (SELECT 1 FROM usage WHERE request_id = ?)"
)
# Spooled rows beyond this: the ledger has been away too long; new work is refused until it catches up.
SPOOL_MAX_ROWS = 200_000
WRITER_BUSY_MS = 5  # the loop's wait for the write lock: a commit by another worker of the edge
REPLAY_BUSY_MS = 250  # the replayer's own wait for the write lock (off the loop)
REPLAY_RETRY_S = (0.2, 2.0)  # first and longest pause between replay attempts
_REPORT = """
SELECT key_id, tenant, strftime('%Y-%m-%d', ts, 'unixepoch') AS day, count(*),
       sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(cost_usd)
FROM usage WHERE ts >= ? AND ts < ?
GROUP BY day, key_id, tenant ORDER BY day, key_id, tenant
"""

# A write waiting for its group's commit: the record and the future its writer awaits.
_Pending = tuple[UsageRecord, asyncio.Future[None]]


def _connect(path: Path, busy_ms: int = 5000) -> sqlite3.Connection:
    # Each connection is used by one thread at a time (the writer; readers under a lock), not one thread ever.
    # Setting the journal up waits as long as another worker opening the same file may hold it (sqlite3's
    # own 5 s): with the writer's 5 ms, two workers starting together could fail one ("database is
    # locked"). Only then does the connection take its own, shorter wait.
    db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(f"PRAGMA busy_timeout = {busy_ms}")
    leave_checkpoints_out(db)  # a commit on the loop must not stall it copying the WAL: a thread does
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
        add_missing_columns(self._reader, "usage", _ADDED_COLUMNS)
        self._read_lock = threading.Lock()
        # The loop's writer waits for the lock only as long as another worker's commit takes: a ledger
        # held longer sends the group to the spool, and the groups after it go there without waiting.
        self._writer_db = _connect(self.path, busy_ms=WRITER_BUSY_MS)
        self._replay_db = _connect(self.path, busy_ms=REPLAY_BUSY_MS)
        self.checkpoints = WalCheckpointer(self.path, name="ledger")
        self._pending: list[_Pending] = []
        self._flush_scheduled = False
        self._closed = False
        self._spool = Spool(self.path, UsageRecord)
        self._unwritten: list[UsageRecord] = []  # neither the ledger nor the spool took them: retried
        self._spooling = self._spool.pending_files()  # rows of an earlier run may wait in a spool
        self._replayer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # close() ends the replayer's pause
        self.replayed_rows = 0  # rows moved from the spool (or memory) into the ledger since start

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    def health(self) -> str:
        """ "" while every acknowledged row is in the ledger file; else one word: "spooling" (rows wait in
        the spool, durable, to be replayed) or "unavailable" (neither the file nor the spool can be written:
        new work is refused)."""
        if not self.accepting():
            return "unavailable"
        return "spooling" if self._spooling else ""

    def accepting(self) -> bool:
        """False while the ledger cannot durably record a new request's row: the edge refuses new work."""
        return not self._unwritten and self._spool.rows < SPOOL_MAX_ROWS

    @property
    def spooled_rows(self) -> int:
        """Rows waiting outside the ledger file: in this process's spool, and in memory."""
        return self._spool.rows + len(self._unwritten)

    # --- the write side -------------------------------------------------------------------------------

    async def record(self, rec: UsageRecord) -> None:
        """Return once ``rec`` is committed to the ledger or its spool; raise what the write raised if the
        record itself was refused (a row the ledger can never take).

        If the caller is cancelled while waiting, the row is still written.
        """
        if self._closed:
            raise RuntimeError("ledger is closed")
        if self._spooling:  # rows of an earlier run wait in a spool
            self._start_replayer()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((rec, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)  # after every callback ready now: their records join this commit
        await future

    async def close(self) -> None:
        """Write everything handed in so far (replaying what waits, if the ledger takes it), then close."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        if self._replayer is not None:  # it ends after its current replay, if one runs in its thread
            self._wake.set()
            with contextlib.suppress(Exception):
                await self._replayer
        if self._spooling:
            self._replay_once()
        if self._unwritten:  # nowhere durable took them: the log keeps them for the operator
            for rec in self._unwritten:
                log.error("ledger: row not written, kept here: %s", msgspec.json.encode(rec).decode())
        elif self._spooling:
            log.warning(
                "ledger: %d rows wait in its spool; the next edge on it replays them", self._spool.rows
            )
        self._writer_db.close()
        self._replay_db.close()
        self.checkpoints.stop()
        with self._read_lock:
            self._reader.close()

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            if self._spooling or self._unwritten:
                self._to_spool(batch)  # in order behind the rows that wait: the replayer writes them all
            else:
                self._write(self._writer_db, batch)
        except Exception as exc:  # a bug must not strand the waiters
            log.exception("ledger: unexpected error")
            _settle(batch, exc)

    def _write(self, db: sqlite3.Connection, batch: list[_Pending]) -> None:
        try:
            _insert(db, [rec for rec, _ in batch])
        except sqlite3.OperationalError as exc:  # the file cannot take writes now: locked, full, read-only
            log.warning("ledger %s cannot be written (%s): rows go to its spool", self.path, exc)
            self._to_spool(batch)
            return
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
        self.checkpoints.committed()
        _settle(batch, None)

    def _to_spool(self, batch: list[_Pending]) -> None:
        records = [rec for rec, _ in batch]
        try:
            self._spool.append(records)
        except OSError as exc:
            if not self._unwritten:
                log.error(
                    "ledger spool %s cannot be written either (%s): new work is refused",
                    self._spool.path,
                    exc,
                )
            self._unwritten.extend(records)
        self._spooling = True
        self._start_replayer()
        _settle(batch, None)  # in the spool (durable) or held and retried: the request is billed either way

    def _start_replayer(self) -> None:
        if self._replayer is None or self._replayer.done():
            self._replayer = asyncio.get_running_loop().create_task(self._replay_until_caught_up())

    async def _replay_until_caught_up(self) -> None:
        pause = REPLAY_RETRY_S[0]
        while self._spooling:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), pause)
            if self._closed:
                return  # close() replays once more itself
            paths = self._spool.take()  # on the loop, where the appends are
            held, self._unwritten = self._unwritten, []
            try:
                done = await asyncio.to_thread(self._replay, paths, held)
            except Exception:
                log.exception("ledger: replay failed")
                done = -1
            if done < 0:
                self._hold_again(held)
                pause = min(pause * 2, REPLAY_RETRY_S[1])
                continue
            self._spool.replayed(paths, done - len(held))
            self.replayed_rows += done
            pause = REPLAY_RETRY_S[0]
            if not self._unwritten and not self._spool.pending_files():
                self._spooling = False
                log.info("ledger %s takes writes again: %d rows replayed", self.path, self.replayed_rows)

    def _hold_again(self, held: list[UsageRecord]) -> None:
        """The ledger still refuses: rows held in memory go to the spool if it takes them now."""
        if not held:
            return
        try:
            self._spool.append(held)
        except OSError:
            self._unwritten[:0] = held

    def _replay(self, paths: list[Path], held: list[UsageRecord]) -> int:
        """Off the loop: every row of ``paths`` and ``held`` into the ledger in one transaction, skipping
        requests it already has. The rows written, or -1 when the ledger still refuses (nothing changed)."""
        rows = [rec for path in paths for rec in self._spool.read(path)] + held
        db = self._replay_db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for rec in rows:
                    values = msgspec.structs.astuple(rec)
                    db.execute(_INSERT_NEW, (*values, rec.request_id))
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError:
            return -1
        self.checkpoints.committed()
        return len(rows)

    def _replay_once(self) -> None:
        """At close, on the loop: one last replay, bounded by the replayer's busy timeout."""
        paths = self._spool.take()
        held, self._unwritten = self._unwritten, []
        done = self._replay(paths, held)
        if done < 0:
            self._hold_again(held)
            return
        self._spool.replayed(paths, done - len(held))
        self.replayed_rows += done
        self._spooling = bool(self._unwritten) or self._spool.pending_files()

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
        return [ReportRow.of(row) for row in rows]


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
