"""Which partitions have an IVF index (cache/ivf.py), and keeping each one built, current and on disk.

A partition below ``min_rows`` has none: the store scans all its rows. Above, the first lookup looks for
``<partition>.ivf`` beside the vector files (built by any process on this folder) and uses it if it was
built on this very vector file; otherwise it starts a build on a background thread and the lookups scan all
rows until it is ready (a lookup never waits for a build). One process builds a partition at a time: the
builder holds ``<partition>.ivf.lock``; the others load its file when it appears. Rows appended since are
labelled at the next lookup; the file is rewritten (in the background) when it lags by a tenth; a partition
that grew fourfold since its cells were trained is rebuilt, the old index serving meanwhile. Nothing here
raises into a lookup: a failed build is a warning and the partition stays on the full scan.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
import time
from pathlib import Path

import numpy as np

from cache import ivf

log = logging.getLogger("nearshore.cache")
RETRY_S = 10.0  # between attempts to build (or to find another process's build of) one partition


class PartitionIndexes:
    def __init__(self, index_dir: Path, dim: int, min_rows: int = ivf.MIN_ROWS) -> None:
        self.index_dir = index_dir
        self.dim = dim
        self.min_rows = min_rows
        self._indexes: dict[str, ivf.IvfIndex] = {}
        self._seen_files: dict[str, tuple[int, int]] = {}  # partition -> (mtime_ns, size) of its file
        self._busy: set[str] = set()  # partitions with a build or a save running here
        self._tried_s: dict[str, float] = {}
        self._lock = threading.Lock()  # around extending, sorting and installing indexes
        self.builds = 0  # indexes built by this process (tests and the bench read it)
        self.loads = 0  # indexes read from disk

    def path(self, partition: str) -> Path:
        return self.index_dir / f"{partition}.ivf"

    def candidates(
        self, partition: str, matrix: np.ndarray, identity: tuple[int, int], query: np.ndarray
    ) -> np.ndarray | None:
        """The rows to score for ``query``; None: score them all (a small partition, or no index yet)."""
        rows = len(matrix)
        if rows < self.min_rows:
            return None
        try:
            index = self._current(partition, matrix, identity)
            if index is None:
                return None
            with self._lock:
                index.extend(matrix, rows)
                found = index.candidates(query)
            if index.rows - index.saved_rows >= max(ivf.RESORT_ROWS, index.saved_rows // 10):
                self._start(partition, self._save, index, throttle=False)
            return found
        except Exception as exc:  # a broken index is a full scan, never a failed lookup
            log.warning("cache: IVF index of partition %s failed (%s); scanning all rows", partition, exc)
            with self._lock:  # dropped; rebuilt no sooner than RETRY_S after the last attempt
                self._indexes.pop(partition, None)
            return None

    def _current(self, partition: str, matrix: np.ndarray, identity: tuple[int, int]) -> ivf.IvfIndex | None:
        index = self._indexes.get(partition)
        if index is not None and index.identity != identity:
            self.forget(partition)  # the vector file was replaced (compacted): rows renumbered
            index = None
        if index is None or index.stale(len(matrix)):
            found = self._from_disk(partition, identity, len(matrix))
            if found is not None and not found.stale(len(matrix)):
                return found
            self._start(partition, self._build, matrix, identity)
        return index

    def _from_disk(self, partition: str, identity: tuple[int, int], rows: int) -> ivf.IvfIndex | None:
        path = self.path(partition)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        seen = (stat.st_mtime_ns, stat.st_size)
        if self._seen_files.get(partition) == seen:
            return None  # read already: unusable, or older than what is in memory
        self._seen_files[partition] = seen
        index = ivf.IvfIndex.load(path, identity, rows, self.dim)
        if index is not None:
            with self._lock:
                self._indexes[partition] = index
            self.loads += 1
        return index

    def _start(self, partition: str, work, *args, throttle: bool = True) -> None:
        """Run ``work(partition, *args)`` on a daemon thread unless one runs for the partition or (with
        ``throttle``) one was started in the last RETRY_S."""
        now = time.monotonic()
        with self._lock:
            if partition in self._busy:
                return
            if throttle:
                if now - self._tried_s.get(partition, -RETRY_S) < RETRY_S:
                    return
                self._tried_s[partition] = now
            self._busy.add(partition)
        thread = threading.Thread(target=self._run, args=(partition, work, args), daemon=True)
        thread.name = f"ivf-{partition[:8]}"
        thread.start()

    def _run(self, partition: str, work, args: tuple) -> None:
        try:
            work(partition, *args)
        except Exception as exc:
            log.warning("cache: IVF index of partition %s not built (%s)", partition, exc)
        finally:
            with self._lock:
                self._busy.discard(partition)

    def _build(self, partition: str, matrix: np.ndarray, identity: tuple[int, int]) -> None:
        lock_path = self.index_dir / f"{partition}.ivf.lock"
        with open(lock_path, "ab") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process builds it: its file is read when it appears
            try:
                started = time.perf_counter()
                index = ivf.IvfIndex.build(matrix, identity)
                index.save(self.path(partition))
                with self._lock:
                    self._indexes[partition] = index
                self._remember_file(partition)
                self.builds += 1
                log.info(
                    "cache: IVF index of partition %s built: %d rows, %d cells, %.1fs",
                    partition,
                    index.rows,
                    len(index.centroids),
                    time.perf_counter() - started,
                )
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self, partition: str, index: ivf.IvfIndex) -> None:
        index.save(self.path(partition))
        self._remember_file(partition)

    def _remember_file(self, partition: str) -> None:
        with contextlib.suppress(OSError):
            stat = self.path(partition).stat()
            self._seen_files[partition] = (stat.st_mtime_ns, stat.st_size)

    def get(self, partition: str) -> ivf.IvfIndex | None:
        return self._indexes.get(partition)

    def forget(self, partition: str) -> None:
        with self._lock:
            self._indexes.pop(partition, None)
            self._seen_files.pop(partition, None)
            self._tried_s.pop(partition, None)

    def clear(self) -> None:
        with self._lock:
            self._indexes.clear()
            self._seen_files.clear()
            self._tried_s.clear()

    def close(self) -> None:
        self.clear()  # a build still running finishes on its own daemon thread, or dies with the process
