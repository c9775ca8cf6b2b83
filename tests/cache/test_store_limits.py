"""What the store holds is bounded whatever the number of partitions: open files (small partitions read into
memory, large ones mapped, at most ``max_maps`` maps), read memory, IVF indexes in memory; the folder's
entries and index files stay within the size limit and the partitions with files within ``max_partitions``
(the least recently used lose theirs, their entries still hit exactly); a vector file truncated under a
running process is a miss and a warning, never a SIGBUS; a writer puts files out of step back in step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from cache.store import CacheStore, Entry, StoreLimits

DIM = 8
ROW_BYTES = 4 * DIM + 16  # one row in the .vec and .ids files
REPO = Path(__file__).resolve().parents[2]


def entry(partition: str, query: str = "q") -> Entry:
    now = time.time()
    return Entry(
        partition=partition, query=query, kind="chat", text="a", finish_reason="stop",
        completion_tokens=1, model="m", created_s=now, expires_s=now + 600,
    )  # fmt: skip


def unit_rows(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(store: CacheStore, partition: str, vectors: np.ndarray) -> list[str]:
    keys = [f"{abs(hash(partition)) % 10**12:012d}{i:020x}" for i in range(len(vectors))]
    store.put_many([(k, entry(partition, f"q{i}")) for i, k in enumerate(keys)], vectors)
    return keys


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_files_stay_bounded_whatever_the_number_of_partitions(tmp_path: Path):
    limits = StoreLimits(read_max_bytes=64 * 4 * DIM, read_cache_bytes=16 * 1024, max_maps=4, map_idle_s=0.2)
    store = CacheStore(tmp_path, DIM, 1 << 30, limits=limits)
    tiny = {f"t{p:03d}": unit_rows(3, seed=p) for p in range(300)}  # read: 3 rows each
    large = {f"L{p:02d}": unit_rows(200, seed=1000 + p) for p in range(12)}  # mapped: 200 rows each
    keys = {p: fill(store, p, v) for p, v in (tiny | large).items()}
    before = open_fds()
    for _ in range(2):
        for p, v in (tiny | large).items():
            found = store.nearest(p, v[1], k=1, min_score=0.99)
            assert found and found[0][1] == keys[p][1], p  # still right after being dropped and reloaded
            assert store.open_maps <= 4 and store.read_bytes <= 16 * 1024
    assert open_fds() - before <= 4  # the maps only: a read partition keeps no file open
    assert store.open_maps == 4
    time.sleep(0.25)
    store.maintain()  # idle maps closed (the store's own thread does it too)
    assert store.open_maps == 0 and open_fds() - before <= 0
    store.close()


def test_ivf_indexes_in_memory_are_bounded_and_read_again_from_their_files(tmp_path: Path):
    limits = StoreLimits(index_memory_bytes=1)  # one index at a time, however large
    store = CacheStore(tmp_path, DIM, 1 << 30, index_min_rows=300, limits=limits)
    parts = {f"big{p}": unit_rows(400, seed=p) for p in range(3)}
    keys = {p: fill(store, p, v) for p, v in parts.items()}
    for p, v in parts.items():  # each built once, in the background
        deadline = time.monotonic() + 30
        while store.indexes.get(p) is None and time.monotonic() < deadline:
            store.nearest(p, v[0], 1, -1.0)
            time.sleep(0.02)
        assert store.indexes.loaded == 1
    assert store.indexes.builds == 3
    for _ in range(2):
        for p, v in parts.items():
            assert store.nearest(p, v[7], k=1, min_score=0.99)[0][1] == keys[p][7]
            assert store.indexes.get(p) is not None and store.indexes.loaded == 1
    assert store.indexes.builds == 3 and store.indexes.loads >= 5  # read again, never rebuilt
    store.close()


def folder_bytes(store: CacheStore) -> int:
    index = sum(p.stat().st_size for p in store.index_dir.iterdir())
    return store.entries.volume() + index


def test_entries_and_index_files_stay_within_the_size_limit_least_recently_used_out(tmp_path: Path):
    dim = 256
    limit = 1 << 20
    store = CacheStore(tmp_path, dim, limit, limits=StoreLimits(recount_s=3600))
    hot = unit_rows(10, seed=99, dim=dim)
    hot_keys = fill(store, "hot", hot)
    for p in range(100):  # 100 x 10 KB of rows beside ~300 KB of entries: past the limit
        keys = fill(store, f"p{p:02d}", unit_rows(10, seed=p, dim=dim))
        assert store.nearest("hot", hot[3], 1, 0.99)[0][1] == hot_keys[3]  # the hot one is used
        if p == 0:
            cold_key = keys[0]
    store.maintain()
    assert store.index_bytes <= limit - store.entries.volume()
    assert folder_bytes(store) <= limit
    assert store.evicted_partitions > 0 and not (store.index_dir / "p00.vec").exists()
    assert store.nearest("p00", unit_rows(10, seed=0, dim=dim)[0], 1, 0.5) == []  # no semantic rows...
    assert store.get(cold_key) is not None  # ...and its entry still hits exactly
    assert store.nearest("hot", hot[3], 1, 0.99)[0][1] == hot_keys[3]  # the recently used kept theirs
    # Counted as written, not by scanning the folder; the recount agrees.
    counted = store.index_bytes
    store.maintain(recount=True)
    assert store.index_bytes == counted == sum(p.stat().st_size for p in store.index_dir.iterdir())
    store.close()


def test_partitions_with_index_files_are_bounded_in_number(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 30, limits=StoreLimits(max_partitions=20))
    for p in range(100):
        store.put(f"{p:032x}", entry(f"s{p:03d}"), unit_rows(1, seed=p)[0])  # a new partition per request
        store.nearest("s000", unit_rows(1, seed=0)[0], 1, 0.99)  # one kept in use
    store.maintain()
    assert store.partitions <= 20 and len(list(store.index_dir.iterdir())) <= 2 * 20
    assert store.nearest("s000", unit_rows(1, seed=0)[0], 1, 0.99)[0][1] == f"{0:032x}"
    assert all(store.get(f"{p:032x}") is not None for p in range(100))  # every entry still hits exactly
    store.close()


def test_another_process_s_files_are_counted_at_the_recount_and_removed_files_are_misses(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 30)
    other = CacheStore(tmp_path, DIM, 1 << 30)
    fill(store, "mine", unit_rows(5))
    theirs = fill(other, "theirs", unit_rows(5, seed=1))
    assert store.partitions == 1 and store.index_bytes == 5 * ROW_BYTES
    store.maintain(recount=True)
    assert store.partitions == 2 and store.index_bytes == 10 * ROW_BYTES
    assert other.nearest("theirs", unit_rows(5, seed=1)[2], 1, 0.99)[0][1] == theirs[2]  # mapped or read
    assert store._remove_files("theirs")  # as the size limit would
    assert other.nearest("theirs", unit_rows(5, seed=1)[2], 1, 0.0) == []
    other.put("ef" * 16, entry("theirs"), unit_rows(1, seed=2)[0])  # a new answer starts it again
    assert len(other.vectors("theirs").ids) == 1
    store.close()
    other.close()


def test_a_writer_waiting_for_the_lock_while_the_files_are_removed_appends_to_new_files(tmp_path: Path):
    import fcntl

    store = CacheStore(tmp_path, DIM, 1 << 30)
    fill(store, "p", unit_rows(3))
    vec, ids = store._paths("p")
    writer = threading.Thread(target=store._append, args=("p", "ab" * 16, unit_rows(1, seed=5)[0]))
    with open(ids, "ab") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # as a remover holds it
        writer.start()
        time.sleep(0.1)
        vec.unlink()
        ids.unlink()
    writer.join(5)
    loaded = store.vectors("p")
    assert loaded.ids == ["ab" * 16]
    assert store.nearest("p", unit_rows(1, seed=5)[0], 1, 0.99)[0][1] == "ab" * 16
    store.close()


def test_a_writer_puts_files_out_of_step_back_in_step(tmp_path: Path):
    store = CacheStore(tmp_path, DIM, 1 << 30)
    keys = fill(store, "p", unit_rows(2))
    vec, _ = store._paths("p")
    with open(vec, "ab") as f:  # a crash after a vector was written, before its id; then a torn row
        f.write(unit_rows(1, seed=7).tobytes() + b"\x01\x02\x03")
    assert store.vectors("p").ids == keys  # read as before: the tail is cut
    fresh = unit_rows(1, seed=8)[0]
    store.put("cd" * 16, entry("p"), fresh)
    assert store.nearest("p", fresh, 1, 0.99)[0][1] == "cd" * 16  # its own vector, not a neighbour's
    assert store.nearest("p", unit_rows(1, seed=7)[0], 1, 0.99) == []  # the orphan has no entry
    assert store.vectors("p").rows == 5
    store.close()


_TRUNCATION = r"""
import json, logging, os, sys
from pathlib import Path
import numpy as np
from cache.store import CacheStore, Entry, StoreLimits

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("nearshore.cache").addHandler(Keep(level=logging.WARNING))

