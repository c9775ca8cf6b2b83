"""An inverted-file (IVF) index over one partition's vectors, in numpy: the rows are grouped into cells around
k-means centroids, and a query scans only the rows of its ``nprobe`` nearest cells.

Chosen by measurement (``nearshore bench cache``): below ``MIN_ROWS`` a brute-force product over the whole
partition is as fast (0.26 ms at 10k rows, 11-12 ms at 100k, one BLAS thread); above, this index searched
100k rows in 0.42-0.50 ms (p99 0.8) and 1M rows in 2.8 ms (p99 4.6), finding the true nearest for every
near-duplicate query at 100k and keeping, at 1M, every stored question among the candidates of its
paraphrases (205 of 205); it builds in 5.5 s at 100k and 77 s at 1M, labels a new row in microseconds and
keeps ~25 bytes per row (no copy of the vectors: it reads them from the partition's memory-mapped ``.vec``
file, whose page cache every process shares). hnswlib, usearch and faiss's HNSW searched 100k rows in
0.1-0.2 ms but found the true nearest for only 92-97% of near-duplicate queries, copy the vectors (530-1800
bytes per row) and bring a dependency; beside a 4-5 ms embedding per lookup, the 0.3 ms saved does not pay.

The index covers rows ``[0, len(labels))``; rows appended later are labelled on the next search
(``extend``). Cells are kept sorted for the rows labelled at the last ``sort``; later rows are scanned from
their labels directly until the next sort. Saved as ``<partition>.ivf`` (centroids, labels, and the
identity of the vector file it was built on, so a compacted partition is rebuilt, never misread).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIN_ROWS = 20_000  # partitions smaller than this are searched by brute force
NPROBE = 16  # cells scanned per query, at most
# Rows scored per query at most: the nearest cells until this many. A guard against the densest cells (at
# 1M rows, 2048 lost 8 of 205 stored questions to their paraphrases, 8192 none).
MAX_ROWS = 8192
TRAIN_ROWS_PER_CELL = 32  # k-means sample size per cell
KMEANS_ITERATIONS = 8
CHUNK_ROWS = 8192  # rows assigned to cells per matrix product (bounds the scores' memory)
RESORT_ROWS = 4096  # rows labelled since the last sort before the cells are sorted again
RETRAIN_GROWTH = 4.0  # rebuild when the partition has grown this many times since training


def num_cells(rows: int) -> int:
    return int(min(max(16, 4 * np.sqrt(rows)), 16_384))


def _assign(matrix: np.ndarray, centroids: np.ndarray, start: int, end: int) -> np.ndarray:
    labels = np.empty(end - start, dtype=np.int32)
    for s in range(start, end, CHUNK_ROWS):
        e = min(end, s + CHUNK_ROWS)
        labels[s - start : e - start] = np.argmax(np.asarray(matrix[s:e]) @ centroids.T, axis=1)
    return labels


@dataclass(slots=True)
class IvfIndex:
    centroids: np.ndarray  # [cells, dim] float32, unit rows
    labels: np.ndarray  # [rows] int32: the cell of each row
    identity: tuple[int, int]  # (device, inode) of the vector file it was built on
    trained_rows: int
    order: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))  # rows sorted by cell
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # cell c: order[o[c]:o[c+1]]
    sorted_rows: int = 0  # rows covered by order/offsets
    saved_rows: int = 0  # rows in the file on disk

    @classmethod
    def build(cls, matrix: np.ndarray, identity: tuple[int, int], seed: int = 0) -> IvfIndex:
        """k-means on a sample of the rows, then every row to its nearest centroid."""
        rows = len(matrix)
        cells = num_cells(rows)
        rng = np.random.default_rng(seed)
        sample_ids = np.sort(rng.choice(rows, min(rows, cells * TRAIN_ROWS_PER_CELL), replace=False))
        sample = np.ascontiguousarray(matrix[sample_ids], dtype=np.float32)
        centroids = sample[rng.choice(len(sample), cells, replace=False)].copy()
        for _ in range(KMEANS_ITERATIONS):
            labels = _assign(sample, centroids, 0, len(sample))
            sums = np.zeros_like(centroids)
            np.add.at(sums, labels, sample)
            empty = np.bincount(labels, minlength=cells) == 0
            centroids = np.where(empty[:, None], centroids, sums)  # an empty cell keeps its centroid
            centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        index = cls(centroids.astype(np.float32), _assign(matrix, centroids, 0, rows), identity, rows)
        index.sort()
        return index

    @property
    def rows(self) -> int:
        return len(self.labels)

    def stale(self, rows: int) -> bool:
        """Whether to rebuild: the partition grew far past what the cells were trained on."""
        return rows > RETRAIN_GROWTH * self.trained_rows

    def extend(self, matrix: np.ndarray, rows: int) -> None:
        """Label the rows appended since (``matrix`` holds at least ``rows`` rows)."""
        if rows > self.rows:
            self.labels = np.concatenate([self.labels, _assign(matrix, self.centroids, self.rows, rows)])
        if self.rows - self.sorted_rows >= RESORT_ROWS:
            self.sort()

    def sort(self) -> None:
        self.order = np.argsort(self.labels, kind="stable").astype(np.int32)
        self.offsets = np.searchsorted(self.labels[self.order], np.arange(len(self.centroids) + 1))
        self.sorted_rows = self.rows

    def candidates(self, query: np.ndarray, nprobe: int = NPROBE, max_rows: int = MAX_ROWS) -> np.ndarray:
        """Rows in the query's nearest cells (up to ``nprobe`` of them, nearest first, and no more once
        ``max_rows`` are gathered), ascending."""
        nprobe = min(nprobe, len(self.centroids))
        scores = self.centroids @ query
        cells = np.argpartition(scores, -nprobe)[-nprobe:]
        cells = cells[np.argsort(-scores[cells])]
        sizes = np.cumsum(self.offsets[cells + 1] - self.offsets[cells])
        cells = cells[: max(1, int(np.searchsorted(sizes, max_rows)) + 1)]
        parts = [self.order[self.offsets[c] : self.offsets[c + 1]] for c in cells]
        if self.rows > self.sorted_rows:  # labelled since the last sort
            tail = self.labels[self.sorted_rows :]
            parts.append(self.sorted_rows + np.flatnonzero(np.isin(tail, cells)))
        rows = np.concatenate(parts) if parts else np.empty(0, np.int64)
        rows.sort()
        return rows

    # --- on disk ---------------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Written whole to a temporary file, then renamed over ``path`` (readers see old or new)."""
        labels = self.labels  # extend() replaces the array, never changes it: a consistent snapshot
        buffer = io.BytesIO()
        np.savez(
            buffer,
            centroids=self.centroids,
            labels=labels,
            identity=np.array(self.identity, dtype=np.int64),
            trained_rows=np.array(self.trained_rows, dtype=np.int64),
        )
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, path)
        self.saved_rows = len(labels)

    @classmethod
    def load(cls, path: Path, identity: tuple[int, int], rows: int, dim: int) -> IvfIndex | None:
        """The saved index if it was built on this vector file and fits it; None otherwise (or unreadable)."""
        try:
            with np.load(path, allow_pickle=False) as saved:
                centroids = saved["centroids"].astype(np.float32, copy=False)
                labels = saved["labels"].astype(np.int32, copy=False)
                built_on = tuple(int(x) for x in saved["identity"])
                trained_rows = int(saved["trained_rows"])
        except Exception:  # unreadable, truncated, not an archive, not ours: rebuilt, never an error
            return None
        fits = (
            built_on == identity
            and len(labels) <= rows
            and centroids.ndim == 2
            and centroids.shape[1] == dim
            and (len(labels) == 0 or 0 <= int(labels.min()) <= int(labels.max()) < len(centroids))
        )
        if not fits:
            return None
        index = cls(centroids, labels, identity, trained_rows, saved_rows=len(labels))
        index.sort()
        return index
