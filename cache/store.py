"""The response cache's storage: entries in diskcache, and each partition's vectors beside them.

Entries live in a ``diskcache.Cache`` (SQLite + files, safe for several edge processes on one machine),
keyed by their exact key, with a TTL and a size bound (least recently used out first). The semantic
level keeps, per partition, an append-only pair of files: ``<partition>.vec`` (float32 rows, L2-normalised)
and ``<partition>.ids`` (the 16-byte exact key of each row). A writer appends under an exclusive lock on
the ids file; a reader loads the files again (under a shared lock) when their size changed, so a row another
process wrote is seen on its next lookup. A row whose entry expired or was evicted is skipped (and
:meth:`CacheStore.compact` rewrites the files without such rows). Nothing here trusts the files: a torn
row, a corrupt entry or a missing folder is a miss and a warning, never an error to the client; a writer
that finds the pair out of step (a crash between its two writes, a damaged file) puts it back in step
before it appends.

What one process holds is bounded whatever the number of partitions (:class:`StoreLimits`): a vector file
up to ``read_max_bytes`` is read into memory (no file kept open; below ~1 MiB a read costs less than a
fresh map), in an LRU of ``read_cache_bytes``; a larger one is memory-mapped, since the page cache behind a
map is shared by every worker process on the folder, with at most ``max_maps`` maps open (one fd each),
least recently used closed first and any idle for ``map_idle_s`` closed. IVF indexes in memory are bounded
by :mod:`cache.partition_index`.

What the folder holds is bounded too: entries and index files together stay within ``size_limit_bytes``.
diskcache evicts entries past ``1 - index_share`` of it; past the whole limit (or past ``max_partitions``
partitions with files), the index files of the least recently used partitions are removed: such a
partition has no semantic rows until new answers are stored, its entries still hit exactly. Index bytes
are counted as this process writes them and recounted from the folder every ``recount_s`` (other
processes write to it too, so the folder can pass its limit by what they wrote since); "used" is the ids
file's mtime, which a lookup refreshes at most every ``USED_TOUCH_S``.

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
import itertools
import logging
import mmap
import os
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import diskcache
import msgspec
import numpy as np

from cache import ivf
from cache.partition_index import MEMORY_BYTES, PartitionIndexes

log = logging.getLogger("nearshore.cache")
_ID_BYTES = 16
_TOMBSTONE = b"\xff" * _ID_BYTES  # the id of a row that has no entry (a writer's repair): never returned
_TOMBSTONE_HEX = _TOMBSTONE.hex()
USED_TOUCH_S = 10.0  # a lookup refreshes its partition's "used" time on disk at most this often
_LOCK_TRIES = 5  # a reload waits at most ~10 ms for a writer (a compaction holds the lock for longer)
_CHECK_S = (
    1.0  # writes wake the store's thread to check the limits at most this often (or when one is passed)
)
_EVICT_TO = 0.9  # past a limit, files are removed down to this share of it (one pass per 10% of growth)
_STRAY_S = 3600.0  # a temporary file this old was left by a process that died: removed at a recount
_FILE_KINDS = ("vec", "ids", "ivf", "ivf.lock")
_ORPHAN_S = 60.0  # an IVF file with no rows beside it this old is removed (a build running may save one)


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One cached answer: what was asked, what was answered, and when it stops being served."""

    partition: str
    query: str
    kind: str  # "chat" | "completions"
    text: str  # the answer's content
    finish_reason: str
    completion_tokens: int
    model: str
    created_s: float
    expires_s: float
    scope: str = ""  # the tenant (or shared scope) it belongs to: shown by `nearshore cache` on request only


_entry_decoder = msgspec.msgpack.Decoder(Entry)
_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """What one process holds open and in memory, and what the folder holds on disk (module docstring)."""

    read_max_bytes: int = 1 << 20  # vector files up to this are read into memory, larger ones mapped
    read_cache_bytes: int = 64 << 20  # memory for read partitions, per process (least recently used out)
    max_maps: int = 64  # memory-mapped partitions open at once, per process (one fd each)
    map_idle_s: float = 60.0  # a map unused this long is closed
    index_memory_bytes: int = MEMORY_BYTES  # IVF indexes held in memory, per process
    max_partitions: int = 10_000  # partitions with files in the index folder
    index_share: float = 0.5  # of size_limit_bytes, kept for the index files (entries get the rest)
    recount_s: float = 30.0  # between recounts of the index folder's files


