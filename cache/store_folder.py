"""What the cache's index folder holds: its files counted by partition, and the least recently used removed.

Entries and index files together stay within ``size_limit_bytes`` (:class:`cache.store.StoreLimits`).
diskcache evicts entries past ``1 - index_share`` of it; past the whole limit (or past ``max_partitions``
partitions with files), the index files of the least recently used partitions are removed: such a
partition has no semantic rows until new answers are stored, its entries still hit exactly. Index bytes
are counted as this process writes them and recounted from the folder every ``recount_s`` (other
processes write to it too, so the folder can pass its limit by what they wrote since); "used" is the ids
file's mtime, which a lookup refreshes at most every ``USED_TOUCH_S``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("nearshore.cache")
USED_TOUCH_S = 10.0  # a lookup refreshes its partition's "used" time on disk at most this often
_EVICT_TO = 0.9  # past a limit, files are removed down to this share of it (one pass per 10% of growth)
_STRAY_S = 3600.0  # a temporary file this old was left by a process that died: removed at a recount
_FILE_KINDS = ("vec", "ids", "ivf", "ivf.lock")
_ORPHAN_S = 60.0  # an IVF file with no rows beside it this old is removed (a build running may save one)


@dataclass(slots=True)
class _Files:
    """One partition's files in the index folder."""

    rows_bytes: int  # .vec + .ids
    ivf_bytes: int  # .ivf (+ its lock file, empty)
    used_s: float  # wall clock: the ids file's mtime, or this process's later use
    touched_s: float = 0.0  # wall clock: when this process last refreshed that mtime


class FolderUsage:
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

    def over(self, max_partitions: int, budget_bytes: int) -> bool:
        """Whether the folder holds more partitions or bytes of index files than its limits."""
        return len(self.partitions) > max_partitions or self.bytes > budget_bytes

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


def evict(usage: FolderUsage, max_partitions: int, budget_bytes: int, remove: Callable[[str], bool]) -> int:
    """Remove the files of the least recently used partitions with ``remove`` (False: a writer holds
    them) until the folder is back within ``_EVICT_TO`` of both limits; returns the partitions removed."""
    to_partitions, to_bytes = int(max_partitions * _EVICT_TO), int(budget_bytes * _EVICT_TO)
    removed, freed = 0, 0
    for partition, used_s in usage.oldest(len(usage.partitions)):
        count, total = len(usage.partitions), usage.bytes
        if count <= to_partitions and total <= to_bytes:
            break
        if usage.used_since(partition, used_s):  # by this process, while this pass ran
            continue
        with contextlib.suppress(OSError):
            mtime_s = (usage.index_dir / f"{partition}.ids").stat().st_mtime
            if mtime_s > used_s + 1.0:  # used since by another process: not the least recent
                usage.wrote(partition, 0, mtime_s)
                continue
        if remove(partition):
            removed, freed = removed + 1, freed + total - usage.bytes
    if removed:
        log.info(
            "cache: index files of %d least recently used partitions removed (%d bytes): now %d "
            "partitions, %d bytes of index files (limits %d, %d)",
            removed,
            freed,
            len(usage.partitions),
            usage.bytes,
            max_partitions,
            budget_bytes,
        )
    return removed
