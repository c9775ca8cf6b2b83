"""The semantic level's files: each partition's vectors and their ids, written, read, and held in memory.

Per partition, an append-only pair of files in the index folder: ``<partition>.vec`` (float32 rows,
L2-normalised) and ``<partition>.ids`` (the 16-byte exact key of each row). A writer appends under an
exclusive lock on the ids file; a reader loads the files again (under a shared lock) when their size
changed, so a row another process wrote is seen on its next lookup. Nothing here trusts the files: a torn
row or a missing folder is a miss and a warning, never an error to the client; a writer that finds the pair
out of step (a crash between its two writes, a damaged file) puts it back in step before it appends.

What one process holds is bounded whatever the number of partitions: a vector file up to
``read_max_bytes`` is read into memory (no file kept open; below ~1 MiB a read costs less than a fresh
map), in an LRU of ``read_cache_bytes``; a larger one is memory-mapped, since the page cache behind a map is
shared by every worker process on the folder, with at most ``max_maps`` maps open (one fd each), least
recently used closed first and any idle for ``map_idle_s`` closed.

A vector file truncated in place under a map would turn the next read of a page past its new end into a
SIGBUS, which kills the process. So a map's file size is checked (fstat on the map's own fd) before each
use, and an IVF build reads mapped rows through a checked copy per chunk; a map whose file shrank is
dropped with a warning and the lookup is a miss. What remains is the window between that check and the end
of the read that follows it: microseconds for an IVF lookup's few thousand rows, a millisecond or two for
a full scan of a partition just past ``read_max_bytes``, one chunk of :mod:`cache.ivf` for a build. Closing
it would need a copy of the rows (the memory a map saves); and nothing here truncates a file in place, only
an operator or a failing disk does. A read file that comes back short is damage, likewise a miss.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

log = logging.getLogger("nearshore.cache")
ID_BYTES = 16
TOMBSTONE = b"\xff" * ID_BYTES  # the id of a row that has no entry (a writer's repair): never returned
TOMBSTONE_HEX = TOMBSTONE.hex()
_LOCK_TRIES = 5  # a reload waits at most ~10 ms for a writer (a compaction holds the lock for longer)


@dataclass(slots=True, eq=False)
class Vectors:
    """A partition's rows as this process last loaded them: read into memory, or memory-mapped."""

    identity: tuple[int, int]  # (device, inode) of the .vec file: compaction replaces it
    size: int  # bytes of the ids file read (whole ids only)
    raw_ids: bytes | bytearray  # 16 bytes per row (a mapped one's is appended to in place as the file grows)
    matrix: np.ndarray  # [rows, dim] float32, in memory or over ``mapped``
    mapped: mmap.mmap | None = None  # None: read into memory
    used_s: float = 0.0  # monotonic, its last lookup

    @property
    def rows(self) -> int:
        return len(self.matrix)

    def id_at(self, row: int) -> str:
        return bytes(self.raw_ids[row * ID_BYTES : (row + 1) * ID_BYTES]).hex()

    @property
    def ids(self) -> list[str]:
        return [self.id_at(i) for i in range(self.rows)]

    @property
    def memory_bytes(self) -> int:
        """What it holds in this process's own memory (a map's rows are in the shared page cache)."""
        return len(self.raw_ids) + (0 if self.mapped is not None else self.matrix.nbytes)

    def intact(self) -> bool:
        """Whether the file still holds every mapped byte (fstat on the map's own fd)."""
        if self.mapped is None:
            return True
        try:
            return self.mapped.size() >= self.matrix.nbytes
        except (OSError, ValueError):  # closed
            return False

    # The rows as the IVF index reads them (cache.partition_index.Rows): a mapped file checked, then copied.
    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, key) -> np.ndarray:
        if self.mapped is None:
            return self.matrix[key]
        if not self.intact():
            raise OSError("the vector file shrank under its map")
        return np.array(self.matrix[key])


def close_map(mapped: mmap.mmap | None) -> None:
    """Unmap now, or (a lookup on another thread still reads it) when its last reader lets go of it."""
    if mapped is not None:
        with contextlib.suppress(BufferError):
            mapped.close()


