"""Keeping an edge's copy of a SQLite key store fresh (edge/keys.py): keys created, changed or revoked by
another process (``nearshore keys``, another worker's admin API, plain SQL) reach the copy off the request
path, as soon as the kernel says the file was written where it can (nearshore/file_watch.py), else by a poll.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from edge.keys import KeyStore
from nearshore.file_watch import FileWatch

log = logging.getLogger("nearshore.keys")

# A commit writes its WAL frames (the write the kernel reports), then makes them visible in the WAL's index,
# in shared memory (no event): a check just after the event may come first, and looks again after these.
_VISIBLE_AFTER_S = (0.001, 0.004, 0.02, 0.1)


async def refresh_keys(
    store: KeyStore,
    interval_s: float,
    reloaded: Callable[[], object] | None = None,
    watched_interval_s: float | None = None,
) -> None:
    """Keep ``store``'s copy fresh until cancelled, then call ``reloaded`` on the loop after each reload
    (the edge ends the requests in flight of keys revoked meanwhile).

    Another process's commit is seen when the kernel says the file or its WAL was written
    (:class:`~nearshore.file_watch.FileWatch`), with a poll every ``watched_interval_s`` behind it; where
    the files cannot be watched, by a poll every ``interval_s``. Either way the check is one PRAGMA (a few
    microseconds) on the loop; a reload, which reads the whole table, runs in a thread so that a large table
    never stalls requests. Errors are logged and retried at the next check.
    """
    written = asyncio.Event()
    watch = FileWatch.start([store.path, Path(f"{store.path}-wal")], written.set)
    period = interval_s if watch is None or watched_interval_s is None else watched_interval_s
    try:
        await _reload_if_changed(store, reloaded)  # what was committed before the watch was in place
        while True:
            try:
                async with asyncio.timeout(period):
                    await written.wait()
                told = True
            except TimeoutError:
                told = False
                if watch is not None:
                    watch.rewatch()  # a file made since (the WAL of a store that had none)
            if watch is not None and watch.closed:  # it broke (and said so): the poll alone, at its pace
                watch, period = None, interval_s
            written.clear()  # before the check: a commit during it is checked again
            if await _reload_if_changed(store, reloaded) or not told:
                continue
            for wait_s in _VISIBLE_AFTER_S:  # told of a write not visible yet
                await asyncio.sleep(wait_s)
                if written.is_set() or await _reload_if_changed(store, reloaded):
                    break
    finally:
        if watch is not None:
            watch.close()


async def _reload_if_changed(store: KeyStore, reloaded: Callable[[], object] | None) -> bool:
    try:
        if store.changed() and await asyncio.to_thread(store.refresh):
            if reloaded is not None:
                reloaded()
            return True
    except sqlite3.Error as exc:  # keep serving from the copy we have
        log.warning("key store %s: refresh failed: %s", store.path, exc)
    return False
