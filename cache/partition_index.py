"""Which partitions have an IVF index (cache/ivf.py), and keeping each one built, current and on disk.

A partition below ``min_rows`` has none: the store scans all its rows. Above, the first lookup looks for
``<partition>.ivf`` beside the vector files (built by any process on this folder) and uses it if it was
built on this very vector file; otherwise it starts a build on a background thread and the lookups scan all
rows until it is ready (a lookup never waits for a build). One process builds a partition at a time: the
builder holds ``<partition>.ivf.lock``; the others load its file when it appears. Rows appended since are
labelled at the next lookup; the file is rewritten (in the background) when it lags by a tenth; a partition
that grew fourfold since its cells were trained is rebuilt, the old index serving meanwhile. Nothing here
raises into a lookup: a failed build is a warning and the partition stays on the full scan.

What one process holds is bounded: the indexes in memory by ``max_memory_bytes`` (least recently used out;
its file stays and is read again when the partition is next searched), and at most ``MAX_BUILDS`` builds run
at once (each holds its partition's rows for seconds). A build whose vector file was replaced or removed
meanwhile (compaction, the folder's size limit) is dropped, not saved.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from cache import ivf

log = logging.getLogger("nearshore.cache")
RETRY_S = 10.0  # between attempts to build (or to find another process's build of) one partition
MAX_BUILDS = 2  # builds running at once in one process (the others wait for a later lookup)
MEMORY_BYTES = 256 << 20  # indexes held in memory, per process: ~33 MB at 1M rows, ~3 MB at 100k


class Rows(Protocol):
    """A partition's rows as the index reads them: an array, or the store's checked view of a mapped file."""

    def __len__(self) -> int: ...

    def __getitem__(self, key) -> np.ndarray: ...


def memory_bytes(index: ivf.IvfIndex) -> int:
    return index.centroids.nbytes + index.labels.nbytes + index.order.nbytes + index.offsets.nbytes


class PartitionIndexes:
    def __init__(
        self,
        index_dir: Path,
        dim: int,
        min_rows: int = ivf.MIN_ROWS,
        max_memory_bytes: int = MEMORY_BYTES,
        on_saved: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_saved(partition, file_bytes)`` is told each index file written (the store counts them)."""
        self.index_dir = index_dir
        self.dim = dim
        self.min_rows = min_rows
        self.max_memory_bytes = max_memory_bytes
        self._on_saved = on_saved
        self._indexes: OrderedDict[str, ivf.IvfIndex] = OrderedDict()  # least recently used first
        self._building = 0  # builds running here
        self._seen_files: dict[str, tuple[int, int]] = {}  # partition -> (mtime_ns, size) of its file
        self._busy: set[str] = set()  # partitions with a build or a save running here
        self._tried_s: dict[str, float] = {}
        self._lock = threading.Lock()  # around extending, sorting and installing indexes
        self.builds = 0  # indexes built by this process (tests and the bench read it)
        self.loads = 0  # indexes read from disk

    def path(self, partition: str) -> Path:
        return self.index_dir / f"{partition}.ivf"

    def candidates(
        self, partition: str, matrix: Rows, identity: tuple[int, int], query: np.ndarray
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
                grew = rows > index.rows
                index.extend(matrix, rows)
                found = index.candidates(query)
                if partition in self._indexes:
                    self._indexes.move_to_end(partition)
                if grew:
                    self._trim()
            if index.rows - index.saved_rows >= max(ivf.RESORT_ROWS, index.saved_rows // 10):
                self._start(partition, self._save, index, throttle=False)
            return found
        except Exception as exc:  # a broken index is a full scan, never a failed lookup
            log.warning("cache: IVF index of partition %s failed (%s); scanning all rows", partition, exc)
            with self._lock:  # dropped; rebuilt no sooner than RETRY_S after the last attempt
                self._indexes.pop(partition, None)
            return None

    def _current(self, partition: str, matrix: Rows, identity: tuple[int, int]) -> ivf.IvfIndex | None:
        index = self._indexes.get(partition)
        if index is not None and index.identity != identity:
            self.forget(partition)  # the vector file was replaced (compacted): rows renumbered
            index = None
        if index is None or index.stale(len(matrix)):
            # Not while this process's own build runs: it installs what it saves (reading its file the
            # moment it lands loaded a second copy of the index just built).
            found = None if partition in self._busy else self._from_disk(partition, identity, len(matrix))
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
            self._install(partition, index)
            self.loads += 1
        return index

    def _install(self, partition: str, index: ivf.IvfIndex) -> None:
        with self._lock:
            self._indexes[partition] = index
            self._indexes.move_to_end(partition)
            self._trim()

    def _trim(self) -> None:
        """Least recently used indexes out of memory (under ``_lock``) until within ``max_memory_bytes``;
        never the one just used, however large. Its file is read again when it is next wanted."""
        held = sum(memory_bytes(index) for index in self._indexes.values())
        while held > self.max_memory_bytes and len(self._indexes) > 1:
            partition, index = self._indexes.popitem(last=False)
            self._seen_files.pop(partition, None)
            held -= memory_bytes(index)

    def _start(self, partition: str, work, *args, throttle: bool = True) -> None:
        """Run ``work(partition, *args)`` on a daemon thread unless one runs for the partition or (with
        ``throttle``) one was started in the last RETRY_S."""
        now = time.monotonic()
        building = work == self._build
        with self._lock:
            if partition in self._busy or (building and self._building >= MAX_BUILDS):
                return
            if throttle:
                if now - self._tried_s.get(partition, -RETRY_S) < RETRY_S:
                    return
                self._tried_s[partition] = now
            self._busy.add(partition)
            self._building += building
        thread = threading.Thread(target=self._run, args=(partition, work, args, building), daemon=True)
        thread.name = f"ivf-{partition[:8]}"
        thread.start()

    def _run(self, partition: str, work, args: tuple, building: bool) -> None:
        try:
            work(partition, *args)
        except Exception as exc:
            log.warning("cache: IVF index of partition %s not built (%s)", partition, exc)
        finally:
            with self._lock:
                self._busy.discard(partition)
                self._building -= building

    def _build(self, partition: str, matrix: Rows, identity: tuple[int, int]) -> None:
        lock_path = self.index_dir / f"{partition}.ivf.lock"
        with open(lock_path, "ab") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process builds it: its file is read when it appears
            try:
                started = time.perf_counter()
                index = ivf.IvfIndex.build(matrix, identity)
                if not self._still_on(partition, identity):
                    return  # compacted or removed meanwhile: an index of rows that are gone
                index.save(self.path(partition))
                self.builds += 1  # before it is seen: a test that waits for the index reads it then
                self._install(partition, index)
                self._remember_file(partition)
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
        if self._still_on(partition, index.identity):
            index.save(self.path(partition))
            self._remember_file(partition)

    def _still_on(self, partition: str, identity: tuple[int, int]) -> bool:
        """Whether the partition's vector file is still the one ``identity`` names."""
        try:
            stat = (self.index_dir / f"{partition}.vec").stat()
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == identity

    def _remember_file(self, partition: str) -> None:
        with contextlib.suppress(OSError):
            stat = self.path(partition).stat()
            self._seen_files[partition] = (stat.st_mtime_ns, stat.st_size)
            if self._on_saved is not None:
                self._on_saved(partition, stat.st_size)

    def get(self, partition: str) -> ivf.IvfIndex | None:
        return self._indexes.get(partition)

    @property
    def loaded(self) -> int:
        """Indexes held in memory."""
        return len(self._indexes)

    @property
    def memory_bytes(self) -> int:
        with self._lock:
            return sum(memory_bytes(index) for index in self._indexes.values())

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
