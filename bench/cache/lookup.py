"""``nearshore bench cache``: the semantic lookup's latency as a partition grows, and the index behind it.

For each size (1k, 100k, 1M rows in one partition) a cache folder is filled once and kept under the work
folder (``/tmp/nearshore-bench-cache`` by default) with its IVF index, so a later run starts measuring at
once. The rows are the shipped labelled set's questions (real embeddings, so lookups of their paraphrases
hit through the real verifier) plus synthetic neighbours: each a mixture of two real question vectors and
some noise, so the partition has the clustered shape real questions have. Then:

- lookups: ``ResponseCache.semantic`` as the edge calls it (the real embedder on its worker thread, the
  store's ``nearest``, the entry read, the verifier), p50/p99, and the search alone (``nearest`` on a
  ready vector) beside it;
- many small partitions: the same rows spread over thousands of tenants' partitions, lookups in random ones;
- the index: numpy brute force, this store's IVF and the peers that are installed (hnswlib, usearch, faiss)
  on the same vectors: build time, search p50/p99, recall of the true nearest for near-duplicate queries,
  bytes per row;
- memory and disk per entry.

Every step checks the time budget and says what it skipped. The TTFT of a hit through an edge is
``bench/cache/ttft.py`` (it needs processes and links; this module stays below the edge).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from bench.cache.index_peers import compare_indexes, peer_line, percentiles
from cache.audit_judge import EXPLORE_FROM
from cache.decision import semantic_check
from cache.embedder import Embedder, load_embedder
from cache.embedder_pool import EmbedderPool
from cache.keys import CacheKey, cache_key, normalise
from cache.response_cache import ResponseCache, threshold_for
from cache.settings import CacheSettings
from cache.store import CacheStore, Entry
from nearshore.protocol.schemas import ChatCompletionRequest, ChatMessage

PAIRS = Path(__file__).resolve().parents[2] / "cache" / "data" / "pairs.jsonl"
BENCH_MODEL = "gemma-3-270m"  # the request the TTFT part sends: its partition is the one filled here
BENCH_TENANT_SCOPE = "tenant:bench"
BENCH_MAX_TOKENS = 8
FILL_BATCH = 20_000
# The judge's threshold where a judged hit is timed: the lowest a partition's learned one goes (a partition
# the live audit has opened all the way; at the default target the calibration alone never serves one).
JUDGED_AT = EXPLORE_FROM


@dataclass
class CacheBench:
    sizes: str = "1000,100000,1000000"
    queries: int = 200
    small_partitions: int = 10_000
    rows_per_partition: int = 10
    peers: str = "hnswlib,usearch,faiss"
    peer_sizes: str = "100000"
    work_dir: str = "/tmp/nearshore-bench-cache"
    budget_s: float = 1800.0
    fresh: bool = False  # refill the folders even if a previous run left them


def bench_request(question: str) -> ChatCompletionRequest:
    """What the TTFT part sends (as its key sees it): stream and stream_options do not split partitions."""
    return ChatCompletionRequest(
        model=BENCH_MODEL,
        messages=[ChatMessage(role="user", content=question)],
        temperature=0.0,
        max_tokens=BENCH_MAX_TOKENS,
    )


def bench_key(question: str) -> CacheKey:
    key = cache_key(bench_request(question), BENCH_TENANT_SCOPE)
    assert key is not None
    return key


@dataclass(frozen=True, slots=True)
class Corpus:
    """The labelled set's questions and their vectors: what is stored (a) and what is asked (b)."""

    stored: list[str]
    stored_vectors: np.ndarray
    asked: list[str]
    asked_same: list[bool]
    asked_vectors: np.ndarray
    asked_for: list[str]  # the stored question each asked one is paired with


def load_corpus(embedder: Embedder) -> Corpus:
    rows = [msgspec.json.decode(line) for line in PAIRS.read_bytes().splitlines() if line.strip()]
    stored = list(dict.fromkeys(r["a"] for r in rows))
    asked = [r["b"] for r in rows]
    same = [bool(r["same"]) for r in rows]
    return Corpus(stored, embedder.embed(stored), asked, same, embedder.embed(asked), [r["a"] for r in rows])


