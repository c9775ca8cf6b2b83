"""Measure the sentence embedder against its peers: ``python -m bench.cache.embedder [--peer-python PY]``.

For each backend, on the same machine in one run: load time; the latency of one short query (10-30 words)
embedded alone, p50 / p99 over ``--queries`` of them; batch throughput (texts a second, batches of 64);
quality on labelled pairs from issue 10 (paraphrases, and hard negatives: negations, swapped numbers,
directions, entities), as cosine ranges and as hits at the thresholds 0.90 and 0.95; and parity with
the numpy encoder (the lowest cosine between the two vectors of one text).

Nearshore's MiniLM runs in this process twice: its layers in numpy ("numpy"), then in ONNX Runtime on the
graph cache/embedder_ort.py writes from the weights ("onnxruntime"). The peers (sentence-transformers,
ONNX Runtime on torch's export, fp32 "onnx" and int8 "onnx-int8", a static-embedding model) need torch or
packages an edge does not install: they run in a separate
Python given by ``--peer-python`` (e.g. a throwaway venv with torch==2.13.0 sentence-transformers
onnxruntime onnx tokenlearn-static-model), each in its own subprocess (bench/cache/embedder_peers.py).
Every backend gets the same thread count (``--threads``, default 1).

Not a test: the figures go into cache/embedder.py's docstring and the report of issue 10.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cache.embedder import embedded_model_dir, limit_blas_threads, load_embedder, onnxruntime_available
from harness.stats import percentile

PEERS = ("st", "onnx", "onnx-int8", "static")
PEERS_SCRIPT = Path(__file__).with_name("embedder_peers.py")

# Typical chat questions, 10-30 words each.
QUERIES = [
    "How do I reset my password if I no longer have access to the email address on my account?",
    "What is the best way to store cooked rice so that it stays safe to eat the next day?",
    "Can you explain the difference between a Roth IRA and a traditional IRA in simple terms?",
    "Write a short polite email asking my landlord to fix the broken heating in my flat this week.",
    "Which documents do I need to renew a Nigerian passport from abroad, and how long does it take?",
    "Summarise the main causes of the First World War in three or four sentences for a student.",
    "How many litres of water should an adult drink every day in a hot and humid climate like Lagos?",
    "What are some good vegetarian sources of protein that are cheap and easy to cook at home?",
    "Explain how a hash map works and why lookups are usually constant time on average.",
    "Is it better to learn Python or JavaScript first if I want to build web applications?",
    "Translate 'where is the nearest pharmacy, please' into French, Spanish and Portuguese.",
    "What should I check before buying a used car with more than one hundred thousand kilometres?",
    "Give me a simple weekly workout plan for a beginner with no gym equipment at home.",
    "Why does my sourdough bread come out dense and flat, and how can I fix it next time?",
    "How does compound interest work, with an example of saving 100 dollars a month for ten years?",
    "What is the capital of Kenya and what are the main industries in that city today?",
]

PARAPHRASES = [
    ("What is the capital of Nigeria?", "Which city is Nigeria's capital?"),
    ("How do I reset my password?", "What are the steps to change my forgotten password?"),
    ("Book a table for two at 7 pm tonight.", "Reserve dinner for 2 people this evening at 7pm."),
    ("How tall is Mount Kilimanjaro?", "What is the height of Mount Kilimanjaro?"),
    ("Recommend a good book about Roman history.", "Can you suggest a good book on the history of Rome?"),
    ("How do I boil an egg?", "What's the way to make a boiled egg?"),
    ("Explain photosynthesis simply.", "Give me a simple explanation of photosynthesis."),
    ("What time is it in Tokyo right now?", "What's the current time in Tokyo?"),
    ("How can I improve my sleep?", "What are ways to sleep better at night?"),
    ("Is coffee bad for your heart?", "Does drinking coffee harm the heart?"),
    ("Write a haiku about the sea.", "Compose a haiku on the ocean."),
    ("What causes rain?", "Why does it rain?"),
]

HARD_NEGATIVES = [
    ("Is it safe to drink tap water in London?", "Is it unsafe to drink tap water in London?"),
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("Send 100 dollars to Ada.", "Send 1000 dollars to Ada."),
    ("What is the capital of Nigeria?", "What is the capital of Niger?"),
    ("Flights from Lagos to London", "Flights from London to Lagos"),
    ("Is 17 a prime number?", "Is 27 a prime number?"),
    ("Who won the 2018 World Cup?", "Who won the 2022 World Cup?"),
    ("How do I enable two-factor authentication?", "How do I disable two-factor authentication?"),
    ("What is the population of Kenya?", "What is the population of Ghana?"),
    ("Convert 5 miles to kilometres.", "Convert 5 kilometres to miles."),
    ("Is Python faster than Java?", "Is Java faster than Python?"),
    ("What is the weather in Paris today?", "What was the weather in Paris yesterday?"),
]
THRESHOLDS = (0.90, 0.95)


@dataclass
class Result:
    backend: str
    load_s: float
    single_p50_ms: float
    single_p99_ms: float
    batch_texts_per_s: float
    paraphrase_cos_min: float
    paraphrase_cos_mean: float
    negative_cos_mean: float
    negative_cos_max: float
    paraphrase_hits: dict[str, int]
    negative_hits: dict[str, int]
    parity_min_cos: float | None  # against the numpy encoder, same texts (None when dims differ)


def job(num_queries: int, threads: int) -> dict[str, object]:
    queries = list(itertools.islice(itertools.cycle(QUERIES), num_queries))
    batch = [f"{q} ({i})" for i, q in enumerate(itertools.islice(itertools.cycle(QUERIES), 256))]
    quality = [t for pair in PARAPHRASES + HARD_NEGATIVES for t in pair]
    return {
        "queries": queries,
        "batch_texts": batch,
        "batch_size": 64,
        "quality_texts": quality,
        "threads": threads,
    }


def run_local(backend: str, spec: dict) -> dict[str, object]:
    """Nearshore's own embedder, in this process, with ``backend`` running its layers."""
    threads = int(spec["threads"])
    limit_blas_threads(threads)
    started = time.perf_counter()
    embedder = load_embedder(backend=backend, threads=threads)  # type: ignore[arg-type]
    load_s = time.perf_counter() - started
    for text in spec["queries"][:10]:
        embedder.embed([text])
    single_ms = []
    for text in spec["queries"]:
        t = time.perf_counter()
        embedder.embed([text])
        single_ms.append((time.perf_counter() - t) * 1000)
    texts, size = spec["batch_texts"], spec["batch_size"]
    t = time.perf_counter()
    for i in range(0, len(texts), size):
        embedder.embed(texts[i : i + size])
    batch_s = time.perf_counter() - t
    return {
        "backend": backend,
        "load_s": load_s,
        "single_ms": single_ms,
        "batch_texts_per_s": len(texts) / batch_s,
        "quality_vectors": embedder.embed(spec["quality_texts"]),
    }


