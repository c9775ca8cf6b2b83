"""``nearshore cache-eval``: how often the shipped cache answers a paraphrase, and how often a different
question, measured on a labelled file.

The file is JSON Lines, one pair a line: ``{"a": ..., "b": ..., "same": true|false, "kind": ...}`` (``kind``
optional, other fields ignored). For each pair an answer for ``a`` is stored and ``b`` is looked up through
:class:`cache.response_cache.ResponseCache` with the shipped default settings: the real embedder, the real
verifier, the threshold that the default target false-hit rate maps to, the exact level first. Each pair gets
its own scope, so its own partition: a fresh cache as far as the lookup can tell, in one temp folder.

To be quick, every text is embedded once up front in batches, and the cache's embedder then answers from
that table (the same vectors the embedder would give). Each pair's similarity and verifier verdict are also
kept, so the curve over the setting (target -> threshold -> hit rate, false-hit rate) and the cosine-only
comparison are computed from the same run; the lookups at the shipped threshold are checked against them.

A false hit is a negative (``same: false``) answered from the cache. Hard negatives are the negatives whose
kind is not an easy one (another topic altogether). Rates come with a 95% Wilson interval.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from cache.audit import wilson
from cache.decision import NEVER, judge_threshold_for, semantic_check
from cache.embedder import Embedder, embedded_model_dir, load_embedder
from cache.embedder_pool import EmbedderPool
from cache.keys import cache_key
from cache.response_cache import CALIBRATION, ResponseCache, threshold_for
from cache.settings import CacheSettings
from cache.store import Entry
from nearshore.protocol.schemas import ChatCompletionRequest, ChatMessage

EASY_KINDS = frozenset({"topic", "easy", "other-topic", "unrelated"})
TARGETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)  # the curve's points over the setting
COSINE_ONLY = (0.90, 0.95)  # the cosine-only figures, compared with cosine + verifier
CALIBRATION_GRID = tuple(round(0.50 + 0.01 * i, 2) for i in range(50))  # 0.50 .. 0.99
EVAL_MODEL = "cache-eval"


class Pair(msgspec.Struct):
    a: str
    b: str
    same: bool
    kind: str = ""
    lang: str = "en"


_pair_decoder = msgspec.json.Decoder(Pair)


def load_pairs(path: Path) -> list[Pair]:
    """The file's pairs; ValueError naming the line for a line that is not a pair."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            pairs.append(_pair_decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"{path}:{number}: not a labelled pair ({exc})") from exc
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs


@dataclass(frozen=True, slots=True)
class Outcome:
    """One pair through the cache: what the lookup did, and what the curve needs to redo it offline."""

    pair: Pair
    hit: str  # "exact" | "semantic" | "" (a miss)
    similarity: float  # cosine of a and b
    exact: bool  # b is a's exact key (normalised text): a hit at any threshold
    verified: bool  # the verifier accepts b for a's answer
    reason: str  # the verifier's reason when it does not

    def hit_at(self, threshold: float, verifier: bool = True) -> bool:
        return self.exact or (self.similarity >= threshold and (self.verified or not verifier))


class Table:
    """An :class:`Embedder` that answers from vectors computed up front (the same ones), falling back to
    the real embedder for a text it has not seen."""

    def __init__(self, real: Embedder, texts: Sequence[str]) -> None:
        self.real = real
        self.name, self.dim, self.max_tokens = real.name, real.dim, real.max_tokens
        self.backend = f"table over {real.backend}"
        unique = list(dict.fromkeys(texts))
        self.vectors = dict(zip(unique, real.embed(unique), strict=True))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.vectors]
        if missing:
            self.vectors.update(zip(missing, self.real.embed(missing), strict=True))
        return np.stack([self.vectors[t] for t in texts])

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.real.count_tokens(texts)


def _request(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model=EVAL_MODEL, messages=[ChatMessage(role="user", content=text)], temperature=0.0
    )


def _entry(partition: str, query: str, ttl_s: float) -> Entry:
    now = time.time()
    return Entry(
        partition=partition,
        query=query,
        kind="chat",
        text=f"the answer to: {query}",
        finish_reason="stop",
        completion_tokens=5,
        model=EVAL_MODEL,
        created_s=now,
        expires_s=now + ttl_s,
    )


