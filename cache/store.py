"""The response cache's storage: entries in diskcache, and each partition's vectors beside them.

Entries live in a ``diskcache.Cache`` (SQLite + files, safe for several edge processes on one machine),
keyed by their exact key, with a TTL and a size bound (least recently used out first). The semantic
level keeps, per partition, an append-only pair of files beside them, a vector and an exact key a row
(:mod:`cache.store_vectors`: their format, locks and repairs). A row whose entry expired or was evicted is
skipped (and :meth:`CacheStore.compact` rewrites the files without such rows). Nothing here trusts the
files: a torn row, a corrupt entry or a missing folder is a miss and a warning, never an error to the
client.

What one process holds is bounded whatever the number of partitions (:class:`StoreLimits`): the vector
files it reads or maps by :mod:`cache.store_vectors`, the IVF indexes in memory by
:mod:`cache.partition_index`. What the folder holds is bounded too: entries and index files together stay
within ``size_limit_bytes``, diskcache evicting entries and :mod:`cache.store_folder` the least recently
used partitions' index files, counted and checked on the store's own thread (:meth:`CacheStore.maintain`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import diskcache
import msgspec
import numpy as np

from cache import ivf
from cache.partition_index import MEMORY_BYTES, PartitionIndexes
from cache.store_folder import FolderUsage, evict
from cache.store_vectors import TOMBSTONE_HEX, VectorFiles, Vectors

log = logging.getLogger("nearshore.cache")
_CHECK_S = (
    1.0  # writes wake the store's thread to check the limits at most this often (or when one is passed)
)


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
# The entries count as full from this share of their space (diskcache culls at the limit itself).
_FULL_AT = 0.9
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
        self.files = VectorFiles(
            self.index_dir,
            dim,
            self.limits.read_max_bytes,
            self.limits.read_cache_bytes,
            self.limits.max_maps,
            self.limits.map_idle_s,
        )
        self.evicted_partitions = 0  # partitions whose files the folder's limits removed (for /metrics)
        self.usage = FolderUsage(self.index_dir)
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
        self.files.forget_all()
        self.entries.close()
        self._reader.close()
        self.indexes.close()

    # --- what the edge reports ---------------------------------------------------------------------------

    @property
    def open_maps(self) -> int:
        """Vector files memory-mapped by this process (one fd each): at most ``max_maps``, plus any that a
        lookup or an IVF build on another thread still reads after they were closed."""
        return self.files.open_maps

    @property
    def read_bytes(self) -> int:
        """This process's memory holding read partitions (at most ``read_cache_bytes``)."""
        return self.files.read_bytes

    @property
    def damaged(self) -> int:
        """Lookups and appends that met a damaged or truncated vector file (for /metrics)."""
        return self.files.damaged

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

    def add_vector(self, exact: str, entry: Entry, vector: np.ndarray) -> bool:
        """The index row of ``entry``, stored earlier without one (its question was embedded later); False
        when the key no longer holds that entry (evicted, replaced or expired meanwhile)."""
        stored = self.peek(exact)
        if stored is None or stored.created_s != entry.created_s or stored.text != entry.text:
            return False
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

    # --- the semantic index --------------------------------------------------------------------------------

    def _paths(self, partition: str) -> tuple[Path, Path]:
        return self.files.paths(partition)

    def _append(self, partition: str, exact: str, vector: np.ndarray) -> None:
        self._append_rows(partition, [exact], np.asarray(vector, dtype=np.float32).reshape(1, self.dim))

    def _append_rows(self, partition: str, exacts: list[str], matrix: np.ndarray) -> None:
        written = self.files.append(partition, exacts, matrix)
        self.usage.wrote(partition, written, time.time())
        self._wake_if_over()

    def vectors(self, partition: str) -> Vectors | None:
        """The partition's rows, loaded again if another writer added some since; None when it has none
        or its files are damaged (:meth:`cache.store_vectors.VectorFiles.vectors`)."""
        return self.files.vectors(partition)

    def nearest(self, partition: str, query: np.ndarray, k: int, min_score: float) -> list[tuple[float, str]]:
        """Up to ``k`` (similarity, exact key) in the partition at or above ``min_score``, best first: over
        every row of a small partition, over the rows its IVF index proposes in a large one."""
        loaded = self.files.vectors(partition)
        if loaded is None or not loaded.rows:
            return []
        self._used(partition, loaded)
        q = np.asarray(query, dtype=np.float32).reshape(self.dim)
        rows = self.indexes.candidates(partition, loaded, loaded.identity, q)
        if not loaded.intact():  # checked just before the read: a read past a truncated file is a SIGBUS
            self.files.warn_damage(partition, "its vector file shrank under its map")
            self.files.forget(partition)
            return []
        # np.take gathers a memory-mapped matrix's rows faster (and steadier) than fancy indexing does.
        scores = (loaded.matrix if rows is None else np.take(loaded.matrix, rows, axis=0)) @ q
        top = np.argpartition(scores, -k)[-k:] if len(scores) > k else np.arange(len(scores))
        found = []
        for i in top:
            if scores[i] >= min_score:
                exact = loaded.id_at(int(i if rows is None else rows[i]))
                if exact != TOMBSTONE_HEX:
                    found.append((float(scores[i]), exact))
        return sorted(found, reverse=True)

    def compact(self, partition: str) -> int:
        """Rewrite the partition's files without rows whose entry is gone; the rows kept. (A writer that
        was waiting for the lock finds the ids file replaced and appends to the new pair.)"""
        stale = self.indexes.path(partition)  # built on the replaced file: of no use now
        kept = self.files.rewrite(partition, lambda exact: exact in self.entries, stale)
        if kept is None:
            return 0
        self.indexes.forget(partition)  # its rows were renumbered: the IVF file is rebuilt when needed
        self.usage.removed(partition)
        self.usage.wrote(partition, self.files.bytes_of(kept), time.time())
        return kept

    def clear(self) -> None:
        self.entries.clear()
        self.files.forget_all()
        for path in self.index_dir.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        self.indexes.clear()
        self.usage.recount()

    # --- what the folder holds -------------------------------------------------------------------------

    def _used(self, partition: str, loaded: Vectors) -> None:
        wall_s = time.time()
        if self.usage.used(partition, self.files.bytes_of(loaded.rows), wall_s):
            with contextlib.suppress(OSError):  # the LRU order the other processes see
                os.utime(self.files.paths(partition)[1], (wall_s, wall_s))
        if self._maintainer is not None and time.monotonic() - self.usage.counted_s > self.limits.recount_s:
            self._wake.set()

    @property
    def entries_capacity(self) -> int | None:
        """The bytes the entries may take (None: the folder's own settings, an operator's tool)."""
        if self.size_limit_bytes is None:
            return None
        return int(self.size_limit_bytes * (1 - self.limits.index_share))

    @property
    def entries_full(self) -> bool:
        """Whether the entries filled their space at the last check: each new one evicts an old one."""
        capacity = self.entries_capacity
        return capacity is not None and self._entries_bytes >= _FULL_AT * capacity

    def _index_budget(self) -> int | None:
        if self.size_limit_bytes is None:
            return None
        return self.size_limit_bytes - self._entries_bytes

    def _over(self) -> bool:
        budget = self._index_budget()
        return budget is not None and self.usage.over(self.limits.max_partitions, budget)

    def _wake_if_over(self) -> None:
        if self._maintainer is not None and (self._over() or time.monotonic() - self._checked_s > _CHECK_S):
            self._wake.set()

    def maintain(self, recount: bool = False) -> None:
        """Recount the folder when due (or asked), close idle maps, and remove the index files of the least
        recently used partitions while the folder is over its limits. Runs on the store's own thread."""
        with self._maintaining:
            self.files.close_idle(time.monotonic())
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
        self.evicted_partitions += evict(self.usage, self.limits.max_partitions, budget, self._remove_files)

    def _remove_files(self, partition: str) -> bool:
        """Remove a partition's files under its lock (False if a writer or a compaction holds it); its
        entries stay, found by exact lookups."""
        beside = (self.indexes.path(partition), self.index_dir / f"{partition}.ivf.lock")
        if not self.files.remove(partition, beside):
            return False
        self.usage.removed(partition)
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
