"""The IVF index of large partitions (cache/ivf.py, cache/partition_index.py) behind the store's
``nearest``: built in the background past a size, the same nearest rows as a full scan, rows appended
later found, persisted beside the vector files and read by another store instead of rebuilt, rebuilt when
missing, corrupt or built on a vector file since replaced; small partitions have none."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from cache import ivf
from cache.store import CacheStore

DIM = 32
MIN_ROWS = 2000


def clustered(n: int, seed: int = 0, centres: int = 60) -> np.ndarray:
    """Unit vectors around a few dozen centres, as questions on a few dozen topics are."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((centres, DIM)).astype(np.float32)
    x = base[rng.integers(0, centres, n)] + 0.35 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(store: CacheStore, partition: str, vectors: np.ndarray, first: int = 0) -> None:
    for i, v in enumerate(vectors, first):
        store._append(partition, f"{i:032x}", v)


def built(store: CacheStore, partition: str, timeout_s: float = 60.0) -> ivf.IvfIndex:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        store.nearest(partition, np.ones(DIM, np.float32) / np.sqrt(DIM), 1, -1.0)
        index = store.indexes.get(partition)
        if index is not None:
            return index
        time.sleep(0.05)
    raise AssertionError("the index was never built")


def near(vectors: np.ndarray, rows: list[int], seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q = vectors[rows] + 0.02 * rng.standard_normal((len(rows), DIM)).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


@pytest.fixture
def big(tmp_path: Path) -> tuple[CacheStore, np.ndarray]:
    store = CacheStore(tmp_path, DIM, 1 << 24, index_min_rows=MIN_ROWS)
    vectors = clustered(3000)
    fill(store, "big", vectors)
    yield store, vectors
    store.close()


def test_a_large_partition_gets_an_index_that_finds_what_a_full_scan_finds(big):
    store, vectors = big
    assert store.indexes.get("big") is None  # not before a lookup asks for it
    index = built(store, "big")
    assert index.rows == 3000 and (store.index_dir / "big.ivf").is_file() and store.indexes.builds == 1
    rows = list(range(0, 3000, 37))
    for row, q in zip(rows, near(vectors, rows), strict=True):
        found = store.nearest("big", q, k=1, min_score=0.5)
        assert found and found[0][1] == f"{row:032x}"
        # Only the query's cells were scored, a small share of the partition.
        assert len(index.candidates(q)) < 3000 // 2
    fresh = clustered(5, seed=7)  # rows appended after the build are labelled at the next lookup
    fill(store, "big", fresh, first=3000)
    for i, q in enumerate(fresh):
        assert store.nearest("big", q, k=1, min_score=0.99)[0][1] == f"{3000 + i:032x}"
    assert store.indexes.get("big").rows == 3005


def test_another_store_reads_the_saved_index_instead_of_building_it(big, tmp_path: Path):
    store, vectors = big
    built(store, "big")
    other = CacheStore(tmp_path, DIM, None, index_min_rows=MIN_ROWS)
    try:
        q = near(vectors, [42])[0]
        assert other.nearest("big", q, k=1, min_score=0.5)[0][1] == f"{42:032x}"
        assert other.indexes.loads == 1 and other.indexes.builds == 0
    finally:
        other.close()


def test_a_missing_corrupt_or_mismatched_index_file_is_rebuilt_never_an_error(big, tmp_path: Path):
    store, vectors = big
    built(store, "big")
    path = store.index_dir / "big.ivf"
    q = near(vectors, [7])[0]
    for damage in ("corrupt", "replaced vectors", "missing"):
        if damage == "corrupt":
            path.write_bytes(b"PK\x03\x04 not an index")
        elif damage == "replaced vectors":  # the same rows in a new file, as compaction leaves them
            vec = store.index_dir / "big.vec"
            tmp = vec.with_suffix(".copy")
            tmp.write_bytes(vec.read_bytes())
            os.replace(tmp, vec)
        else:
            path.unlink()
        other = CacheStore(tmp_path, DIM, None, index_min_rows=MIN_ROWS)
        try:
            assert other.nearest("big", q, k=1, min_score=0.5)[0][1] == f"{7:032x}"  # a full scan meanwhile
            rebuilt = built(other, "big")
            # Loaded instead of built (seen once on three workers): what it loaded says why.
            assert other.indexes.builds == 1 and rebuilt.rows == 3000, (
                damage,
                other.indexes.loads,
                rebuilt.identity,
            )
            assert ivf.IvfIndex.load(path, rebuilt.identity, 3000, DIM) is not None
        finally:
            other.close()


def test_small_partitions_are_scanned_whole_and_get_no_index(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 24, index_min_rows=MIN_ROWS)
    vectors = clustered(MIN_ROWS - 1)
    fill(store, "small", vectors)
    assert store.nearest("small", vectors[5], k=1, min_score=0.99)[0][1] == f"{5:032x}"
    time.sleep(0.2)
    assert store.indexes.get("small") is None and not (store.index_dir / "small.ivf").exists()
    store.close()


def test_the_index_alone_ranks_near_duplicates_as_a_full_scan_does():
    vectors = clustered(20_000, seed=3, centres=200)
    index = ivf.IvfIndex.build(vectors, (0, 0))
    assert len(index.centroids) == ivf.num_cells(20_000) and index.rows == 20_000
    agree = 0
    queries = near(vectors, list(range(0, 20_000, 97)), seed=5)
    for q in queries:
        candidates = index.candidates(q)
        agree += int(candidates[np.argmax(vectors[candidates] @ q)]) == int(np.argmax(vectors @ q))
    assert agree / len(queries) >= 0.99


def test_put_many_stores_a_batch_and_an_exact_key_keeps_its_first_answer(tmp_path: Path):
    from cache.store import Entry

    def answer(i: int, text: str, partition: str = "p") -> tuple[str, Entry]:
        now = time.time()
        return f"{i:032x}", Entry(
            partition=partition, query=f"q{i}", kind="chat", text=text, finish_reason="stop",
            completion_tokens=1, model="m", created_s=now, expires_s=now + 60,
        )  # fmt: skip

    store = CacheStore(tmp_path, DIM, 1 << 24)
    vectors = clustered(4)
    assert store.put_many([answer(0, "first"), answer(1, "one")], vectors[:2]) == 2
    assert store.put_many([answer(0, "second"), answer(2, "two")], vectors[2:]) == 1
    assert store.get(f"{0:032x}").text == "first" and store.vectors("p").ids == [
        f"{i:032x}" for i in (0, 1, 2)
    ]
    assert store.nearest("p", vectors[3], k=1, min_score=0.99)[0][1] == f"{2:032x}"
    with pytest.raises(ValueError, match="one partition"):
        store.put_many([answer(5, "x"), answer(6, "y", partition="other")], vectors[:2])
    store.close()


def test_a_build_whose_vector_file_was_replaced_meanwhile_is_not_saved(big):
    store, _ = big
    loaded = store.vectors("big")
    store.indexes._build("big", loaded, (0, 0))  # built on a file that is no longer there
    assert store.indexes.builds == 0 and store.indexes.get("big") is None
    assert not store.indexes.path("big").exists()
