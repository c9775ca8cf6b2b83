"""The operator's view of a cache folder: what is in it, and clearing some or all of it (``nearshore cache``).

It opens the folder as the edges do (diskcache is safe to share with running edges) but keeps the folder's
own settings (its size bound is the edges'), and never creates a folder that is not there. Tenants are
not shown unless asked: an entry's partition is a hash; its ``scope`` (the tenant) is printed only with
``show_tenants``.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import diskcache
import msgspec

from cache.store import CacheStore, Entry

_decoder = msgspec.msgpack.Decoder(Entry)
_ID_BYTES = 16


class NoCache(FileNotFoundError):
    """The folder holds no cache."""


@dataclass(frozen=True, slots=True)
class Row:
    exact: str
    entry: Entry | None  # None: expired, or the stored bytes do not decode
    expired: bool = False  # past its TTL (diskcache keeps it until culled, and never returns it)


@dataclass(slots=True)
class Stats:
    folder: str
    entries: int = 0
    expired: int = 0
    undecodable: int = 0
    bytes_on_disk: int = 0
    entries_bytes: int = 0  # diskcache's volume (SQLite pages and value files)
    index_bytes: int = 0  # the partitions' vector and id files
    partitions: int = 0
    oldest_created_s: float | None = None
    newest_created_s: float | None = None
    top_partitions: list[dict] = field(default_factory=list)  # partition, entries, rows, (scope)


def open_entries(folder: Path) -> diskcache.Cache:
    if not (folder / "entries").is_dir():
        raise NoCache(f"no cache at {folder} (no entries folder)")
    return diskcache.Cache(str(folder / "entries"))  # no settings passed: the folder's own are kept


def rows(entries: diskcache.Cache) -> Iterator[Row]:
    """Every stored entry, expired ones included (diskcache keeps them until culled)."""
    for exact in entries.iterkeys():
        raw = entries.get(exact, retry=True)
        if raw is None:  # expired by diskcache's clock (the same TTL as the entry's), or just deleted
            yield Row(str(exact), None, expired=True)
            continue
        try:
            yield Row(str(exact), _decoder.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
            yield Row(str(exact), None)


def _index_files(folder: Path) -> list[Path]:
    index = folder / "index"
    return sorted(index.iterdir()) if index.is_dir() else []


def _index_rows(folder: Path) -> Counter[str]:
    return Counter(
        {p.stem: p.stat().st_size // _ID_BYTES for p in _index_files(folder) if p.suffix == ".ids"}
    )


def _disk_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def stats(folder: Path, top: int = 10, show_tenants: bool = False, now: float | None = None) -> Stats:
    now = time.time() if now is None else now
    entries = open_entries(folder)
    try:
        out = Stats(folder=str(folder), entries_bytes=int(entries.volume()))
        per_partition: Counter[str] = Counter()
        scopes: dict[str, str] = {}
        for row in rows(entries):
            out.entries += 1
            entry = row.entry
            if entry is None:
                out.expired += row.expired
                out.undecodable += not row.expired
                continue
            if entry.expires_s <= now:
                out.expired += 1
            per_partition[entry.partition] += 1
            scopes.setdefault(entry.partition, entry.scope)
            out.oldest_created_s = min(out.oldest_created_s or entry.created_s, entry.created_s)
            out.newest_created_s = max(out.newest_created_s or entry.created_s, entry.created_s)
    finally:
        entries.close()
    index_rows = _index_rows(folder)
    out.index_bytes = sum(p.stat().st_size for p in _index_files(folder))
    out.bytes_on_disk = _disk_bytes(folder)
    out.partitions = len(set(per_partition) | set(index_rows))
    for partition, count in per_partition.most_common(top):
        row = {"partition": partition, "entries": count, "rows": index_rows.get(partition, 0)}
        if show_tenants:
            row["scope"] = scopes.get(partition, "")
        out.top_partitions.append(row)
    return out


def resolve_partition(folder: Path, prefix: str) -> str:
    """A whole partition from a prefix of it (as printed); ValueError if none or several match."""
    entries = open_entries(folder)
    try:
        known = {row.entry.partition for row in rows(entries) if row.entry is not None}
    finally:
        entries.close()
    known |= set(_index_rows(folder))
    matches = sorted(p for p in known if p.startswith(prefix.lower()))
    if len(matches) != 1:
        raise ValueError(f"partition {prefix!r} matches {len(matches)} partitions; give more of it")
    return matches[0]


def clear(
    folder: Path, partition: str | None = None, older_than_s: float | None = None, now: float | None = None
) -> int:
    """Remove every entry, or a partition's, or those created more than ``older_than_s`` ago (and, on the
    way, expired entries and those that do not decode); the partitions' vector files follow. Returns the
    entries removed."""
    now = time.time() if now is None else now
    entries = open_entries(folder)
    removed = 0
    touched: set[str] = set()
    try:
        if partition is None and older_than_s is None:
            removed = entries.clear()
            for path in _index_files(folder):
                with contextlib.suppress(OSError):
                    path.unlink()
            return removed
        removed = entries.expire()  # expired entries are culled on the way (diskcache's delete skips them)
        for row in list(rows(entries)):
            entry = row.entry
            if row.expired:
                continue
            doomed = entry is None or (
                (partition is None or entry.partition == partition)
                and (older_than_s is None or entry.created_s < now - older_than_s)
            )
            if doomed and entries.delete(row.exact):
                removed += 1
                if entry is not None:
                    touched.add(entry.partition)
        live = {row.entry.partition for row in rows(entries) if row.entry is not None}
    finally:
        entries.close()
    _drop_index_rows(folder, touched, live)
    return removed


def _drop_index_rows(folder: Path, touched: set[str], live: set[str]) -> None:
    """A partition left with no entry loses its files; one that kept some is compacted."""
    index = folder / "index"
    for partition in touched:
        if partition not in live:
            for suffix in (".vec", ".ids", ".ivf", ".ivf.lock"):
                with contextlib.suppress(OSError):
                    (index / f"{partition}{suffix}").unlink()
            continue
        ids, vec = index / f"{partition}.ids", index / f"{partition}.vec"
        with contextlib.suppress(OSError):
            num_rows = ids.stat().st_size // _ID_BYTES
            dim = vec.stat().st_size // 4 // num_rows if num_rows else 0
            if dim:
                store = CacheStore(folder, dim, None)
                try:
                    store.compact(partition)
                finally:
                    store.close()


@dataclass(frozen=True, slots=True)
class Shown:
    exact: str
    partition: str
    scope: str
    query: str
    answer: str
    age_s: float
    ttl_left_s: float


def inspect(
    folder: Path,
    partition: str | None = None,
    grep: str = "",
    limit: int = 20,
    now: float | None = None,
) -> list[Shown]:
    """Entries of a partition, or whose question or answer contains ``grep`` (case-insensitive), newest
    first, at most ``limit``."""
    now = time.time() if now is None else now
    needle = grep.casefold()
    found = []
    entries = open_entries(folder)
    try:
        for row in rows(entries):
            if row.entry is None:
                continue
            e = row.entry
            if partition is not None and e.partition != partition:
                continue
            if needle and needle not in e.query.casefold() and needle not in e.text.casefold():
                continue
            found.append(
                Shown(row.exact, e.partition, e.scope, e.query, e.text, now - e.created_s, e.expires_s - now)
            )
    finally:
        entries.close()
    found.sort(key=lambda s: s.age_s)
    return found[:limit]