async def run_pairs(
    pairs: Sequence[Pair], settings: CacheSettings, embedder: Embedder | Table, folder: Path
) -> list[Outcome]:
    """Store ``a`` and look up ``b`` for each pair through a ResponseCache built as the edge builds it
    (``embedder`` may be a :class:`Table` already holding every text's vector)."""
    texts = [t for p in pairs for t in (p.a, p.b)]
    table = embedder if isinstance(embedder, Table) else Table(embedder, texts)
    table.embed(texts)  # the ones it lacks
    pool = EmbedderPool(lambda: table, source="cache-eval", load_when="eager")
    await pool.start()
    check = semantic_check(settings.judge, settings.judge_path, settings.target_false_hit_rate)
    cache = ResponseCache(
        folder,
        pool,
        table.dim,
        settings.size_limit_mb << 20,
        threshold_for(settings.target_false_hit_rate),
        check=check,
    )
    outcomes = []
    try:
        for i, pair in enumerate(pairs):
            key_a, key_b = cache_key(_request(pair.a), f"eval:{i}"), cache_key(_request(pair.b), f"eval:{i}")
            assert key_a is not None and key_b is not None
            if not await cache.save(key_a, _entry(key_a.partition, key_a.query, settings.ttl_s), None):
                raise RuntimeError(f"pair {i}: the answer for a was not stored ({cache.failure})")
            hit = cache.exact(key_b)
            if hit is None:
                hit = (await cache.semantic(key_b)).hit
            if cache.failure:
                raise RuntimeError(f"pair {i}: the cache failed: {cache.failure}")
            verdict = check(pair.b, pair.a)
            va, vb = table.vectors[pair.a], table.vectors[pair.b]
            outcomes.append(
                Outcome(
                    pair=pair,
                    hit=hit.kind if hit is not None else "",
                    similarity=float(np.dot(va, vb)),
                    exact=key_a.exact == key_b.exact,
                    verified=verdict.ok,
                    reason=verdict.reason,
                )
            )
    finally:
        cache.close()
        await pool.close()
    return outcomes


def _hard(o: Outcome) -> bool:
    return not o.pair.same and o.pair.kind not in EASY_KINDS


def _rates(outcomes: Sequence[Outcome], threshold: float, verifier: bool = True) -> dict:
    positives = [o for o in outcomes if o.pair.same]
    negatives = [o for o in outcomes if not o.pair.same]
    hard = [o for o in negatives if o.pair.kind not in EASY_KINDS]
    hits = sum(o.hit_at(threshold, verifier) for o in positives)
    false_hits = sum(o.hit_at(threshold, verifier) for o in negatives)
    false_hard = sum(o.hit_at(threshold, verifier) for o in hard)
    return {
        "threshold": threshold,
        "hit_rate": hits / len(positives) if positives else 0.0,
        "hits_on_positives": hits,
        "false_hits": false_hits,
        "false_hit_rate": false_hits / len(negatives) if negatives else 0.0,
        "false_hits_on_hard": false_hard,
        "hard_false_hit_rate": false_hard / len(hard) if hard else 0.0,
    }


def calibration(
    outcomes: Sequence[Outcome], grid: Sequence[float] = CALIBRATION_GRID
) -> list[tuple[float, float]]:
    """(threshold, upper end of the 95% Wilson interval of the false-hit rate on the hard negatives, with
    the verifier on), made non-increasing in the threshold. The upper end, not the measured rate: the
    verifier's rules were written with these pairs in view, and a question it has not seen is likelier to
    slip through; a target is then met with 95% confidence on the set, not merely on average."""
    hard = [o for o in outcomes if not o.pair.same and o.pair.kind not in EASY_KINDS]
    rows = [(t, wilson(sum(o.hit_at(t) for o in hard), len(hard))[1]) for t in grid]
    out, floor = [], 0.0
    for t, rate in reversed(rows):
        floor = max(floor, rate)
        out.append((t, round(floor, 4)))
    return sorted(out)


