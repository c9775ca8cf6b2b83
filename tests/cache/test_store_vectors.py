"""The semantic level's files (cache/store_vectors.py), on real files in a temporary folder: rows appended
and read back (in memory or mapped), another process's rows seen on the next read, the bounds on what one
process holds, and damage (torn tails, lost vectors, shrunk files) read as a miss and put back in step by
the next writer, never an error."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from cache.store_vectors import ID_BYTES, TOMBSTONE, TOMBSTONE_HEX, VectorFiles, Vectors

DIM = 8
ROW_BYTES = 4 * DIM


def files(folder: Path, read_max_bytes: int = 1 << 20, read_cache_bytes: int = 1 << 20, **kw) -> VectorFiles:
    return VectorFiles(
        folder,
        DIM,
        read_max_bytes=read_max_bytes,
        read_cache_bytes=read_cache_bytes,
        max_maps=kw.get("max_maps", 4),
        map_idle_s=kw.get("map_idle_s", 60.0),
    )


def key(i: int) -> str:
    return f"{i:032x}"


def rows(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_rows_appended_are_read_back_with_their_ids(tmp_path: Path):
    vf = files(tmp_path)
    matrix = rows(3)
    written = vf.append("p", [key(0), key(1), key(2)], matrix)
    assert written == vf.bytes_of(3) == 3 * (ROW_BYTES + ID_BYTES)
    vec_path, ids_path = vf.paths("p")
    assert vec_path.stat().st_size == 3 * ROW_BYTES and ids_path.stat().st_size == 3 * ID_BYTES
    loaded = vf.vectors("p")
    assert loaded is not None and loaded.rows == len(loaded) == 3 and loaded.mapped is None
    assert loaded.ids == [key(0), key(1), key(2)] and loaded.id_at(1) == key(1)
    np.testing.assert_array_equal(loaded.matrix, matrix)
    np.testing.assert_array_equal(loaded[[2, 0]], matrix[[2, 0]])
    assert loaded.intact() and loaded.memory_bytes == 3 * (ROW_BYTES + ID_BYTES)
    assert loaded.identity == (vec_path.stat().st_dev, vec_path.stat().st_ino)
    assert vf.vectors("p") is loaded  # unchanged files: the same load, not read again
    assert vf.read_bytes == loaded.memory_bytes


def test_a_partition_with_no_files_or_no_folder_is_none_not_an_error(tmp_path: Path):
    assert files(tmp_path).vectors("nothing") is None
    assert files(tmp_path / "gone").vectors("p") is None


def test_rows_another_process_appended_are_seen_on_the_next_read(tmp_path: Path):
    mine, theirs = files(tmp_path), files(tmp_path)
    mine.append("p", [key(0)], rows(1))
    assert mine.vectors("p").rows == 1
    theirs.append("p", [key(1), key(2)], rows(2, seed=1))
    loaded = mine.vectors("p")
    assert loaded.rows == 3 and loaded.ids == [key(0), key(1), key(2)]


def test_a_large_partition_is_mapped_and_its_new_ids_read_as_it_grows(tmp_path: Path):
    vf = files(tmp_path, read_max_bytes=2 * ROW_BYTES)
    matrix = rows(6)
    vf.append("p", [key(i) for i in range(4)], matrix[:4])
    first = vf.vectors("p")
    assert first.mapped is not None and first.rows == 4 and vf.open_maps == 1
    assert first.memory_bytes == 4 * ID_BYTES  # the rows are in the shared page cache, not this process
    assert vf.read_bytes == 0
    vf.append("p", [key(4), key(5)], matrix[4:])
    grown = vf.vectors("p")
    assert grown.rows == 6 and grown.ids == [key(i) for i in range(6)]
    np.testing.assert_array_equal(grown[:], matrix)
    assert isinstance(grown[:], np.ndarray) and not np.shares_memory(grown[:], grown.matrix)  # a checked copy
    vf.forget_all()
    # Closed, or (a reader still holds its rows) closed when the last reader lets go of it.
    del first, grown
    gc.collect()
    assert vf.open_maps == 0


def test_at_most_max_maps_are_held_and_idle_ones_are_closed(tmp_path: Path):
    vf = files(tmp_path, read_max_bytes=0, max_maps=2, map_idle_s=30.0)
    for p in ("a", "b", "c"):
        vf.append(p, [key(0)], rows(1))
        assert vf.vectors(p) is not None
    assert vf.open_maps == 2  # "a", least recently used, was closed
    assert vf.vectors("a").rows == 1  # and is mapped again when asked for
    assert vf.open_maps == 2
    vf.close_idle(now=1e12)
    assert vf.open_maps == 0


def test_read_partitions_stay_within_read_cache_bytes(tmp_path: Path):
    one = ROW_BYTES + ID_BYTES
    vf = files(tmp_path, read_cache_bytes=2 * one)
    for p in ("a", "b", "c"):
        vf.append(p, [key(0)], rows(1))
        vf.vectors(p)
    assert vf.read_bytes == 2 * one
    again = vf.vectors("a")  # read again from its files
    assert again is not None and again.rows == 1 and vf.read_bytes == 2 * one


def test_a_bad_shape_is_refused_before_anything_is_written(tmp_path: Path):
    vf = files(tmp_path)
    vf.append("p", [key(0)], rows(1))
    with pytest.raises(ValueError):
        vf.append("p", [key(1)], rows(2))  # two rows for one key
    vec_path, ids_path = vf.paths("p")
    assert vec_path.stat().st_size == ROW_BYTES and ids_path.stat().st_size == ID_BYTES
    assert vf.vectors("p").ids == [key(0)]


def test_a_torn_tail_is_not_read_and_the_next_writer_pads_it_to_a_tombstoned_row(tmp_path: Path):
    vf = files(tmp_path)
    matrix = rows(2)
    vf.append("p", [key(0)], matrix[:1])
    vec_path, ids_path = vf.paths("p")
    with open(vec_path, "ab") as f:  # a crash mid-append: half a vector, no id
        f.write(b"\x01" * (ROW_BYTES // 2))
    assert vf.vectors("p").ids == [key(0)]
    added = vf.append("p", [key(1)], matrix[1:])
    assert added == (ROW_BYTES // 2 + ID_BYTES) + ROW_BYTES + ID_BYTES  # the repair counted too
    loaded = vf.vectors("p")
    assert loaded.ids == [key(0), TOMBSTONE_HEX, key(1)]
    np.testing.assert_array_equal(loaded.matrix[2], matrix[1])
    assert vec_path.stat().st_size == 3 * ROW_BYTES and ids_path.stat().st_size == 3 * ID_BYTES


def test_a_vector_whose_id_was_never_written_gets_a_tombstone(tmp_path: Path):
    vf = files(tmp_path)
    vf.append("p", [key(0)], rows(1))
    with pytest.raises(ValueError):
        vf.append("p", ["not hex"], rows(1, seed=1))  # the vector is written, its id is not
    assert vf.vectors("p").ids == [key(0)]  # the orphan vector is not a row
    vf.append("p", [key(2)], rows(1, seed=2))
    assert vf.vectors("p").ids == [key(0), TOMBSTONE_HEX, key(2)]


def test_ids_past_the_vectors_are_a_miss_until_a_writer_cuts_them(tmp_path: Path, caplog):
    vf = files(tmp_path)
    vf.append("p", [key(0), key(1)], rows(2))
    vec_path, _ = vf.paths("p")
    os.truncate(vec_path, ROW_BYTES)  # the vector file lost a row
    with caplog.at_level(logging.WARNING, logger="nearshore.cache"):
        assert vf.vectors("p") is None
        assert vf.vectors("p") is None
    assert vf.damaged == 2
    assert len([r for r in caplog.records if "damaged" in r.getMessage()]) == 1  # one warning, not one a read
    vf.append("p", [key(2)], rows(1, seed=2))
    assert vf.vectors("p").ids == [key(0), key(2)]


def test_a_mapped_file_that_shrank_is_dropped_not_read(tmp_path: Path):
    vf = files(tmp_path, read_max_bytes=0)
    vf.append("p", [key(i) for i in range(4)], rows(4))
    mapped = vf.vectors("p")
    assert mapped.mapped is not None and mapped.intact()
    vec_path, _ = vf.paths("p")
    os.truncate(vec_path, ROW_BYTES)  # an operator or a failing disk: never this module
    assert not mapped.intact()
    with pytest.raises(OSError, match="shrank"):
        mapped[0:1]  # checked before it is read: no SIGBUS
    assert vf.vectors("p") is None and vf.damaged == 1
    del mapped


def test_a_read_partition_that_shrank_is_a_miss(tmp_path: Path):
    vf = files(tmp_path)
    vf.append("p", [key(0), key(1)], rows(2))
    assert vf.vectors("p").rows == 2
    vec_path, _ = vf.paths("p")
    os.truncate(vec_path, ROW_BYTES)
    assert vf.vectors("p") is None and vf.damaged == 1


def test_rewrite_keeps_only_the_rows_asked_for_and_removes_the_stale_index(tmp_path: Path):
    vf = files(tmp_path)
    matrix = rows(4)
    vf.append("p", [key(i) for i in range(4)], matrix)
    before = vf.vectors("p")
    stale = tmp_path / "p.ivf"
    stale.write_bytes(b"built on the old file")
    assert vf.rewrite("p", lambda exact: exact in {key(1), key(3)}, stale) == 2
    assert not stale.exists()
    loaded = vf.vectors("p")
    assert loaded.ids == [key(1), key(3)] and loaded.identity != before.identity  # a new file
    np.testing.assert_array_equal(loaded.matrix, matrix[[1, 3]])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.ids", "p.vec"]  # no temporary file left
    assert vf.rewrite("other", lambda exact: True, tmp_path / "other.ivf") is None


def test_remove_takes_the_files_and_those_beside_them_unless_a_writer_holds_the_lock(tmp_path: Path):
    vf = files(tmp_path)
    vf.append("p", [key(0)], rows(1))
    assert vf.vectors("p") is not None
    beside = tmp_path / "p.ivf"
    beside.write_bytes(b"x")
    _, ids_path = vf.paths("p")
    writer = os.open(ids_path, os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX)
        assert vf.remove("p", (beside,)) is False
        assert ids_path.exists() and beside.exists()
    finally:
        os.close(writer)
    assert vf.remove("p", (beside,)) is True
    assert list(tmp_path.iterdir()) == [] and vf.vectors("p") is None
    assert vf.remove("never", ()) is True  # nothing to remove is no failure


def test_a_read_waits_briefly_for_a_writer_then_serves_what_it_had(tmp_path: Path):
    vf = files(tmp_path)
    vf.append("p", [key(0)], rows(1))
    known = vf.vectors("p")
    other = files(tmp_path)
    other.append("p", [key(1)], rows(1, seed=1))
    _, ids_path = vf.paths("p")
    writer = os.open(ids_path, os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX)  # a compaction holding the lock for long
        assert vf.vectors("p") is known  # the last load, not a half-done rewrite
    finally:
        os.close(writer)
    assert vf.vectors("p").rows == 2


def test_the_tombstone_is_sixteen_ff_bytes():
    assert TOMBSTONE == b"\xff" * ID_BYTES and TOMBSTONE_HEX == "ff" * ID_BYTES


def test_an_in_memory_vectors_indexes_like_its_matrix():
    matrix = rows(3)
    v = Vectors((0, 0), 3 * ID_BYTES, bytes(3 * ID_BYTES), matrix)
    assert v.intact() and v[1].tolist() == matrix[1].tolist() and v.id_at(2) == "00" * ID_BYTES