class VectorFiles:
    """The index folder's vector and id files, and the partitions this process holds loaded (module
    docstring)."""

    def __init__(
        self,
        index_dir: Path,
        dim: int,
        read_max_bytes: int,
        read_cache_bytes: int,
        max_maps: int,
        map_idle_s: float,
    ) -> None:
        self.index_dir = index_dir
        self.dim = dim
        self.read_max_bytes = read_max_bytes
        self.read_cache_bytes = read_cache_bytes
        self.max_maps = max_maps
        self.map_idle_s = map_idle_s
        self._row_bytes = 4 * dim
        self._lock = threading.Lock()  # around the two LRUs below
        self._read: OrderedDict[str, Vectors] = OrderedDict()  # least recently used first
        self._read_bytes = 0
        self._maps: OrderedDict[str, Vectors] = OrderedDict()
        self._live_maps: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()  # with those still being read
        self._warned: dict[str, str] = {}  # partition -> the damage last warned about
        self.damaged = 0  # lookups and appends that met a damaged or truncated vector file (for /metrics)

    def paths(self, partition: str) -> tuple[Path, Path]:
        return self.index_dir / f"{partition}.vec", self.index_dir / f"{partition}.ids"

    def bytes_of(self, rows: int) -> int:
        """What ``rows`` rows take in a partition's two files."""
        return rows * (self._row_bytes + ID_BYTES)

    @property
    def open_maps(self) -> int:
        """Vector files memory-mapped by this process (one fd each): at most ``max_maps``, plus any that a
        lookup or an IVF build on another thread still reads after they were closed."""
        with self._lock:
            return sum(1 for mapped in self._live_maps if not mapped.closed)

    @property
    def read_bytes(self) -> int:
        """This process's memory holding read partitions (at most ``read_cache_bytes``)."""
        return self._read_bytes

    # --- writing -----------------------------------------------------------------------------------------

    def append(self, partition: str, exacts: list[str], matrix: np.ndarray) -> int:
        """Append one row per exact key; returns the bytes written (a repair's included)."""
        vec_path, ids_path = self.paths(partition)
        rows = np.ascontiguousarray(matrix, dtype=np.float32).reshape(len(exacts), self.dim).tobytes()
        with self.exclusive(ids_path) as ids_fd:
            vec_fd = os.open(vec_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                added = self._in_step(partition, ids_fd, vec_fd)
                # Both files end on a whole row: a crash mid-append leaves at most a tail, cut on read (and
                # put back in step by the next writer).
                _write(vec_fd, rows)
                _write(ids_fd, b"".join(bytes.fromhex(exact) for exact in exacts))
            finally:
                os.close(vec_fd)
        return added + len(rows) + ID_BYTES * len(exacts)

    @contextlib.contextmanager
    def exclusive(self, ids_path: Path) -> Iterator[int]:
        """The ids file's fd, opened to append and locked; the one at ``ids_path`` still (compaction
        replaces it and the folder's limits remove it while a writer waits for the lock)."""
        for _ in range(_LOCK_TRIES):
            fd = os.open(ids_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, ids_path):
                    yield fd
                    return
            finally:
                os.close(fd)  # and the lock with it, after the caller's writes
        raise OSError(f"{ids_path} is replaced again and again")

    def _in_step(self, partition: str, ids_fd: int, vec_fd: int) -> int:
        """Put the files back in step (under the lock) before an append: a vector whose id was never
        written (a crash between the two writes) gets a tombstone id; a torn tail is padded to a whole row
        (with a tombstone), never cut, so that no other process's map ends past the file; ids past the
        vectors (a vector file damaged) are cut. Returns the bytes added."""
        ids_size, vec_size = os.fstat(ids_fd).st_size, os.fstat(vec_fd).st_size
        num_ids, num_vectors = ids_size // ID_BYTES, vec_size // self._row_bytes
        if num_ids > num_vectors or ids_size % ID_BYTES:
            if num_ids > num_vectors:
                self.warn_damage(partition, f"{num_ids} ids but {num_vectors} vectors: ids cut to match")
            num_ids = min(num_ids, num_vectors)
            os.ftruncate(ids_fd, num_ids * ID_BYTES)
        added = 0
        if vec_size % self._row_bytes:
            pad = self._row_bytes - vec_size % self._row_bytes
            _write(vec_fd, bytes(pad))
            num_vectors += 1
            added += pad
        if num_vectors > num_ids:
            _write(ids_fd, TOMBSTONE * (num_vectors - num_ids))
            added += ID_BYTES * (num_vectors - num_ids)
        return added

    def rewrite(self, partition: str, keep: Callable[[str], bool], stale: Path) -> int | None:
        """Rewrite the partition's files with only the rows whose exact key ``keep`` accepts, and remove
        ``stale`` (built on the replaced files) under the same lock; the rows kept, None when it has no
        files. (A writer that was waiting for the lock finds the ids file replaced and appends to the new
        pair.)"""
        vec_path, ids_path = self.paths(partition)
        if not ids_path.exists():
            return None
        with self.exclusive(ids_path):
            self.forget(partition)
            loaded = self.load(partition, None, locked=True)
            if loaded is None:
                return None
            kept = [i for i in range(loaded.rows) if keep(loaded.id_at(i))]
            tmp_vec, tmp_ids = vec_path.with_suffix(".vec.tmp"), ids_path.with_suffix(".ids.tmp")
            np.asarray(loaded[kept], dtype=np.float32).tofile(tmp_vec)
            tmp_ids.write_bytes(b"".join(bytes.fromhex(loaded.id_at(i)) for i in kept))
            mapped = loaded.mapped
            del loaded
            close_map(mapped)
            os.replace(tmp_vec, vec_path)
            os.replace(tmp_ids, ids_path)
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        return len(kept)

    def remove(self, partition: str, also: tuple[Path, ...]) -> bool:
        """Remove a partition's files, and ``also`` those beside them, under its lock (False if a writer or
        a compaction holds it)."""
        vec_path, ids_path = self.paths(partition)
        try:
            fd = os.open(ids_path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        except OSError:
            return False
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            for path in (vec_path, ids_path, *also):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        finally:
            if fd is not None:
                os.close(fd)
        self.forget(partition)
        return True

    # --- reading -----------------------------------------------------------------------------------------

    def vectors(self, partition: str) -> Vectors | None:
        """The partition's rows, loaded again if another writer added some since (a small partition is
        read whole; a large one's new ids are read and its vectors mapped again); None when it has none
        or its files are damaged."""
        self.close_idle(time.monotonic())
        vec_path, ids_path = self.paths(partition)
        try:
            ids_stat, vec_stat = ids_path.stat(), vec_path.stat()
        except FileNotFoundError:
            self.forget(partition)
            return None
        except OSError as exc:
            log.warning("cache: index of partition %s unreadable (%s)", partition, exc)
            self.forget(partition)
            return None
        known = self._cached(partition)
        if known is not None and known.identity == (vec_stat.st_dev, vec_stat.st_ino):
            if vec_stat.st_size < known.matrix.nbytes:
                self.warn_damage(partition, f"its vector file shrank to {vec_stat.st_size} bytes")
                self.forget(partition)
                return None
            if known.size == ids_stat.st_size:
                return known
        try:
            loaded = self.load(partition, known)
        except (OSError, ValueError) as exc:
            log.warning("cache: index of partition %s unreadable (%s)", partition, exc)
            self.forget(partition)
            return None
        if loaded is None:
            self.forget(partition)
        elif loaded is not known:
            self._install(partition, loaded)
        return loaded

    def load(self, partition: str, known: Vectors | None, locked: bool = False) -> Vectors | None:
        """The files read (or mapped) under a shared lock, so that a compaction is never seen half done;
        ``known`` while a long compaction holds the lock (None if it is not of the current files)."""
        vec_path, ids_path = self.paths(partition)
        try:
            ids_fd = os.open(ids_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if not locked and not _shared_lock(ids_fd):
                return known
            if not _same_file(ids_fd, ids_path):
                return known  # replaced meanwhile: the next lookup reads the new files
            with open(vec_path, "rb") as vec:
                return self._read_files(partition, known, ids_fd, os.fstat(ids_fd).st_size, vec)
        except FileNotFoundError:  # removed meanwhile
            return None
        finally:
            os.close(ids_fd)  # and the shared lock with it

    def _read_files(
        self, partition: str, known: Vectors | None, ids_fd: int, ids_size: int, vec: BinaryIO
    ) -> Vectors | None:
        vec_stat = os.fstat(vec.fileno())
        identity = (vec_stat.st_dev, vec_stat.st_ino)
        num_ids, num_vectors = ids_size // ID_BYTES, vec_stat.st_size // self._row_bytes
        if num_ids > num_vectors:  # a writer writes the vector first: the vector file lost rows
            self.warn_damage(partition, f"{num_ids} ids but only {num_vectors} vectors")
            return None
        rows = num_ids
        matrix_bytes = rows * self._row_bytes
        if matrix_bytes <= self.read_max_bytes:
            raw_ids = os.pread(ids_fd, rows * ID_BYTES, 0)
            data = os.pread(vec.fileno(), matrix_bytes, 0)
            if len(raw_ids) < rows * ID_BYTES or len(data) < matrix_bytes:
                self.warn_damage(partition, "a short read")
                return None
            matrix = np.frombuffer(data, dtype=np.float32).reshape(rows, self.dim)
            return Vectors(identity, rows * ID_BYTES, raw_ids, matrix)
        # A mapped one's fd keeps its inode: the same identity is the same file, so only new ids are read.
        tail_from = known.size if known is not None and known.mapped is not None else 0
        if tail_from and (known.identity != identity or tail_from > rows * ID_BYTES):
            tail_from = 0
        tail = os.pread(ids_fd, rows * ID_BYTES - tail_from, tail_from)
        if len(tail) < rows * ID_BYTES - tail_from:
            self.warn_damage(partition, "a short read of its ids")
            return None
        mapped = mmap.mmap(vec.fileno(), matrix_bytes, access=mmap.ACCESS_READ)
        with self._lock:
            self._live_maps.add(mapped)
        matrix = np.frombuffer(mapped, dtype=np.float32, count=rows * self.dim).reshape(rows, self.dim)
        if tail_from:
            raw_ids = known.raw_ids
            with self._lock:  # another thread may have extended it already, from the same file
                raw_ids += tail[len(raw_ids) - tail_from :]
        else:
            raw_ids = bytearray(tail)
        return Vectors(identity, rows * ID_BYTES, raw_ids, matrix, mapped)

    # --- what this process holds -------------------------------------------------------------------------

    def _cached(self, partition: str) -> Vectors | None:
        with self._lock:
            for lru in (self._read, self._maps):
                loaded = lru.get(partition)
                if loaded is not None:
                    lru.move_to_end(partition)
                    loaded.used_s = time.monotonic()
                    return loaded
        return None

    def _install(self, partition: str, loaded: Vectors) -> None:
        """Hold ``loaded`` (replacing the partition's earlier load); the least recently used out past the
        limits."""
        loaded.used_s = time.monotonic()
        out = []
        with self._lock:
            out.append(self._pop(partition))
            if loaded.mapped is None:
                self._read[partition] = loaded
                self._read_bytes += loaded.memory_bytes
                while self._read_bytes > self.read_cache_bytes and len(self._read) > 1:
                    out.append(self._pop(next(iter(self._read))))
            else:
                self._maps[partition] = loaded
                while len(self._maps) > self.max_maps:
                    out.append(self._pop(next(iter(self._maps))))
        for mapped in out:
            close_map(mapped)

    def _pop(self, partition: str) -> mmap.mmap | None:
        """Let go of a partition's load (under ``_lock``); its map, to close once the lock is released."""
        loaded = self._read.pop(partition, None)
        if loaded is not None:
            self._read_bytes -= loaded.memory_bytes
            return None
        loaded = self._maps.pop(partition, None)
        return None if loaded is None else loaded.mapped

    def forget(self, partition: str) -> None:
        with self._lock:
            mapped = self._pop(partition)
        close_map(mapped)

    def forget_all(self) -> None:
        with self._lock:
            maps = [self._pop(p) for p in list(self._maps)]
            self._read.clear()
            self._read_bytes = 0
        for mapped in maps:
            close_map(mapped)

    def close_idle(self, now: float) -> None:
        """Close maps unused for ``map_idle_s`` (the least recently used is first: one look when none is)."""
        out = []
        with self._lock:
            while self._maps:
                partition, oldest = next(iter(self._maps.items()))
                if now - oldest.used_s < self.map_idle_s:
                    break
                out.append(self._pop(partition))
        for mapped in out:
            close_map(mapped)

    def warn_damage(self, partition: str, what: str) -> None:
        """One warning per partition and kind of damage, however many lookups meet it."""
        self.damaged += 1
        if self._warned.get(partition) != what:
            if len(self._warned) > 1024:
                self._warned.clear()
            self._warned[partition] = what
            log.warning(
                "cache: index of partition %s damaged (%s): a miss until a writer repairs it", partition, what
            )


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (compaction replaces it, limits remove it)."""
    try:
        held, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _shared_lock(fd: int) -> bool:
    """A shared lock on ``fd``, waiting a few milliseconds at most for a writer to finish."""
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.001 * attempt)
    return False