@dataclass(slots=True, eq=False)
class _Vectors:
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
        return bytes(self.raw_ids[row * _ID_BYTES : (row + 1) * _ID_BYTES]).hex()

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


def _close_map(mapped: mmap.mmap | None) -> None:
    """Unmap now, or (a lookup on another thread still reads it) when its last reader lets go of it."""
    if mapped is not None:
        with contextlib.suppress(BufferError):
            mapped.close()


@dataclass(slots=True)
class _Files:
    """One partition's files in the index folder."""

    rows_bytes: int  # .vec + .ids
    ivf_bytes: int  # .ivf (+ its lock file, empty)
    used_s: float  # wall clock: the ids file's mtime, or this process's later use
    touched_s: float = 0.0  # wall clock: when this process last refreshed that mtime


class _FolderUsage:
    """The index folder's files by partition, least recently used first: counted as this process writes
    them, recounted from the folder now and then (the other processes' files)."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = index_dir
        self.partitions: OrderedDict[str, _Files] = OrderedDict()
        self.bytes = 0  # every file's, temporary ones included
        self.counted_s = float("-inf")  # monotonic, the last recount
        self._lock = threading.Lock()

    def wrote(self, partition: str, nbytes: int, now_s: float) -> None:
        with self._lock:
            files = self.partitions.get(partition)
            if files is None:
                self.partitions[partition] = _Files(nbytes, 0, now_s)
            else:
                files.rows_bytes += nbytes
                files.used_s = max(files.used_s, now_s)
                self.partitions.move_to_end(partition)
            self.bytes += nbytes

    def saved_ivf(self, partition: str, nbytes: int) -> None:
        with self._lock:
            files = self.partitions.get(partition)
            if files is not None:
                self.bytes += nbytes - files.ivf_bytes
                files.ivf_bytes = nbytes

    def used(self, partition: str, rows_bytes: int, now_s: float) -> bool:
        """Record a lookup; True when the file's mtime is due a refresh."""
        with self._lock:
            files = self.partitions.get(partition)
            if files is None:  # another process's, since the last recount
                files = self.partitions[partition] = _Files(rows_bytes, 0, now_s)
                self.bytes += rows_bytes
            files.used_s = now_s
            self.partitions.move_to_end(partition)
            if now_s - files.touched_s < USED_TOUCH_S:
                return False
            files.touched_s = now_s
            return True

    def removed(self, partition: str) -> None:
        with self._lock:
            files = self.partitions.pop(partition, None)
            if files is not None:
                self.bytes -= files.rows_bytes + files.ivf_bytes

    def oldest(self, count: int) -> list[tuple[str, float]]:
        with self._lock:
            return [(p, f.used_s) for p, f in itertools.islice(self.partitions.items(), count)]

    def used_since(self, partition: str, used_s: float) -> bool:
        with self._lock:
            files = self.partitions.get(partition)
            return files is None or files.used_s > used_s

    def recount(self) -> list[str]:
        """Read every file's size and mtime (a scan of the folder); returns the partitions whose only files
        are a stale IVF index (their rows were removed while a build ran) for the caller to remove."""
        found: dict[str, _Files] = {}
        has_rows: set[str] = set()
        stray = 0
        wall_s = time.time()
        with os.scandir(self.index_dir) as names:
            for name in names:
                try:
                    stat = name.stat()
                except OSError:
                    continue  # removed meanwhile
                partition, _, kind = name.name.partition(".")
                if kind not in _FILE_KINDS:  # a writer's temporary file
                    if wall_s - stat.st_mtime > _STRAY_S:
                        with contextlib.suppress(OSError):
                            os.unlink(name.path)
                    else:
                        stray += stat.st_size
                    continue
                files = found.setdefault(partition, _Files(0, 0, 0.0))
                if kind in ("vec", "ids"):
                    has_rows.add(partition)
                    files.rows_bytes += stat.st_size
                    files.used_s = max(files.used_s, stat.st_mtime)
                else:
                    files.ivf_bytes += stat.st_size
                    files.used_s = max(files.used_s, stat.st_mtime)
        orphans = [p for p, f in found.items() if p not in has_rows and wall_s - f.used_s > _ORPHAN_S]
        with self._lock:
            for partition, files in found.items():
                known = self.partitions.get(partition)
                if known is not None:
                    files.used_s, files.touched_s = max(files.used_s, known.used_s), known.touched_s
            self.partitions = OrderedDict(sorted(found.items(), key=lambda item: item[1].used_s))
            self.bytes = stray + sum(f.rows_bytes + f.ivf_bytes for f in found.values())
            self.counted_s = time.monotonic()
        return orphans


