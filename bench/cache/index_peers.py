"""``bench cache``'s index comparison: numpy brute force, this store's IVF, and hnswlib, usearch and faiss
where they are installed, on the same vectors and queries.

The queries are what a cache is asked: rows of the partition with a little noise (a paraphrase of a stored
question) and the labelled set's questions. Each method is timed per query on one thread (as the edge's
lookup thread runs it), after a build on two; recall is the share of near-duplicate queries (true nearest
at or above the shipped threshold) whose nearest it returns, the one number that decides a hit.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cache import ivf
from cache.response_cache import threshold_for
from cache.settings import CacheSettings
from harness.stats import percentile

NEAR_QUERIES = 300
BUILD_THREADS = 2
HNSW_M = 16
HNSW_EF_BUILD = 100
HNSW_EF_SEARCH = 64


def percentiles(times_ms: list[float], name: str) -> dict:
    return {
        f"{name}_p50_ms": round(percentile(times_ms, 50), 3),
        f"{name}_p99_ms": round(percentile(times_ms, 99), 3),
    }


def _queries(vectors: np.ndarray, corpus: Any) -> np.ndarray:
    rng = np.random.default_rng(11)
    rows = rng.integers(0, len(vectors), NEAR_QUERIES)
    near = np.asarray(vectors[np.sort(rows)]) + 0.02 * rng.standard_normal((NEAR_QUERIES, vectors.shape[1]))
    q = np.vstack([near.astype(np.float32), corpus.asked_vectors[:NEAR_QUERIES]])
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _file_bytes(save: Callable[[str], object]) -> int:
    with tempfile.TemporaryDirectory(prefix="nearshore-bench-index-") as folder:
        path = os.path.join(folder, "index")
        save(path)
        return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def _measure(
    name: str,
    build: Callable[[], Any],
    search: Callable[[Any, np.ndarray], int],
    queries: np.ndarray,
    truth: list[int],
    near: list[int],
    rows: int,
    size: Callable[[Any], int] | None,
) -> dict:
    started = time.perf_counter()
    index = build()
    build_s = time.perf_counter() - started
    times, found = [], []
    for q in queries:
        t = time.perf_counter()
        found.append(search(index, q))
        times.append((time.perf_counter() - t) * 1e3)
    recall = float(np.mean([found[i] == truth[i] for i in near])) if near else float("nan")
    return {
        "method": name,
        "build_s": round(build_s, 1),
        **percentiles(times, "search"),
        "recall_near": round(recall, 4),
        "index_bytes_per_row": round(size(index) / rows, 1) if size else 0.0,
    }


def compare_indexes(
    vectors: np.ndarray, corpus: Any, peers: list[str], deadline: float, log: Callable[[str], object]
) -> list[dict]:
    threshold = threshold_for(CacheSettings().target_false_hit_rate)
    matrix = np.asarray(vectors, dtype=np.float32)
    queries = _queries(matrix, corpus)
    scores = queries @ matrix.T if len(matrix) <= 200_000 else None
    truth, best = [], []
    for i, q in enumerate(queries):
        s = scores[i] if scores is not None else matrix @ q
        truth.append(int(np.argmax(s)))
        best.append(float(s[truth[-1]]))
    near = [i for i, b in enumerate(best) if b >= threshold]
    args = (queries, truth, near, len(matrix))
    results = [
        _measure("numpy brute force", lambda: matrix, lambda m, q: int(np.argmax(m @ q)), *args, None),
        _measure(
            "numpy IVF (the store's)",
            lambda: ivf.IvfIndex.build(matrix, (0, 0)),
            lambda ix, q: int((rows := ix.candidates(q))[np.argmax(np.take(matrix, rows, axis=0) @ q)]),
            *args,
            lambda ix: ix.labels.nbytes + ix.order.nbytes + ix.centroids.nbytes,
        ),
    ]
    log(f"  {peer_line(results[0])}\n  {peer_line(results[1])}")
    for peer in peers:
        if time.monotonic() > deadline:
            results.append({"method": peer, "skipped": "out of time"})
            continue
        try:
            for result in _peer(peer, matrix, args):
                results.append(result)
                log(f"  {peer_line(result)}")
        except ImportError as exc:
            results.append({"method": peer, "skipped": f"not installed ({exc.name})"})
            log(f"  {peer}: not installed")
    return results


def _peer(peer: str, matrix: np.ndarray, args: tuple) -> list[dict]:
    n, dim = matrix.shape
    if peer == "hnswlib":
        import hnswlib

        def build_hnswlib():
            ix = hnswlib.Index(space="ip", dim=dim)
            ix.init_index(max_elements=n, ef_construction=HNSW_EF_BUILD, M=HNSW_M)
            ix.set_num_threads(BUILD_THREADS)
            ix.add_items(matrix, np.arange(n))
            ix.set_num_threads(1)
            ix.set_ef(HNSW_EF_SEARCH)
            return ix

        return [
            _measure(
                f"hnswlib (M={HNSW_M})",
                build_hnswlib,
                lambda ix, q: int(ix.knn_query(q, k=1)[0][0, 0]),
                *args,
                lambda ix: _file_bytes(ix.save_index),
            )
        ]
    if peer == "usearch":
        from usearch.index import Index

        def build_usearch(dtype: str):
            ix = Index(
                ndim=dim, metric="ip", dtype=dtype, connectivity=HNSW_M, expansion_add=HNSW_EF_BUILD,
                expansion_search=HNSW_EF_SEARCH,
            )  # fmt: skip
            ix.add(np.arange(n), matrix, threads=BUILD_THREADS)
            return ix

        return [
            _measure(
                f"usearch ({dtype})",
                lambda dtype=dtype: build_usearch(dtype),
                lambda ix, q: int(ix.search(q, 1, threads=1).keys[0]),
                *args,
                lambda ix: _file_bytes(ix.save),
            )
            for dtype in ("i8", "f16")
        ]
    if peer == "faiss":
        import faiss

        def build_faiss_hnsw():
            faiss.omp_set_num_threads(BUILD_THREADS)
            ix = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            ix.hnsw.efConstruction = HNSW_EF_BUILD
            ix.add(matrix)
            ix.hnsw.efSearch = HNSW_EF_SEARCH
            faiss.omp_set_num_threads(1)
            return ix

        def build_faiss_ivf():
            faiss.omp_set_num_threads(BUILD_THREADS)
            cells = ivf.num_cells(n)
            ix = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, cells, faiss.METRIC_INNER_PRODUCT)
            sample = np.random.default_rng(0).choice(
                n, min(n, cells * ivf.TRAIN_ROWS_PER_CELL), replace=False
            )
            ix.train(matrix[np.sort(sample)])
            ix.add(matrix)
            ix.nprobe = ivf.NPROBE
            faiss.omp_set_num_threads(1)
            return ix

        def search(ix, q):
            return int(ix.search(q[None], 1)[1][0, 0])

        def size(ix):
            return len(faiss.serialize_index(ix))

        return [
            _measure("faiss HNSW (M=32, flat)", build_faiss_hnsw, search, *args, size),
            _measure(f"faiss IVF-flat (nprobe={ivf.NPROBE})", build_faiss_ivf, search, *args, size),
        ]
    raise ValueError(f"unknown index {peer!r}: hnswlib, usearch or faiss")


def peer_line(r: dict) -> str:
    if "skipped" in r:
        return f"{r['method']}: skipped ({r['skipped']})"
    return (
        f"{r['method']:<28} build {r['build_s']:>6.1f} s  search p50 {r['search_p50_ms']:.3f} ms "
        f"p99 {r['search_p99_ms']:.3f} ms  recall {r['recall_near']:.3f}  {r['index_bytes_per_row']} B/row"
    )
