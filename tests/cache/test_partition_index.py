"""Which partitions have an IVF index and keeping each built, current and on disk
(cache/partition_index.py), over real vector files in a temporary folder: none below ``min_rows``; built in
the background while lookups scan all rows; saved and read by another process instead of rebuilt; never
built while another process holds the build lock, nor saved for a vector file replaced meanwhile; rebuilt
from a corrupt file; bounded in memory; and a broken lookup is a full scan, never an error."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cache import ivf
from cache.partition_index import PartitionIndexes, memory_bytes

DIM = 16
MIN_ROWS = 200


def vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 12, n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def vec_file(folder: Path, partition: str, matrix: np.ndarray) -> tuple[int, int]:
    """Write the partition's vector file (replacing any, as compaction does); its identity."""
    tmp = folder / f"{partition}.vec.tmp"
    matrix.astype(np.float32).tofile(tmp)
    os.replace(tmp, folder / f"{partition}.vec")
    stat = (folder / f"{partition}.vec").stat()
    return stat.st_dev, stat.st_ino


def idle(timeout_s: float = 20.0) -> None:
    """Wait for this module's background builds and saves (threads named ivf-<partition>) to end."""
    deadline = time.monotonic() + timeout_s
    while any(t.name.startswith("ivf-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a build never ended"
        time.sleep(0.01)


def ready(indexes: PartitionIndexes, partition: str, matrix, identity, timeout_s: float = 20.0) -> np.ndarray:
    """Look up until the index answers (a lookup never waits for a build: it scans meanwhile), then until
    the build's thread has ended: it answers before it is done, and while it runs a lookup of a forgotten
    index neither reads its file nor starts another build."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = indexes.candidates(partition, matrix, identity, matrix[0])
        if found is not None:
            idle(max(deadline - time.monotonic(), 0.0))
            return found
        time.sleep(0.01)
    raise AssertionError("the index was never ready")


@pytest.fixture
def partition(tmp_path: Path) -> tuple[np.ndarray, tuple[int, int]]:
    matrix = vectors(400)
    return matrix, vec_file(tmp_path, "p", matrix)


def test_a_partition_below_min_rows_is_scanned_whole_and_gets_no_index(tmp_path: Path):
    matrix = vectors(MIN_ROWS - 1)
    identity = vec_file(tmp_path, "small", matrix)
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    assert indexes.candidates("small", matrix, identity, matrix[0]) is None
    idle()
    assert indexes.builds == 0 and indexes.loaded == 0 and not indexes.path("small").exists()


def test_the_first_lookup_starts_a_build_and_scans_meanwhile_then_the_index_answers(
    tmp_path: Path, partition
):
    matrix, identity = partition
    saved: list[tuple[str, int]] = []
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS, on_saved=lambda p, n: saved.append((p, n)))
    assert indexes.candidates("p", matrix, identity, matrix[0]) is None  # never waits for the build
    found = ready(indexes, "p", matrix, identity)
    idle()  # the builder tells on_saved just after it installs the index
    assert indexes.builds == 1 and indexes.loads == 0 and indexes.loaded == 1
    path = indexes.path("p")
    assert path == tmp_path / "p.ivf" and path.is_file() and saved == [("p", path.stat().st_size)]
    # The rows to score: ascending, a share of the partition, the query's own row among them.
    assert found.tolist() == sorted(found.tolist()) and 0 in found and len(found) < len(matrix)
    for row in (7, 123, 399):
        assert row in indexes.candidates("p", matrix, identity, matrix[row])
    index = indexes.get("p")
    assert index.rows == 400 and index.identity == identity
    assert indexes.memory_bytes == memory_bytes(index) > 0


def test_another_process_reads_the_saved_index_instead_of_building_it(tmp_path: Path, partition):
    matrix, identity = partition
    ready(PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS), "p", matrix, identity)
    other = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    found = other.candidates("p", matrix, identity, matrix[5])
    assert found is not None and 5 in found  # at once: read from disk
    assert other.loads == 1 and other.builds == 0


def test_rows_appended_after_the_build_are_labelled_at_the_next_lookup(tmp_path: Path, partition):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    ready(indexes, "p", matrix, identity)
    grown = np.concatenate([matrix, vectors(3, seed=9)])
    with open(tmp_path / "p.vec", "ab") as f:  # appended in place: the same file, the same identity
        f.write(grown[400:].tobytes())
    for row in (400, 401, 402):
        assert row in indexes.candidates("p", grown, identity, grown[row])
    assert indexes.get("p").rows == 403 and indexes.builds == 1


def test_an_index_of_a_replaced_vector_file_is_dropped_and_rebuilt_for_the_new_one(tmp_path: Path, partition):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    ready(indexes, "p", matrix, identity)  # and the first build's thread ended: a build of the new file waits
    compacted = matrix[::-1].copy()  # rows renumbered
    new_identity = vec_file(tmp_path, "p", compacted)
    assert new_identity != identity
    assert indexes.candidates("p", compacted, new_identity, compacted[0]) is None  # the old one is not used
    idle()  # the build of the new file; retried no sooner than RETRY_S: wait for this one to end
    found = indexes.candidates("p", compacted, new_identity, compacted[0])
    assert found is not None and 0 in found and indexes.get("p").identity == new_identity


def test_a_build_of_a_file_replaced_meanwhile_is_dropped_not_saved(tmp_path: Path, partition):
    matrix, _ = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    gone = (0, 0)  # the identity of a vector file no longer there
    assert indexes.candidates("p", matrix, gone, matrix[0]) is None
    idle()
    assert indexes.builds == 0 and indexes.get("p") is None and not indexes.path("p").exists()


def test_no_build_while_another_process_holds_the_lock_and_its_file_is_read_when_it_appears(
    tmp_path: Path, partition
):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    with open(tmp_path / "p.ivf.lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other process's build
        assert indexes.candidates("p", matrix, identity, matrix[0]) is None
        idle()
        assert indexes.builds == 0 and not indexes.path("p").exists()
        ivf.IvfIndex.build(matrix, identity).save(indexes.path("p"))  # it finishes and saves
        fcntl.flock(lock, fcntl.LOCK_UN)
    found = indexes.candidates("p", matrix, identity, matrix[0])
    assert found is not None and 0 in found and indexes.loads == 1 and indexes.builds == 0


def test_a_corrupt_index_file_is_rebuilt_never_an_error(tmp_path: Path, partition):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    indexes.path("p").write_bytes(b"not an index at all")
    found = ready(indexes, "p", matrix, identity)
    assert 0 in found and indexes.builds == 1 and indexes.loads == 0
    assert ivf.IvfIndex.load(indexes.path("p"), identity, 400, DIM) is not None  # replaced by a good one


def test_a_broken_lookup_is_a_full_scan_and_a_warning(tmp_path: Path, partition, caplog):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    ready(indexes, "p", matrix, identity)
    with caplog.at_level(logging.WARNING, logger="nearshore.cache"):
        assert indexes.candidates("p", matrix, identity, np.ones(DIM // 2, np.float32)) is None  # wrong dim
    assert any("scanning all rows" in r.getMessage() for r in caplog.records)
    assert indexes.get("p") is None  # dropped; its file is read again at a later lookup
    assert indexes.path("p").exists()


def test_indexes_in_memory_stay_within_max_memory_bytes_least_recently_used_out(tmp_path: Path):
    a, b = vectors(300, seed=1), vectors(300, seed=2)
    ids = {"a": vec_file(tmp_path, "a", a), "b": vec_file(tmp_path, "b", b)}
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS, max_memory_bytes=1)  # one at most
    ready(indexes, "a", a, ids["a"])
    ready(indexes, "b", b, ids["b"])
    assert indexes.loaded == 1 and indexes.get("b") is not None and indexes.get("a") is None
    assert indexes.path("a").exists()  # its file stays ...
    found = indexes.candidates("a", a, ids["a"], a[3])  # ... and is read again when it is next wanted
    assert found is not None and 3 in found and indexes.loads == 1 and indexes.builds == 2
    assert indexes.loaded == 1 and indexes.get("a") is not None


def test_forget_and_clear_let_go_of_what_is_in_memory(tmp_path: Path, partition):
    matrix, identity = partition
    indexes = PartitionIndexes(tmp_path, DIM, min_rows=MIN_ROWS)
    ready(indexes, "p", matrix, identity)
    indexes.forget("p")
    assert indexes.get("p") is None and indexes.loaded == 0 and indexes.memory_bytes == 0
    assert indexes.candidates("p", matrix, identity, matrix[0]) is not None  # read from its file
    indexes.close()
    assert indexes.loaded == 0 and indexes.path("p").exists()