DIM = 8
def rows(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
def entry(p):
    return Entry(partition=p, query="q", kind="chat", text="a", finish_reason="stop", completion_tokens=1,
                 model="m", created_s=0, expires_s=4e9)

store = CacheStore(Path(sys.argv[1]), DIM, 1 << 30, limits=StoreLimits(read_max_bytes=4096))
out = {}
for name, n in (("read", 10), ("mapped", 4000)):
    v = rows(n, 1)
    store.put_many([(f"{n:04x}{i:028x}", entry(name)) for i in range(n)], v)
    before = store.nearest(name, v[3], 1, 0.99)
    loaded = store.vectors(name)
    vec = store._paths(name)[0]
    os.truncate(vec, (n // 2) * 4 * DIM + 5)  # in place, under the running process
    out[name] = {
        "mapped": loaded.mapped is not None,
        "found_before": before[0][1] == f"{n:04x}{3:028x}",
        "intact_after": loaded.intact(),
        "after": store.nearest(name, v[3], 1, 0.0),
        "again": store.nearest(name, v[3], 1, 0.0),
    }
    try:
        loaded[n - 10 : n]  # what an IVF build reads: checked, not a SIGBUS
        out[name]["guarded"] = False
    except OSError:
        out[name]["guarded"] = True
    fresh = rows(1, 2)[0]
    store.put(f"{n:04x}" + "e" * 28, entry(name), fresh)  # a later append works again
    out[name]["appended"] = store.nearest(name, fresh, 1, 0.99)[0][1] == f"{n:04x}" + "e" * 28
    out[name]["rows"] = store.vectors(name).rows
out["warnings"] = warnings
print(json.dumps(out))
"""


def test_a_vector_file_truncated_under_a_running_process_is_a_miss_and_a_warning(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATION, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, f"died with {done.returncode}: {done.stderr[-2000:]}"  # -7: SIGBUS
    out = json.loads(done.stdout)
    for name, n in (("read", 10), ("mapped", 4000)):
        got = out[name]
        assert got["mapped"] == (name == "mapped") and got["found_before"]
        assert got["after"] == [] and got["again"] == []
        assert got["intact_after"] == (name == "read") and got["guarded"] == (name == "mapped")
        assert got["appended"] and got["rows"] == n // 2 + 2  # the whole rows left, a padded one, the new one
    assert any("damaged" in w and "read" in w for w in out["warnings"])
    assert any("damaged" in w and "mapped" in w for w in out["warnings"])