def report(outcomes: Sequence[Outcome], settings: CacheSettings, elapsed_s: float) -> dict:
    threshold = threshold_for(settings.target_false_hit_rate)
    positives = [o for o in outcomes if o.pair.same]
    negatives = [o for o in outcomes if not o.pair.same]
    hard = [o for o in negatives if o.pair.kind not in EASY_KINDS]
    hits = sum(bool(o.hit) for o in positives)
    false_hits = sum(bool(o.hit) for o in negatives)
    false_hard = sum(bool(o.hit) for o in hard)
    kinds: dict[str, dict] = {}
    languages: dict[str, dict] = {}
    for o in outcomes:
        row = kinds.setdefault(o.pair.kind or "-", {"same": o.pair.same, "pairs": 0, "hits": 0})
        row["pairs"] += 1
        row["hits"] += bool(o.hit)
        side = "paraphrases" if o.pair.same else ("hard_negatives" if _hard(o) else "easy_negatives")
        counts = languages.setdefault(o.pair.lang, {}).setdefault(side, {"pairs": 0, "hits": 0})
        counts["pairs"] += 1
        counts["hits"] += bool(o.hit)
    return {
        "pairs": len(outcomes),
        "target_false_hit_rate": settings.target_false_hit_rate,
        "threshold": threshold,
        "judge": _judge_in_use(settings),
        "positives": len(positives),
        "hits_on_positives": hits,
        "hit_rate": hits / len(positives) if positives else 0.0,
        "hit_rate_ci95": wilson(hits, len(positives)),
        "exact_hits": sum(o.hit == "exact" for o in outcomes),
        "negatives": len(negatives),
        "false_hits": false_hits,
        "false_hit_rate": false_hits / len(negatives) if negatives else 0.0,
        "false_hit_rate_ci95": wilson(false_hits, len(negatives)),
        "hard_negatives": len(hard),
        "false_hits_on_hard": false_hard,
        "hard_false_hit_rate": false_hard / len(hard) if hard else 0.0,
        "hard_false_hit_rate_ci95": wilson(false_hard, len(hard)),
        "kinds": kinds,
        "languages": languages,
        # The lookups through the cache against the same rule applied to the kept similarity and verdict.
        "offline_disagreements": sum(bool(o.hit) != o.hit_at(threshold) for o in outcomes),
        "curve": [{"target_false_hit_rate": t, **_rates(outcomes, threshold_for(t))} for t in TARGETS],
        "cosine_only": [_rates(outcomes, t, verifier=False) for t in COSINE_ONLY],
        "cosine_and_verifier": [_rates(outcomes, t) for t in COSINE_ONLY],
        "calibration_in_use": [list(row) for row in CALIBRATION],
        "false_hit_pairs": [_pair_row(o) for o in negatives if o.hit],
        "missed_paraphrases": [_pair_row(o) for o in positives if not o.hit],
        "seconds": round(elapsed_s, 2),
    }


def _judge_in_use(settings: CacheSettings) -> str:
    """The pair judge as this run uses it: its threshold, or why it is not asked."""
    if not settings.judge:
        return "off"
    threshold = judge_threshold_for(settings.target_false_hit_rate)
    return f">= {threshold:.2f}" if threshold < NEVER else "not asked (no calibrated threshold meets it)"


def _pair_row(o: Outcome) -> dict:
    return {
        "a": o.pair.a,
        "b": o.pair.b,
        "kind": o.pair.kind,
        "similarity": round(o.similarity, 4),
        "verifier": o.reason or "ok",
    }