def run_peer(backend: str, python: str, spec: dict, work_dir: Path, timeout_s: float) -> dict[str, object]:
    done = subprocess.run(
        [python, str(PEERS_SCRIPT), backend, str(embedded_model_dir()), str(work_dir)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{backend}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def summarise(raw: dict[str, object], reference: np.ndarray | None) -> Result:
    single = np.asarray(raw["single_ms"])
    vectors = np.asarray(raw["quality_vectors"], dtype=np.float32)
    n_para = len(PARAPHRASES)
    pair_cos = (vectors[0::2] * vectors[1::2]).sum(axis=1)
    para, neg = pair_cos[:n_para], pair_cos[n_para:]
    parity = None
    if reference is not None and reference.shape == vectors.shape:
        parity = float((reference * vectors).sum(axis=1).min())
    return Result(
        backend=str(raw["backend"]),
        load_s=round(float(raw["load_s"]), 3),
        single_p50_ms=round(percentile(single, 50), 2),
        single_p99_ms=round(percentile(single, 99), 2),
        batch_texts_per_s=round(float(raw["batch_texts_per_s"]), 1),
        paraphrase_cos_min=round(float(para.min()), 3),
        paraphrase_cos_mean=round(float(para.mean()), 3),
        negative_cos_mean=round(float(neg.mean()), 3),
        negative_cos_max=round(float(neg.max()), 3),
        paraphrase_hits={f"{t:.2f}": int((para >= t).sum()) for t in THRESHOLDS},
        negative_hits={f"{t:.2f}": int((neg >= t).sum()) for t in THRESHOLDS},
        parity_min_cos=None if parity is None else round(parity, 6),
    )


def render(results: list[Result], threads: int) -> str:
    load = os.getloadavg()[0]
    lines = [
        f"embedders, one query alone and batches of 64, {threads} thread(s), load average {load:.1f}; "
        f"pairs: {len(PARAPHRASES)} paraphrases, {len(HARD_NEGATIVES)} hard negatives",
        f"{'backend':<10} {'load s':>7} {'p50 ms':>7} {'p99 ms':>7} {'texts/s':>8}  "
        f"{'para cos min/mean':>17}  {'neg cos mean/max':>16}  "
        f"{'hits@.90 para/neg':>17}  {'hits@.95 para/neg':>17}  {'parity':>8}",
    ]
    for r in results:
        parity = "-" if r.parity_min_cos is None else f"{r.parity_min_cos:.6f}"
        lines.append(
            f"{r.backend:<10} {r.load_s:>7.2f} {r.single_p50_ms:>7.2f} {r.single_p99_ms:>7.2f} "
            f"{r.batch_texts_per_s:>8.1f}  {r.paraphrase_cos_min:>8.3f}/{r.paraphrase_cos_mean:<8.3f}  "
            f"{r.negative_cos_mean:>7.3f}/{r.negative_cos_max:<8.3f}  "
            f"{r.paraphrase_hits['0.90']:>8}/{r.negative_hits['0.90']:<8}  "
            f"{r.paraphrase_hits['0.95']:>8}/{r.negative_hits['0.95']:<8}  {parity:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cache.embedder", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--peer-python",
        default=os.environ.get("NEARSHORE_EMBED_PEER_PYTHON", ""),
        help="a Python with the peers' packages (torch, sentence-transformers, onnxruntime, ...)",
    )
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--queries", type=int, default=200, help="single queries timed per backend")
    parser.add_argument("--threads", type=int, default=1, help="compute threads for every backend")
    parser.add_argument(
        "--work-dir",
        default=str(Path.home() / ".cache" / "nearshore" / "bench-embedder"),
        help="where the ONNX exports are kept between runs",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    spec = job(args.queries, args.threads)
    numpy_raw = run_local("numpy", spec)
    reference = np.asarray(numpy_raw["quality_vectors"], dtype=np.float32)
    results = [summarise(numpy_raw, reference)]
    skipped: dict[str, str] = {}
    if onnxruntime_available():
        results.append(summarise(run_local("onnxruntime", spec), reference))
    else:
        skipped["onnxruntime"] = "onnxruntime or onnx is not installed here"
    peers = [p for p in args.peers.split(",") if p] if args.peer_python else []
    for backend in peers:
        if backend not in PEERS:
            parser.error(f"--peers: unknown backend {backend!r}")
        try:
            raw = run_peer(backend, args.peer_python, spec, Path(args.work_dir), timeout_s=900)
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
            skipped[backend] = str(exc)
            continue
        results.append(summarise(raw, reference))
    if args.json:
        print(
            json.dumps({"threads": args.threads, "results": [asdict(r) for r in results], "skipped": skipped})
        )
    else:
        print(render(results, args.threads))
        if not args.peer_python:
            print("peers skipped: no --peer-python (or NEARSHORE_EMBED_PEER_PYTHON)")
        for backend, why in skipped.items():
            print(f"{backend} skipped: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
