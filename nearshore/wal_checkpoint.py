"""Checkpoints of a SQLite file in WAL mode, run by a thread of their own, never by a commit on the loop.

By default SQLite checkpoints by itself: the commit that takes the WAL past 1,000 pages copies them into the
database and, with ``synchronous=NORMAL``, syncs both files before it returns. For a connection the event loop
commits on (the edge's ledger), that commit stalls every request and stream the process serves: on this
machine's idle disk 5-7 ms once every ~350 single-row commits, and as long as an fsync takes on a busy disk.

So a loop's connection leaves checkpoints out (:func:`leave_checkpoints_out`), and a :class:`WalCheckpointer`
runs them on its own connection in its own thread, once commits have come and ``interval_s`` has passed: a
passive checkpoint, which waits for no reader or writer, and which no writer waits for (SQLite's WAL lets
commits append while pages are copied). With nothing written it sleeps: no wake-ups while the edge is idle.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("nearshore.sqlite")

INTERVAL_S = 1.0  # at most this long between a commit and the checkpoint that copies it


def leave_checkpoints_out(db: sqlite3.Connection) -> None:
    """This connection's commits never checkpoint (a :class:`WalCheckpointer` does)."""
    db.execute("PRAGMA wal_autocheckpoint = 0")


class WalCheckpointer:
    """One file's checkpoints, in a daemon thread: :meth:`committed` after each commit (cheap, from any
    thread); :meth:`stop` at the end (it runs a last checkpoint)."""

    def __init__(self, path: str | Path, interval_s: float = INTERVAL_S, name: str = "") -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.checkpoints = 0  # passive checkpoints run (each may have had little to copy)
        self.ran = threading.Event()  # set after each checkpoint (for a caller that waits for one)
        self._written = threading.Event()  # commits since the last checkpoint
        self._stopping = threading.Event()
        self._db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._thread = threading.Thread(
            target=self._run, name=f"wal-checkpoint {name or self.path.name}", daemon=True
        )
        self._thread.start()

    def committed(self) -> None:
        if not self._written.is_set():
            self._written.set()

    def checkpoint(self) -> tuple[int, int, int]:
        """One passive checkpoint now: (blocked, frames in the WAL, frames copied into the database)."""
        row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.checkpoints += 1
        return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)

    def stop(self) -> None:
        """End the thread after one last checkpoint of what was committed; close its connection."""
        self._stopping.set()
        self._written.set()  # wake it if it waits for a commit
        self._thread.join()
        self._db.close()

    def _run(self) -> None:
        while True:
            self._written.wait()
            self._stopping.wait(self.interval_s)  # commits gather meanwhile; a stop cuts the wait short
            self._written.clear()
            try:
                self.checkpoint()
            except sqlite3.Error as exc:  # another process's checkpoint holds the file: the next one copies
                log.debug("checkpoint of %s skipped: %s", self.path, exc)
            self.ran.set()
            if self._stopping.is_set():
                return
