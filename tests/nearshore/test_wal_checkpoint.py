"""Checkpoints of a WAL file by a thread of their own: the loop's commits never copy the WAL themselves
(SQLite's default would, in the commit that takes it past 1,000 pages, syncing both files), the thread copies
what was committed, and its last checkpoint runs when it stops."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from edge.ledger import Ledger
from nearshore.wal_checkpoint import WalCheckpointer, leave_checkpoints_out
from tests.edge.test_ledger_degraded import usage

PAGE = 4096
DEFAULT_AUTOCHECKPOINT_PAGES = 1000


def writer(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(f"PRAGMA page_size = {PAGE}")
    db.execute("CREATE TABLE IF NOT EXISTS t (v BLOB)")
    leave_checkpoints_out(db)
    return db


def commit_pages(db: sqlite3.Connection, count: int) -> None:
    for _ in range(count):  # one commit each, as the ledger's loop makes them, each at least a page
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?)", (b"x" * PAGE,))
        db.execute("COMMIT")


def wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


@contextlib.contextmanager
def left_out(path: Path, interval_s: float) -> Iterator[tuple[sqlite3.Connection, WalCheckpointer]]:
    """A writer whose commits leave checkpoints out, and the thread that runs them; both closed after."""
    db = writer(path)
    checkpoints = WalCheckpointer(path, interval_s=interval_s)
    try:
        yield db, checkpoints
    finally:
        checkpoints.stop()
        db.close()


def test_a_connection_left_out_never_checkpoints_however_long_its_wal(tmp_path: Path):
    # The thread would wait an hour: only the commits could copy.
    with left_out(tmp_path / "f.sqlite3", interval_s=3600) as (db, checkpoints):
        commit_pages(db, DEFAULT_AUTOCHECKPOINT_PAGES + 200)
        assert checkpoints.checkpoints == 0
        _, frames, _ = checkpoints.checkpoint()  # what the WAL holds now, all of it since the start
        assert frames > DEFAULT_AUTOCHECKPOINT_PAGES + 200  # SQLite's default would have started it over


def test_the_thread_copies_what_was_committed_once_told(tmp_path: Path):
    path = tmp_path / "f.sqlite3"
    with left_out(path, interval_s=0.0) as (db, checkpoints):
        commit_pages(db, 50)
        checkpoints.committed()
        assert checkpoints.ran.wait(30)
        blocked, frames, copied = checkpoints.checkpoint()
        assert blocked == 0 and frames >= 50 and copied == frames
        commit_pages(db, 1)  # the next commit starts the WAL over: it does not grow while the thread keeps up
        assert wal_bytes(path) <= (frames + 2) * (PAGE + 24) + 32


def test_stopping_runs_a_last_checkpoint(tmp_path: Path):
    path = tmp_path / "f.sqlite3"
    db = writer(path)
    checkpoints = WalCheckpointer(path, interval_s=3600)
    commit_pages(db, 20)
    checkpoints.committed()
    checkpoints.stop()  # cuts the hour short
    assert checkpoints.checkpoints == 1
    check = sqlite3.connect(path)
    try:
        _, frames, copied = check.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert frames == copied  # nothing was left to copy
    finally:
        check.close()
        db.close()


async def test_the_ledgers_commits_leave_the_copying_to_its_thread(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    try:
        for n in range(30):
            await ledger.record(usage(f"req-{n}"))  # one commit each
        assert ledger.checkpoints.ran.wait(30)  # told by the commits, it ran
        _, frames, copied = ledger.checkpoints.checkpoint()
        assert frames == copied
        assert len(ledger.report()) == 1 and ledger.report()[0].requests == 30
    finally:
        await ledger.close()
    reopened = Ledger(tmp_path / "ledger.sqlite3")
    try:
        assert reopened.report()[0].requests == 30  # every row survived the close
    finally:
        await reopened.close()
