"""What a commit on the event loop costs with SQLite's own checkpoints, beside checkpoints left to a thread.

    python -m bench.wal_commits --commits 20000

The ledger commits on the event loop, one small transaction per turn of it when requests come one by one.
Two writers make the same commits to two files of the same schema, interleaved in rounds: one as SQLite
does by default (the commit that takes the WAL past 1,000 pages copies it into the database and syncs both
files), one that leaves that to a :class:`~nearshore.wal_checkpoint.WalCheckpointer` thread. Printed per
writer: the commits' p50, p99 and longest time, and how many took over 1 ms and over 5 ms: each of those
stalled every stream the process relays.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from harness.stats import percentile
from nearshore.wal_checkpoint import WalCheckpointer, leave_checkpoints_out

ROW = b"u" * 300  # about a usage row's size


def _writer(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE usage (id INTEGER PRIMARY KEY, request_id TEXT UNIQUE, row BLOB)")
    return db


def _commit(db: sqlite3.Connection, n: int, checkpoints: WalCheckpointer | None) -> float:
    started = time.perf_counter()
    db.execute("BEGIN")
    db.execute("INSERT INTO usage (request_id, row) VALUES (?, ?)", (f"req-{n}", ROW))
    db.execute("COMMIT")
    took = time.perf_counter() - started
    if checkpoints is not None:
        checkpoints.committed()
    return took


def run(commits: int, rounds: int, folder: Path) -> dict[str, list[float]]:
    sqlite_own, own_db = "SQLite's own checkpoints", _writer(folder / "own.sqlite3")
    threaded, thread_db = "checkpoints in a thread", _writer(folder / "thread.sqlite3")
    leave_checkpoints_out(thread_db)
    checkpoints = WalCheckpointer(folder / "thread.sqlite3", name="bench")
    times: dict[str, list[float]] = {sqlite_own: [], threaded: []}
    per_round = commits // rounds
    try:
        for r in range(rounds):
            writers = [(sqlite_own, own_db, None), (threaded, thread_db, checkpoints)]
            for name, db, thread in writers if r % 2 == 0 else writers[::-1]:
                base = r * per_round
                times[name] += [_commit(db, base + i, thread) for i in range(per_round)]
    finally:
        checkpoints.stop()
        own_db.close()
        thread_db.close()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wal_commits", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=20000, help="commits per writer (default 20000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, writers interleaved (default 4)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nearshore-bench-wal-") as folder:
        times = run(args.commits, args.rounds, Path(folder))
    for name, took in times.items():
        ms = sorted(t * 1000 for t in took)
        slow = [t for t in ms if t > 1]
        print(
            f"{name:26s} {len(ms)} commits: p50 {percentile(ms, 50):.3f} ms, "
            f"p99 {percentile(ms, 99):.3f} ms, longest {ms[-1]:.2f} ms; over 1 ms: {len(slow)}, "
            f"over 5 ms: {sum(t > 5 for t in slow)} ({sum(slow):.0f} ms in all)"
        )


if __name__ == "__main__":
    main()