def answered_paraphrases(corpus: Corpus, judged: bool = False) -> list[str]:
    """Paraphrases of stored questions that the shipped cache answers (similar enough, and accepted), and
    are not the same text (those are exact hits): those the verifier explains, or (``judged``) those only
    the pair judge accepts."""
    settings = CacheSettings()
    threshold = threshold_for(settings.target_false_hit_rate)
    target = settings.target_false_hit_rate
    check = semantic_check(settings.judge, settings.judge_path, target, learns=True, threshold=JUDGED_AT)
    index = {q: i for i, q in enumerate(corpus.stored)}
    out = []
    for i, text in enumerate(corpus.asked):
        a = corpus.asked_for[i]
        similar = float(corpus.asked_vectors[i] @ corpus.stored_vectors[index[a]]) >= threshold
        if not (corpus.asked_same[i] and similar and normalise(text) != normalise(a)):
            continue
        decision = check(text, a)
        if decision.ok and (decision.judged is not None) == judged:
            out.append(text)
    return out


def synthetic(n: int, base: np.ndarray, seed: int) -> np.ndarray:
    """``n`` unit vectors, each two base vectors mixed with noise: the clusters real questions form."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    for s in range(0, n, 50_000):
        m = min(50_000, n - s)
        i, j = rng.integers(0, len(base), m), rng.integers(0, len(base), m)
        v = base[i] + rng.uniform(0.2, 0.8, (m, 1)).astype(np.float32) * base[j]
        v += 0.04 * rng.standard_normal((m, base.shape[1])).astype(np.float32)
        out[s : s + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def _entry(partition: str, query: str, now: float) -> Entry:
    return Entry(
        partition=partition,
        query=query,
        kind="chat",
        text=" token" * BENCH_MAX_TOKENS,
        finish_reason="length",
        completion_tokens=BENCH_MAX_TOKENS,
        model=BENCH_MODEL,
        created_s=now,
        expires_s=now + 30 * 86400.0,
        scope=BENCH_TENANT_SCOPE,
    )


def fill_partition(folder: Path, rows: int, corpus: Corpus, fresh: bool) -> tuple[str, float | None]:
    """A folder whose bench partition holds ``rows`` rows (the stored questions first); kept for later
    runs. Returns the partition and the seconds spent filling (None when a previous run's was reused)."""
    partition = bench_key(corpus.stored[0]).partition
    marker = folder / "filled.json"
    if (
        not fresh
        and marker.exists()
        and json.loads(marker.read_text()) == {"rows": rows, "partition": partition}
    ):
        return partition, None
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    dim = corpus.stored_vectors.shape[1]
    store = CacheStore(folder, dim, 64 << 30)
    now = time.time()
    try:
        real = min(rows, len(corpus.stored))
        items = [(bench_key(q).exact, _entry(partition, q, now)) for q in corpus.stored[:real]]
        store.put_many(items, corpus.stored_vectors[:real])
        for s in range(real, rows, FILL_BATCH):
            n = min(FILL_BATCH, rows - s)
            batch = [
                (f"{i:032x}", _entry(partition, f"synthetic question {i}", now)) for i in range(s, s + n)
            ]
            store.put_many(batch, synthetic(n, corpus.stored_vectors, seed=s))
    finally:
        store.close()
    marker.write_text(json.dumps({"rows": rows, "partition": partition}))
    return partition, time.perf_counter() - started


def ready_index(store: CacheStore, partition: str, probe: np.ndarray, deadline: float) -> dict:
    """Make sure the partition's index is in place before timing lookups (loaded, or built now)."""
    loaded = store.vectors(partition)
    if loaded is None or loaded.rows < store.indexes.min_rows:
        return {"index": "full scan", "build_s": 0.0}
    started = time.perf_counter()
    builds = store.indexes.builds
    while store.indexes.get(partition) is None:
        store.nearest(partition, probe, 1, 2.0)
        if time.monotonic() > deadline:
            return {"index": "not ready within the budget (full scan)", "build_s": None}
        time.sleep(0.1)
    built = store.indexes.builds > builds
    cells = len(store.indexes.get(partition).centroids)
    return {
        "index": f"IVF, {cells} cells ({'built' if built else 'loaded'})",
        "build_s": round(time.perf_counter() - started, 1) if built else 0.0,
    }


async def _lookups(cache: ResponseCache, partition: str, corpus: Corpus, n: int) -> dict:
    picks = np.random.default_rng(1).choice(len(corpus.asked), min(n, len(corpus.asked)), replace=False)
    total_ms, hits = [], 0
    for i in picks:
        started = time.perf_counter()
        lookup = await cache.semantic(CacheKey(partition, "", corpus.asked[i]))
        total_ms.append((time.perf_counter() - started) * 1e3)
        hits += lookup.hit is not None
    return {**percentiles(total_ms, "lookup"), "hits": hits, "lookups": len(picks)}


def _search_only(store: CacheStore, partition: str, vectors: np.ndarray, threshold: float) -> dict:
    times = []
    for q in vectors:
        started = time.perf_counter()
        store.nearest(partition, q, 5, threshold)
        times.append((time.perf_counter() - started) * 1e3)
    return percentiles(times, "search")


def measure_size(
    folder: Path, rows: int, corpus: Corpus, embedder: Embedder, bench: CacheBench, deadline: float
) -> dict:
    partition, fill_s = fill_partition(folder, rows, corpus, bench.fresh)
    settings = CacheSettings()
    threshold = threshold_for(settings.target_false_hit_rate)
    pool = EmbedderPool(lambda: embedder, source="bench", load_when="eager")

    async def run() -> dict:
        await pool.start()
        cache = ResponseCache(folder, pool, embedder.dim, None, threshold)  # type: ignore[arg-type]
        try:
            index = ready_index(cache.store, partition, corpus.asked_vectors[0], deadline)
            await _lookups(cache, partition, corpus, 10)  # warm: the embedder's first calls, the page cache
            result = {"rows": rows, "fill_s": None if fill_s is None else round(fill_s, 1), **index}
            result |= await _lookups(cache, partition, corpus, bench.queries)
            result |= _search_only(cache.store, partition, corpus.asked_vectors[: bench.queries], threshold)
            return result | memory_per_entry(cache.store, partition)
        finally:
            cache.close()
            await pool.close()

    result = asyncio.run(run())
    return result | per_entry(folder, rows)


def per_entry(folder: Path, rows: int) -> dict:
    sizes: dict[str, int] = {"entries": 0, "vec": 0, "ids": 0, "ivf": 0}
    for path in folder.rglob("*"):
        if path.is_file():
            kind = path.suffix.lstrip(".") if path.parent.name == "index" else "entries"
            if kind in sizes:
                sizes[kind] += path.stat().st_size
    return {
        "disk_bytes_per_entry": round(sum(sizes.values()) / rows),
        "diskcache_bytes_per_entry": round(sizes["entries"] / rows),
        "vector_bytes_per_entry": round((sizes["vec"] + sizes["ids"]) / rows),
        "ivf_bytes_per_entry": round(sizes["ivf"] / rows, 1),
    }


def memory_per_entry(store: CacheStore, partition: str) -> dict:
    """Per row in a process's own memory: the ids (16 bytes) and the IVF (labels, cell order, centroids);
    the vectors are memory-mapped, in the page cache that every process on the folder shares."""
    loaded, index = store.vectors(partition), store.indexes.get(partition)
    rows = loaded.rows if loaded is not None else 0
    ivf_bytes = index.labels.nbytes + index.order.nbytes + index.centroids.nbytes if index else 0
    return {
        "private_memory_bytes_per_entry": round((len(loaded.raw_ids) + ivf_bytes) / rows, 1) if rows else 0,
        "shared_memory_bytes_per_entry": loaded.matrix.shape[1] * 4 if rows else 0,
    }


def measure_small_partitions(folder: Path, corpus: Corpus, embedder: Embedder, bench: CacheBench) -> dict:
    """Lookups spread over many tenants' small partitions (each its own files): cold, then warm."""
    count, per = bench.small_partitions, bench.rows_per_partition
    dim = corpus.stored_vectors.shape[1]
    marker = folder / "filled.json"
    shape = {"partitions": count, "rows_per_partition": per}
    started = time.perf_counter()
    if bench.fresh or not marker.exists() or json.loads(marker.read_text()) != shape:
        shutil.rmtree(folder, ignore_errors=True)
        store = CacheStore(folder, dim, 64 << 30)
        now = time.time()
        vectors = synthetic(count * per, corpus.stored_vectors, seed=99)
        for p in range(count):
            name = f"{p:032x}"
            items = [(f"{p:016x}{i:016x}", _entry(name, f"question {i} of {p}", now)) for i in range(per)]
            store.put_many(items, vectors[p * per : (p + 1) * per])
        store.close()
        marker.write_text(json.dumps(shape))
    fill_s = time.perf_counter() - started
    store = CacheStore(folder, dim, None)
    rng = np.random.default_rng(2)
    try:
        out: dict[str, object] = {**shape, "fill_s": round(fill_s, 1)}
        picks = rng.choice(count, min(bench.queries, count), replace=False)
        for phase in ("cold", "warm"):  # cold: the partition's files are opened and mapped by the lookup
            times = []
            for p, q in zip(picks, corpus.asked_vectors, strict=False):
                t = time.perf_counter()
                store.nearest(f"{p:032x}", q, 5, 0.5)
                times.append((time.perf_counter() - t) * 1e3)
            out |= {f"{phase}_{k}": v for k, v in percentiles(times, "search").items()}
        embed_ms = []
        for text in corpus.asked[: bench.queries]:
            t = time.perf_counter()
            embedder.embed([text])
            embed_ms.append((time.perf_counter() - t) * 1e3)
        return out | percentiles(embed_ms, "embed")
    finally:
        store.close()


def run(bench: CacheBench, log: Callable[[str], object] = print) -> dict:
    started = time.monotonic()
    deadline = started + bench.budget_s
    work = Path(bench.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    embedder = load_embedder(backend=CacheSettings().embedder_backend)  # what the edge's cache runs
    corpus = load_corpus(embedder)
    report: dict[str, object] = {
        "embedder": f"{embedder.name} ({embedder.backend})",
        "sizes": [],
        "skipped": [],
    }
    for rows in _ints(bench.sizes):
        if time.monotonic() > deadline:
            report["skipped"].append(f"{rows} rows: out of time")  # type: ignore[union-attr]
            continue
        log(f"bench cache: {rows} rows in one partition ...")
        result = measure_size(work / f"rows-{rows}", rows, corpus, embedder, bench, deadline)
        report["sizes"].append(result)  # type: ignore[union-attr]
        log(f"  {_size_line(result)}")
    if bench.small_partitions and time.monotonic() < deadline:
        log(f"bench cache: {bench.small_partitions} partitions of {bench.rows_per_partition} rows ...")
        report["small_partitions"] = measure_small_partitions(work / "small", corpus, embedder, bench)
    peers = [p for p in bench.peers.split(",") if p]
    report["index_comparison"] = []
    for rows in _ints(bench.peer_sizes):
        if time.monotonic() > deadline:
            report["skipped"].append(f"index comparison at {rows}: out of time")  # type: ignore[union-attr]
            continue
        log(f"bench cache: index comparison at {rows} rows ({', '.join(['numpy', 'ivf', *peers])}) ...")
        vectors = np.load(_matrix(work, rows, corpus), mmap_mode="r")
        report["index_comparison"].append(  # type: ignore[union-attr]
            {"rows": rows, "results": compare_indexes(vectors, corpus, peers, deadline, log)}
        )
    report["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def _matrix(work: Path, rows: int, corpus: Corpus) -> Path:
    path = work / f"vectors-{rows}.npy"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, synthetic(rows, corpus.stored_vectors, seed=rows))
        os.replace(tmp, path)
    return path


def _ints(text: str) -> Sequence[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _size_line(r: dict) -> str:
    return (
        f"{r['rows']} rows, {r['index']}: lookup p50 {r['lookup_p50_ms']:.2f} ms "
        f"p99 {r['lookup_p99_ms']:.2f} ms (search alone p50 {r['search_p50_ms']:.2f} / "
        f"p99 {r['search_p99_ms']:.2f}), "
        f"{r['hits']}/{r['lookups']} hits; {r['disk_bytes_per_entry']} B/entry on disk"
    )


def format_report(report: dict) -> str:
    lines = [f"bench cache ({report['embedder']}, {report['seconds']} s)", "", "one partition:"]
    lines += [f"  {_size_line(r)}" for r in report["sizes"]]
    lines += [
        f"  {r['rows']} rows: private memory {r['private_memory_bytes_per_entry']} B/entry (+ "
        f"{r['shared_memory_bytes_per_entry']} B shared, memory-mapped); on disk: diskcache "
        f"{r['diskcache_bytes_per_entry']} B, vectors {r['vector_bytes_per_entry']} B, IVF "
        f"{r['ivf_bytes_per_entry']} B; filled {_seconds(r['fill_s'])}, index {_seconds(r['build_s'])}"
        for r in report["sizes"]
    ]
    small = report.get("small_partitions")
    if small:
        lines += [
            "",
            f"{small['partitions']} partitions of {small['rows_per_partition']} rows: search p50/p99 cold "
            f"{small['cold_search_p50_ms']:.3f}/{small['cold_search_p99_ms']:.3f} ms, warm "
            f"{small['warm_search_p50_ms']:.3f}/{small['warm_search_p99_ms']:.3f} ms; embedding one question "
            f"{small['embed_p50_ms']:.2f}/{small['embed_p99_ms']:.2f} ms",
        ]
    for comparison in report.get("index_comparison", []):
        lines += [
            "",
            f"the index at {comparison['rows']} rows (search on one thread; recall of the true nearest):",
        ]
        lines += [f"  {peer_line(r)}" for r in comparison["results"]]
    ttft = report.get("ttft")
    if ttft:
        lines += [
            "",
            f"TTFT through an edge ({ttft['rows']} rows in the partition; the region's first byte "
            f"{ttft['rtt_ms']} ms{'' if ttft.get('audit', True) else '; no semantic hit audited'}):",
        ]
        huge = ttft["kinds"].get("huge question")
        cost = ttft["kinds"].get("miss cost")
        for kind, r in ttft["kinds"].items():
            if kind in ("huge question", "miss cost"):
                continue
            cache_dur = (
                f", cache;dur p50 {r['cache_dur_p50_ms']} ms" if r["cache_dur_p50_ms"] is not None else ""
            )
            lines.append(
                f"  {kind:<28} p50 {r['ttft_p50_ms']:>7.2f} ms  p99 {r['ttft_p99_ms']:>7.2f} ms  "
                f"({r['answered_by_cache']}/{r['requests']} from the cache, {r['errors']} errors{cache_dur})"
            )
        if cost and cost.get("pairs"):
            low, high = cost["ttft_median_ci95_ms"]
            on, off = ttft["kinds"]["miss, cache on"], ttft["kinds"]["miss, cache off"]
            lines += [
                f"  what the cache adds to a miss ({cost['pairs']} pairs): TTFT median "
                f"{cost['ttft_median_ms']:+.2f} ms (95% {low:+.2f} to {high:+.2f}), p99 of the differences "
                f"{cost['ttft_p99_ms']:+.2f} ms;",
                f"    the edge's time before forwarding p50 {on['edge_p50_ms']} ms against "
                f"{off['edge_p50_ms']} ms (median difference {cost['edge_median_ms']:+.3f} ms)",
            ]
        if huge:
            lines.append(
                f"  a {huge['bytes'] / 1e3:.0f} kB question: edge CPU {huge['cache on']} s with the cache, "
                f"{huge['cache off']} s without (median of {huge['repeats']})"
            )
    if report.get("skipped"):
        lines += ["", "skipped: " + "; ".join(report["skipped"])]
    lines.append(f"max RSS {report['max_rss_mb']} MiB")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "before (reused)" if not value else f"in {value} s"
