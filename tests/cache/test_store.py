"""The cache's storage: entries with TTL and one answer per key, partition indexes shared by processes,
and files that are damaged or missing are misses, never errors."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import numpy as np

from cache.store import CacheStore, Entry

DIM = 8


def entry(partition: str = "p1", query: str = "q", text: str = "a", ttl_s: float = 60.0) -> Entry:
    now = time.time()
    return Entry(
        partition=partition,
        query=query,
        kind="chat",
        text=text,
        finish_reason="stop",
        completion_tokens=3,
        model="m",
        created_s=now,
        expires_s=now + ttl_s,
    )


def unit(*xs: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def test_exact_entries_expire_and_the_first_writer_wins(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 20)
    assert store.put("aa" * 16, entry(text="first"), None)
    assert not store.put("aa" * 16, entry(text="second"), None)
    assert store.get("aa" * 16).text == "first"
    store.put("bb" * 16, entry(ttl_s=0.05), None)
    time.sleep(0.1)
    assert store.get("bb" * 16) is None


def test_nearest_stays_inside_its_partition_and_above_the_floor(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 20)
    store.put("01" * 16, entry("p1", "x"), unit(1, 0))
    store.put("02" * 16, entry("p1", "y"), unit(1, 1))
    store.put("03" * 16, entry("p2", "z"), unit(1, 0))
    found = store.nearest("p1", unit(1, 0.1), k=5, min_score=0.5)
    assert [exact for _, exact in found] == ["01" * 16, "02" * 16]
    assert store.nearest("p1", unit(0, 0, 1), k=5, min_score=0.5) == []
    assert store.nearest("nobody", unit(1, 0), k=5, min_score=0.0) == []


def _writer(folder: str, start: int) -> None:
    store = CacheStore(Path(folder), DIM, 1 << 20)
    for i in range(start, start + 50):
        store.put(f"{i:032x}", entry("shared", f"q{i}"), unit(1, i / 100))
    store.close()


def test_processes_sharing_the_folder_see_each_others_rows(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 20)
    assert store.vectors("shared") is None
    writers = [multiprocessing.Process(target=_writer, args=(str(tmp_path), s)) for s in (0, 100)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(30)
    loaded = store.vectors("shared")
    assert loaded is not None and len(loaded.ids) == 100 and len(set(loaded.ids)) == 100
    assert all(store.get(exact) is not None for exact in loaded.ids)


def test_damaged_files_are_misses_and_compaction_drops_dead_rows(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 20)
    for i in range(4):
        store.put(f"{i:032x}", entry("p", f"q{i}"), unit(1, i))
    vec, ids = store._paths("p")
    with open(vec, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn row, as a crash mid-append leaves it
    assert len(store.vectors("p").ids) == 4
    store.entries.set(f"{0:032x}", b"\xc1 not msgpack")
    assert store.get(f"{0:032x}") is None  # a corrupt entry is a miss, and dropped
    store.delete(f"{1:032x}")
    assert store.compact("p") == 2
    assert sorted(store.vectors("p").ids) == [f"{2:032x}", f"{3:032x}"]
    ids.unlink()
    assert store.nearest("p", unit(1, 0), k=3, min_score=0.0) == []


def _same_key_writer(folder: str, text: str, ready) -> None:
    store = CacheStore(Path(folder), DIM, 1 << 20)
    ready.wait()
    store.put("cc" * 16, entry("race", "q", text=text), unit(1, 2))
    store.close()


def test_concurrent_writers_of_one_entry_store_one_answer(tmp_path: Path):
    ready = multiprocessing.Event()
    writers = [
        multiprocessing.Process(target=_same_key_writer, args=(str(tmp_path), f"answer {i}", ready))
        for i in range(6)
    ]
    for w in writers:
        w.start()
    ready.set()
    for w in writers:
        w.join(30)
    store = CacheStore(tmp_path, DIM, 1 << 20)
    assert store.get("cc" * 16).text.startswith("answer ")
    loaded = store.vectors("race")
    assert loaded is not None and list(loaded.ids) == ["cc" * 16]  # one row: the losers wrote none