def evaluate(
    path: Path, settings: CacheSettings | None = None, embedder: Embedder | None = None
) -> tuple[dict, list[Outcome]]:
    """Run the file through a fresh cache; the report and each pair's outcome."""
    settings = settings or CacheSettings()
    pairs = load_pairs(path)
    started = time.perf_counter()
    if embedder is None:
        embedder = load_embedder(
            settings.embedder_path or str(embedded_model_dir()), backend=settings.embedder_backend
        )
    with tempfile.TemporaryDirectory(prefix="nearshore-cache-eval-") as folder:
        outcomes = asyncio.run(run_pairs(pairs, settings, embedder, Path(folder)))
    return report(outcomes, settings, time.perf_counter() - started), outcomes


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def format_report(r: dict) -> str:
    lo, hi = r["false_hit_rate_ci95"]
    hlo, hhi = r["hard_false_hit_rate_ci95"]
    plo, phi = r["hit_rate_ci95"]
    lines = [
        f"cache-eval: {r['pairs']} pairs (target false-hit rate {r['target_false_hit_rate']:g} -> cosine "
        f"threshold {r['threshold']:.2f}, pair judge {r['judge']}), {r['seconds']} s",
        f"  paraphrase hit rate   {_pct(r['hit_rate'])}  ({r['hits_on_positives']}/{r['positives']}, "
        f"95% CI {_pct(plo).strip()}-{_pct(phi).strip()}; {r['exact_hits']} exact)",
        f"  false-hit rate        {_pct(r['false_hit_rate'])}  ({r['false_hits']}/{r['negatives']} "
        f"negatives, 95% CI {_pct(lo).strip()}-{_pct(hi).strip()})",
        f"  on hard negatives     {_pct(r['hard_false_hit_rate'])}  ({r['false_hits_on_hard']}/"
        f"{r['hard_negatives']}, 95% CI {_pct(hlo).strip()}-{_pct(hhi).strip()})",
        "",
        "  by kind                         pairs   hits",
    ]
    for kind, row in sorted(r["kinds"].items(), key=lambda kv: (not kv[1]["same"], kv[0])):
        label = f"{kind} ({'same' if row['same'] else 'different'})"
        lines.append(f"    {label:<30}{row['pairs']:>6} {row['hits']:>6}  {_pct(row['hits'] / row['pairs'])}")
    lines += [
        "",
        "  the setting's curve: target -> threshold -> paraphrase hits, false hits (hard negatives)",
    ]
    for row in r["curve"]:
        lines.append(
            f"    target {row['target_false_hit_rate']:<6g} -> {row['threshold']:.2f}   hits "
            f"{_pct(row['hit_rate'])}   false {row['false_hits_on_hard']:>3} "
            f"({_pct(row['hard_false_hit_rate'])})"
        )
    lines += ["", "  cosine only vs cosine + verifier (hits on paraphrases, false hits on hard negatives)"]
    for alone, both in zip(r["cosine_only"], r["cosine_and_verifier"], strict=True):
        lines.append(
            f"    >= {alone['threshold']:.2f}  cosine only: {_pct(alone['hit_rate'])} hits, "
            f"{alone['false_hits_on_hard']} false   with the verifier: {_pct(both['hit_rate'])} hits, "
            f"{both['false_hits_on_hard']} false"
        )
    if r["false_hit_pairs"]:
        lines += ["", "  false hits:"]
        lines += [
            f"    {p['similarity']:.3f} [{p['kind']}] {p['a']} || {p['b']}" for p in r["false_hit_pairs"]
        ]
    if r["offline_disagreements"]:
        lines.append(f"  WARNING: {r['offline_disagreements']} lookups disagree with the offline rule")
    return "\n".join(lines)


def format_misses(r: dict) -> str:
    lines = ["  missed paraphrases (similarity, the verifier's reason):"]
    lines += [
        f"    {p['similarity']:.3f} {p['verifier']:<40.40} {p['a']} || {p['b']}"
        for p in r["missed_paraphrases"]
    ]
    return "\n".join(lines)


def compress(rows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The rows where the rate changes, and the last (the strictest threshold, for targets below all)."""
    return [row for i, row in enumerate(rows) if i in (0, len(rows) - 1) or row[1] != rows[i - 1][1]]


def format_calibration(rows: Sequence[tuple[float, float]]) -> str:
    """The table to paste into CALIBRATION (cache/response_cache.py)."""
    kept = compress(rows)
    body = "\n".join(f"    ({t:.2f}, {rate:.4f})," for t, rate in kept)
    return f"CALIBRATION: Sequence[tuple[float, float]] = (\n{body}\n)"