class CacheStore:
    def __init__(
        self,
        folder: Path,
        dim: int,
        size_limit_bytes: int | None,
        index_min_rows: int = ivf.MIN_ROWS,
        limits: StoreLimits | None = None,
    ) -> None:
        """``size_limit_bytes=None`` keeps the folder's own settings and removes no index files (an
        operator's tool opening it)."""
        self.folder = folder
        self.dim = dim
        self.limits = limits or StoreLimits()
        if not 0 <= self.limits.index_share < 1:
            raise ValueError(f"index_share must be in [0, 1), not {self.limits.index_share}")
        self.size_limit_bytes = size_limit_bytes
        folder.mkdir(parents=True, exist_ok=True)
        settings = (
            {
                "size_limit": int(size_limit_bytes * (1 - self.limits.index_share)),
                "eviction_policy": "least-recently-used",
            }
            if size_limit_bytes is not None
            else {}
        )
        self.entries = diskcache.Cache(str(folder / "entries"), **settings)
        # The same rows, read without recording the access: a full disk fails the LRU's write on every read,
        # and the answers already stored should still be served then.
        self._reader = diskcache.Cache(str(folder / "entries"))
        self._reader.reset("eviction_policy", "none", update=False)
        self.index_dir = folder / "index"
        self.index_dir.mkdir(exist_ok=True)
        self._row_bytes = 4 * dim
        self._lock = threading.Lock()  # around the two LRUs below
        self._read: OrderedDict[str, _Vectors] = OrderedDict()  # least recently used first
        self._read_bytes = 0
        self._maps: OrderedDict[str, _Vectors] = OrderedDict()
        self._live_maps: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()  # with those still being read
        self._warned: dict[str, str] = {}  # partition -> the damage last warned about
        self.damaged = 0  # lookups and appends that met a damaged or truncated vector file (for /metrics)
        self.evicted_partitions = 0  # partitions whose files the folder's limits removed (for /metrics)
        self.usage = _FolderUsage(self.index_dir)
        self._entries_bytes = 0  # diskcache's volume at the last check
        self._checked_s = float("-inf")  # monotonic, the last check of the limits
        self.indexes = PartitionIndexes(
            self.index_dir, dim, index_min_rows, self.limits.index_memory_bytes, self.usage.saved_ivf
        )
        self._maintaining = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._maintainer: threading.Thread | None = None
        if size_limit_bytes is not None:  # an operator's tool removes nothing, and needs no count
            self.maintain()
            period_s = min(self.limits.recount_s, self.limits.map_idle_s / 2)
            self._maintainer = threading.Thread(
                target=_maintain_loop,
                args=(weakref.ref(self), self._wake, self._closing, period_s),
                name="cache-store",
                daemon=True,
            )
            self._maintainer.start()

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        if self._maintainer is not None and self._maintainer is not threading.current_thread():
            self._maintainer.join(5.0)
        self._forget_all()
        self.entries.close()
        self._reader.close()
        self.indexes.close()

    # --- what the edge reports ---------------------------------------------------------------------------

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

    @property
    def index_bytes(self) -> int:
        """The index folder's files, as last counted plus what this process wrote since."""
        return self.usage.bytes

    @property
    def partitions(self) -> int:
        """Partitions with files in the index folder (at most ``max_partitions``, give or take a recount)."""
        return len(self.usage.partitions)

    # --- entries -------------------------------------------------------------------------------------------

    def get(self, exact: str, now: float | None = None) -> Entry | None:
        """The entry, its read recorded for the LRU eviction (a small write transaction)."""
        try:
            raw = self.entries.get(exact)
        except sqlite3.OperationalError:  # "database or disk is full": read without the LRU's update
            raw = self._reader.get(exact)
        return self._decoded(exact, raw, now)

    def peek(self, exact: str, now: float | None = None) -> Entry | None:
        """The entry, read without recording the read: no write transaction, so no lock wait or WAL
        checkpoint in the way (measured at 100k entries: p99 0.34 ms against 7.7 ms for :meth:`get`).
        Semantic candidates are peeked; the one served is recorded with :meth:`touch`, off the hot path."""
        return self._decoded(exact, self._reader.get(exact), now)

    def touch(self, exact: str) -> None:
        """Record a read of ``exact`` for the LRU eviction."""
        self.entries.get(exact)

    def _decoded(self, exact: str, raw: object, now: float | None) -> Entry | None:
        if raw is None:
            return None
        try:
            entry = _entry_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("cache: entry %s does not decode; dropped", exact)
            self.entries.delete(exact)
            return None
        if entry.expires_s <= (time.time() if now is None else now):
            return None
        return entry

    def put(self, exact: str, entry: Entry, vector: np.ndarray | None, replace: bool = False) -> bool:
        """Store ``entry`` (and its row in the partition's index); False when another writer stored the
        same key first (one answer per key: the first), unless ``replace`` (a fresh answer asked for: it
        takes the key's place, and the row the key already has serves it)."""
        ttl = max(0.0, entry.expires_s - time.time())
        if replace:
            had = self._reader.get(exact) is not None
            self.entries.set(exact, _encoder.encode(entry), expire=ttl)
            if vector is not None and not had:
                self._append(entry.partition, exact, vector)
            return True
        if not self.entries.add(exact, _encoder.encode(entry), expire=ttl):
            return False
        if vector is not None:
            self._append(entry.partition, exact, vector)
        return True

    def put_many(self, items: list[tuple[str, Entry]], vectors: np.ndarray) -> int:
        """Store many entries of one partition in one transaction, and their rows (``vectors[i]`` for
        ``items[i]``) in one write; an exact key already stored keeps its answer and gets no row. Returns
        the entries stored."""
        if not items:
            return 0
        partition = items[0][1].partition
        now = time.time()
        kept = []
        with self.entries.transact():
            for i, (exact, entry) in enumerate(items):
                if entry.partition != partition:
                    raise ValueError("put_many stores one partition at a time")
                if self.entries.add(exact, _encoder.encode(entry), expire=max(0.0, entry.expires_s - now)):
                    kept.append(i)
        if kept:
            self._append_rows(partition, [items[i][0] for i in kept], np.asarray(vectors)[kept])
        return len(kept)

    def delete(self, exact: str) -> None:
        self.entries.delete(exact)

    # --- the semantic index: writing -------------------------------------------------------------------

    def _paths(self, partition: str) -> tuple[Path, Path]:
        return self.index_dir / f"{partition}.vec", self.index_dir / f"{partition}.ids"

    def _append(self, partition: str, exact: str, vector: np.ndarray) -> None:
        self._append_rows(partition, [exact], np.asarray(vector, dtype=np.float32).reshape(1, self.dim))

    def _append_rows(self, partition: str, exacts: list[str], matrix: np.ndarray) -> None:
        vec_path, ids_path = self._paths(partition)
        rows = np.ascontiguousarray(matrix, dtype=np.float32).reshape(len(exacts), self.dim).tobytes()
        with self._exclusive(ids_path) as ids_fd:
            vec_fd = os.open(vec_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                added = self._in_step(partition, ids_fd, vec_fd)
                # Both files end on a whole row: a crash mid-append leaves at most a tail, cut on read (and
                # put back in step by the next writer).
                _write(vec_fd, rows)
                _write(ids_fd, b"".join(bytes.fromhex(exact) for exact in exacts))
            finally:
                os.close(vec_fd)
        self.usage.wrote(partition, added + len(rows) + _ID_BYTES * len(exacts), time.time())
        self._wake_if_over()

    @contextlib.contextmanager
    def _exclusive(self, ids_path: Path) -> Iterator[int]:
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
        num_ids, num_vectors = ids_size // _ID_BYTES, vec_size // self._row_bytes
        if num_ids > num_vectors or ids_size % _ID_BYTES:
            if num_ids > num_vectors:
                self._warn_damage(partition, f"{num_ids} ids but {num_vectors} vectors: ids cut to match")
            num_ids = min(num_ids, num_vectors)
            os.ftruncate(ids_fd, num_ids * _ID_BYTES)
        added = 0
        if vec_size % self._row_bytes:
            pad = self._row_bytes - vec_size % self._row_bytes
            _write(vec_fd, bytes(pad))
            num_vectors += 1
            added += pad
        if num_vectors > num_ids:
            _write(ids_fd, _TOMBSTONE * (num_vectors - num_ids))
            added += _ID_BYTES * (num_vectors - num_ids)
        return added

    # --- the semantic index: reading -------------------------------------------------------------------

    def vectors(self, partition: str) -> _Vectors | None:
        """The partition's rows, loaded again if another writer added some since (a small partition is
        read whole; a large one's new ids are read and its vectors mapped again); None when it has none
        or its files are damaged."""
        self._close_idle(time.monotonic())
        vec_path, ids_path = self._paths(partition)
        try:
            ids_stat, vec_stat = ids_path.stat(), vec_path.stat()
        except FileNotFoundError:
            self._forget(partition)
            return None
        except OSError as exc:
            log.warning("cache: index of partition %s unreadable (%s)", partition, exc)
            self._forget(partition)
            return None
        known = self._cached(partition)
        if known is not None and known.identity == (vec_stat.st_dev, vec_stat.st_ino):
            if vec_stat.st_size < known.matrix.nbytes:
                self._warn_damage(partition, f"its vector file shrank to {vec_stat.st_size} bytes")
                self._forget(partition)
                return None
            if known.size == ids_stat.st_size:
                return known
        try:
            loaded = self._load(partition, known)
        except (OSError, ValueError) as exc:
            log.warning("cache: index of partition %s unreadable (%s)", partition, exc)
            self._forget(partition)
            return None
        if loaded is None:
            self._forget(partition)
        elif loaded is not known:
            self._install(partition, loaded)
        return loaded

    def _load(self, partition: str, known: _Vectors | None, locked: bool = False) -> _Vectors | None:
        """The files read (or mapped) under a shared lock, so that a compaction is never seen half done;
        ``known`` while a long compaction holds the lock (None if it is not of the current files)."""
        vec_path, ids_path = self._paths(partition)
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
        self, partition: str, known: _Vectors | None, ids_fd: int, ids_size: int, vec: BinaryIO
    ) -> _Vectors | None:
        vec_stat = os.fstat(vec.fileno())
        identity = (vec_stat.st_dev, vec_stat.st_ino)
        num_ids, num_vectors = ids_size // _ID_BYTES, vec_stat.st_size // self._row_bytes
        if num_ids > num_vectors:  # a writer writes the vector first: the vector file lost rows
            self._warn_damage(partition, f"{num_ids} ids but only {num_vectors} vectors")
            return None
        rows = num_ids
        matrix_bytes = rows * self._row_bytes
        if matrix_bytes <= self.limits.read_max_bytes:
            raw_ids = os.pread(ids_fd, rows * _ID_BYTES, 0)
            data = os.pread(vec.fileno(), matrix_bytes, 0)
            if len(raw_ids) < rows * _ID_BYTES or len(data) < matrix_bytes:
                self._warn_damage(partition, "a short read")
                return None
            matrix = np.frombuffer(data, dtype=np.float32).reshape(rows, self.dim)
            return _Vectors(identity, rows * _ID_BYTES, raw_ids, matrix)
        # A mapped one's fd keeps its inode: the same identity is the same file, so only new ids are read.
        tail_from = known.size if known is not None and known.mapped is not None else 0
        if tail_from and (known.identity != identity or tail_from > rows * _ID_BYTES):
            tail_from = 0
        tail = os.pread(ids_fd, rows * _ID_BYTES - tail_from, tail_from)
        if len(tail) < rows * _ID_BYTES - tail_from:
            self._warn_damage(partition, "a short read of its ids")
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
        return _Vectors(identity, rows * _ID_BYTES, raw_ids, matrix, mapped)

    def nearest(self, partition: str, query: np.ndarray, k: int, min_score: float) -> list[tuple[float, str]]:
        """Up to ``k`` (similarity, exact key) in the partition at or above ``min_score``, best first: over
        every row of a small partition, over the rows its IVF index proposes in a large one."""
        loaded = self.vectors(partition)
        if loaded is None or not loaded.rows:
            return []
        self._used(partition, loaded)
        q = np.asarray(query, dtype=np.float32).reshape(self.dim)
        rows = self.indexes.candidates(partition, loaded, loaded.identity, q)
        if not loaded.intact():  # checked just before the read: a read past a truncated file is a SIGBUS
            self._warn_damage(partition, "its vector file shrank under its map")
            self._forget(partition)
            return []
        # np.take gathers a memory-mapped matrix's rows faster (and steadier) than fancy indexing does.
        scores = (loaded.matrix if rows is None else np.take(loaded.matrix, rows, axis=0)) @ q
        top = np.argpartition(scores, -k)[-k:] if len(scores) > k else np.arange(len(scores))
        found = []
        for i in top:
            if scores[i] >= min_score:
                exact = loaded.id_at(int(i if rows is None else rows[i]))
                if exact != _TOMBSTONE_HEX:
                    found.append((float(scores[i]), exact))
        return sorted(found, reverse=True)

    def compact(self, partition: str) -> int:
        """Rewrite the partition's files without rows whose entry is gone; the rows kept. (A writer that
        was waiting for the lock finds the ids file replaced and appends to the new pair.)"""
        vec_path, ids_path = self._paths(partition)
        if not ids_path.exists():
            return 0
        with self._exclusive(ids_path):
            self._forget(partition)
            loaded = self._load(partition, None, locked=True)
            if loaded is None:
                return 0
            keep = [i for i in range(loaded.rows) if loaded.id_at(i) in self.entries]
            tmp_vec, tmp_ids = vec_path.with_suffix(".vec.tmp"), ids_path.with_suffix(".ids.tmp")
            np.asarray(loaded[keep], dtype=np.float32).tofile(tmp_vec)
            tmp_ids.write_bytes(b"".join(bytes.fromhex(loaded.id_at(i)) for i in keep))
            mapped = loaded.mapped
            del loaded
            _close_map(mapped)
            os.replace(tmp_vec, vec_path)
            os.replace(tmp_ids, ids_path)
            with contextlib.suppress(FileNotFoundError):
                self.indexes.path(partition).unlink()  # built on the replaced file: of no use now
        self.indexes.forget(partition)  # its rows were renumbered: the IVF file is rebuilt when needed
        self.usage.removed(partition)
        self.usage.wrote(partition, len(keep) * (self._row_bytes + _ID_BYTES), time.time())
        return len(keep)

    def clear(self) -> None:
        self.entries.clear()
        self._forget_all()
        for path in self.index_dir.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        self.indexes.clear()
        self.usage.recount()

    # --- what this process holds -----------------------------------------------------------------------

    def _cached(self, partition: str) -> _Vectors | None:
        with self._lock:
            for lru in (self._read, self._maps):
                loaded = lru.get(partition)
                if loaded is not None:
                    lru.move_to_end(partition)
                    loaded.used_s = time.monotonic()
                    return loaded
        return None

    def _install(self, partition: str, loaded: _Vectors) -> None:
        """Hold ``loaded`` (replacing the partition's earlier load); the least recently used out past the
        limits."""
        loaded.used_s = time.monotonic()
        out = []
        with self._lock:
            out.append(self._pop(partition))
            if loaded.mapped is None:
                self._read[partition] = loaded
                self._read_bytes += loaded.memory_bytes
                while self._read_bytes > self.limits.read_cache_bytes and len(self._read) > 1:
                    out.append(self._pop(next(iter(self._read))))
            else:
                self._maps[partition] = loaded
                while len(self._maps) > self.limits.max_maps:
                    out.append(self._pop(next(iter(self._maps))))
        for mapped in out:
            _close_map(mapped)

    def _pop(self, partition: str) -> mmap.mmap | None:
        """Let go of a partition's load (under ``_lock``); its map, to close once the lock is released."""
        loaded = self._read.pop(partition, None)
        if loaded is not None:
            self._read_bytes -= loaded.memory_bytes
            return None
        loaded = self._maps.pop(partition, None)
        return None if loaded is None else loaded.mapped

    def _forget(self, partition: str) -> None:
        with self._lock:
            mapped = self._pop(partition)
        _close_map(mapped)

    def _forget_all(self) -> None:
        with self._lock:
            maps = [self._pop(p) for p in list(self._maps)]
            self._read.clear()
            self._read_bytes = 0
        for mapped in maps:
            _close_map(mapped)

    def _close_idle(self, now: float) -> None:
        """Close maps unused for ``map_idle_s`` (the least recently used is first: one look when none is)."""
        out = []
        with self._lock:
            while self._maps:
                partition, oldest = next(iter(self._maps.items()))
                if now - oldest.used_s < self.limits.map_idle_s:
                    break
                out.append(self._pop(partition))
        for mapped in out:
            _close_map(mapped)

    def _warn_damage(self, partition: str, what: str) -> None:
        """One warning per partition and kind of damage, however many lookups meet it."""
        self.damaged += 1
        if self._warned.get(partition) != what:
            if len(self._warned) > 1024:
                self._warned.clear()
            self._warned[partition] = what
            log.warning(
                "cache: index of partition %s damaged (%s): a miss until a writer repairs it", partition, what
            )

    # --- what the folder holds -------------------------------------------------------------------------

    def _used(self, partition: str, loaded: _Vectors) -> None:
        wall_s = time.time()
        if self.usage.used(partition, loaded.rows * (self._row_bytes + _ID_BYTES), wall_s):
            with contextlib.suppress(OSError):  # the LRU order the other processes see
                os.utime(self._paths(partition)[1], (wall_s, wall_s))
        if self._maintainer is not None and time.monotonic() - self.usage.counted_s > self.limits.recount_s:
            self._wake.set()

    def _index_budget(self) -> int | None:
        if self.size_limit_bytes is None:
            return None
        return self.size_limit_bytes - self._entries_bytes

    def _over(self) -> bool:
        budget = self._index_budget()
        if budget is None:
            return False
        return len(self.usage.partitions) > self.limits.max_partitions or self.usage.bytes > budget

    def _wake_if_over(self) -> None:
        if self._maintainer is not None and (self._over() or time.monotonic() - self._checked_s > _CHECK_S):
            self._wake.set()

    def maintain(self, recount: bool = False) -> None:
        """Recount the folder when due (or asked), close idle maps, and remove the index files of the least
        recently used partitions while the folder is over its limits. Runs on the store's own thread."""
        with self._maintaining:
            self._close_idle(time.monotonic())
            if recount or time.monotonic() - self.usage.counted_s >= self.limits.recount_s:
                for partition in self.usage.recount():
                    self._remove_files(partition)
            if self.size_limit_bytes is not None:
                with contextlib.suppress(sqlite3.Error):  # two small reads: the entries grow between recounts
                    self._entries_bytes = self.entries.volume()
            self._checked_s = time.monotonic()
            if self._over():
                self._evict()

    def _evict(self) -> None:
        budget = self._index_budget()
        assert budget is not None
        max_partitions, max_bytes = int(self.limits.max_partitions * _EVICT_TO), int(budget * _EVICT_TO)
        removed, freed = 0, 0
        for partition, used_s in self.usage.oldest(len(self.usage.partitions)):
            count, total = len(self.usage.partitions), self.usage.bytes
            if count <= max_partitions and total <= max_bytes:
                break
            if self.usage.used_since(partition, used_s):  # by this process, while this pass ran
                continue
            with contextlib.suppress(OSError):
                mtime_s = self._paths(partition)[1].stat().st_mtime
                if mtime_s > used_s + 1.0:  # used since by another process: not the least recent
                    self.usage.wrote(partition, 0, mtime_s)
                    continue
            if self._remove_files(partition):
                removed, freed = removed + 1, freed + total - self.usage.bytes
        if removed:
            self.evicted_partitions += removed
            log.info(
                "cache: index files of %d least recently used partitions removed (%d bytes): now %d "
                "partitions, %d bytes of index files (limits %d, %d)",
                removed,
                freed,
                len(self.usage.partitions),
                self.usage.bytes,
                self.limits.max_partitions,
                budget,
            )

    def _remove_files(self, partition: str) -> bool:
        """Remove a partition's files under its lock (False if a writer or a compaction holds it); its
        entries stay, found by exact lookups."""
        vec_path, ids_path = self._paths(partition)
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
            for path in (
                vec_path,
                ids_path,
                self.indexes.path(partition),
                self.index_dir / f"{partition}.ivf.lock",
            ):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        finally:
            if fd is not None:
                os.close(fd)
        self.usage.removed(partition)
        self._forget(partition)
        self.indexes.forget(partition)
        return True


def _maintain_loop(
    store_ref: weakref.ref[CacheStore], wake: threading.Event, closing: threading.Event, period_s: float
) -> None:
    """The store's own thread: :meth:`CacheStore.maintain` every ``period_s``, or when a write passes a
    limit. It holds the store weakly, so a store dropped without ``close`` still goes."""
    while not closing.is_set():
        wake.wait(period_s)
        wake.clear()
        store = store_ref()
        if store is None or closing.is_set():
            return
        try:
            store.maintain()
        except Exception as exc:  # a folder gone or unreadable: lookups say so, this tries again later
            log.warning("cache: index folder not maintained (%s)", exc)
        del store


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
