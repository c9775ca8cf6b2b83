"""The response cache's storage: entries in diskcache, and each partition's vectors beside them.

Entries live in a ``diskcache.Cache`` (SQLite + files, safe for several edge processes on one machine),
keyed by their exact key, with a TTL and a size bound (least recently used out first). The semantic
level keeps, per partition, an append-only pair of files: ``<partition>.vec`` (float32 rows, L2-normalised)
and ``<partition>.ids`` (the 16-byte exact key of each row). A writer appends under an exclusive lock on
the ids file; a reader maps the files again when their size changed, so a row another process wrote is
seen on its next lookup. A row whose entry expired or was evicted is skipped (and the files are rewritten
without such rows when they are more than half dead). Nothing here trusts the files: a torn row, a corrupt
entry or a missing folder is a miss and a warning, never an error to the client.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import diskcache
import msgspec
import numpy as np

log = logging.getLogger("nearshore.cache")
_ID_BYTES = 16


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


@dataclass(slots=True)
class _Vectors:
    size: int  # bytes of the ids file when mapped
    ids: list[str]
    matrix: np.ndarray  # (n, dim) float32


class CacheStore:
    def __init__(self, folder: Path, dim: int, size_limit_bytes: int | None) -> None:
        """``size_limit_bytes=None`` keeps the folder's own settings (an operator's tool opening it)."""
        self.folder = folder
        self.dim = dim
        folder.mkdir(parents=True, exist_ok=True)
        settings = (
            {"size_limit": size_limit_bytes, "eviction_policy": "least-recently-used"}
            if size_limit_bytes is not None
            else {}
        )
        self.entries = diskcache.Cache(str(folder / "entries"), **settings)
        self.index_dir = folder / "index"
        self.index_dir.mkdir(exist_ok=True)
        self._vectors: dict[str, _Vectors] = {}

    def close(self) -> None:
        self.entries.close()

    # --- entries -------------------------------------------------------------------------------------------

    def get(self, exact: str, now: float | None = None) -> Entry | None:
        raw = self.entries.get(exact)
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

    def put(self, exact: str, entry: Entry, vector: np.ndarray | None) -> bool:
        """Store ``entry`` (and its row in the partition's index); False when another writer stored the
        same key first (one answer per key: the first)."""
        ttl = max(0.0, entry.expires_s - time.time())
        if not self.entries.add(exact, _encoder.encode(entry), expire=ttl):
            return False
        if vector is not None:
            self._append(entry.partition, exact, vector)
        return True

    def delete(self, exact: str) -> None:
        self.entries.delete(exact)

    # --- the semantic index ----------------------------------------------------------------------------

    def _paths(self, partition: str) -> tuple[Path, Path]:
        return self.index_dir / f"{partition}.vec", self.index_dir / f"{partition}.ids"

    def _append(self, partition: str, exact: str, vector: np.ndarray) -> None:
        vec_path, ids_path = self._paths(partition)
        row = np.asarray(vector, dtype=np.float32).reshape(self.dim).tobytes()
        with open(ids_path, "ab") as ids:
            fcntl.flock(ids, fcntl.LOCK_EX)
            try:
                # Both files end on a whole row: a crash mid-append leaves at most a torn tail, cut on read.
                with open(vec_path, "ab") as vec:
                    vec.write(row)
                ids.write(bytes.fromhex(exact))
            finally:
                fcntl.flock(ids, fcntl.LOCK_UN)

    def vectors(self, partition: str) -> _Vectors | None:
        """The partition's rows, mapped again if another writer added some since."""
        vec_path, ids_path = self._paths(partition)
        try:
            size = ids_path.stat().st_size
        except FileNotFoundError:
            self._vectors.pop(partition, None)
            return None
        known = self._vectors.get(partition)
        if known is not None and known.size == size:
            return known
        try:
            ids_raw = ids_path.read_bytes()
            matrix = np.fromfile(vec_path, dtype=np.float32)
        except OSError as exc:
            log.warning("cache: index of partition %s unreadable (%s)", partition, exc)
            return None
        rows = min(len(ids_raw) // _ID_BYTES, matrix.size // self.dim)
        ids = [ids_raw[i * _ID_BYTES : (i + 1) * _ID_BYTES].hex() for i in range(rows)]
        loaded = _Vectors(size, ids, matrix[: rows * self.dim].reshape(rows, self.dim))
        self._vectors[partition] = loaded
        return loaded

    def nearest(self, partition: str, query: np.ndarray, k: int, min_score: float) -> list[tuple[float, str]]:
        """Up to ``k`` (similarity, exact key) in the partition at or above ``min_score``, best first."""
        loaded = self.vectors(partition)
        if loaded is None or not loaded.ids:
            return []
        scores = loaded.matrix @ np.asarray(query, dtype=np.float32).reshape(self.dim)
        top = np.argpartition(scores, -k)[-k:] if len(scores) > k else np.arange(len(scores))
        found = [(float(scores[i]), loaded.ids[i]) for i in top if scores[i] >= min_score]
        return sorted(found, reverse=True)

    def compact(self, partition: str) -> int:
        """Rewrite the partition's files without rows whose entry is gone; the rows kept. (A writer that
        was waiting for the lock appends to the replaced file: its row is lost to the semantic level, not
        its entry, which exact lookups still find.)"""
        vec_path, ids_path = self._paths(partition)
        with open(ids_path, "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._vectors.pop(partition, None)
                loaded = self.vectors(partition)
                if loaded is None:
                    return 0
                keep = [i for i, exact in enumerate(loaded.ids) if exact in self.entries]
                tmp_vec, tmp_ids = vec_path.with_suffix(".vec.tmp"), ids_path.with_suffix(".ids.tmp")
                loaded.matrix[keep].astype(np.float32).tofile(tmp_vec)
                tmp_ids.write_bytes(b"".join(bytes.fromhex(loaded.ids[i]) for i in keep))
                os.replace(tmp_vec, vec_path)
                os.replace(tmp_ids, ids_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self._vectors.pop(partition, None)
        return len(keep)

    def clear(self) -> None:
        self.entries.clear()
        for path in self.index_dir.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
        self._vectors.clear()
