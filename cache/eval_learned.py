"""``nearshore cache-eval --learned``: would a learned model add paraphrase hits at the same precision?

No cross-encoder or NLI model installs offline from PyPI (the packages that name one fetch its weights
from a model hub at run time), so the learned model that can be had here is the embedder the cache
already ships (all-MiniLM-L6-v2), asked a narrower question than the whole sentence: when the verifier
refuses a pair only because of words on each side that nothing explains (``words: X vs Y``, no number,
negation or order in it), are X and Y the same thing? The words are embedded alone and a pair whose
words are at least ``t`` alike is let through. ``t`` is fitted on the dev sets: the lowest that lets none
of their hard negatives through; the paraphrases it adds and the negatives it lets through are then
counted on the sets never tuned on. A model that adds recall there without a false hit would be worth
shipping; one that adds false hits is not (the measurement, and why the rule ships alone, are in the
report).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache.embedder import Embedder
from cache.evaluate import EASY_KINDS, Pair
from cache.verify import verify
from cache.verify_read import canon

MAX_WORDS = 3  # a substitution of at most this many words a side is a candidate for the model


@dataclass(frozen=True, slots=True)
class Candidate:
    pair: Pair
    role: str
    similarity: float  # of the substituted words, embedded alone


def substitution(a: str, b: str) -> tuple[str, str] | None:
    """The words only one side has, on each side, when the verifier refused for them alone."""
    verdict = verify(b, a)
    if verdict.ok or not verdict.reason.startswith("words:") or " vs " not in verdict.reason:
        return None
    ca, cb = canon(a), canon(b)
    keys_a, keys_b = ca.keys(), cb.keys()
    only_a = [t.surface for t in ca.tokens if keys_a[t.key] > keys_b[t.key]]
    only_b = [t.surface for t in cb.tokens if keys_b[t.key] > keys_a[t.key]]
    if not only_a or not only_b or len(only_a) > MAX_WORDS or len(only_b) > MAX_WORDS:
        return None
    return " ".join(only_a), " ".join(only_b)


def candidates(sets: dict[str, tuple[list[Pair], str]], embedder: Embedder) -> list[Candidate]:
    found: list[tuple[Pair, str, str, str]] = []
    for pairs, role in sets.values():
        for p in pairs:
            if not p.same and p.kind in EASY_KINDS:
                continue
            words = substitution(p.a, p.b)
            if words is not None:
                found.append((p, role, *words))
    if not found:
        return []
    texts = list(dict.fromkeys(t for _, _, x, y in found for t in (x, y)))
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    return [Candidate(p, role, float(np.dot(vectors[x], vectors[y]))) for p, role, x, y in found]


def report(found: Sequence[Candidate]) -> dict:
    dev_negatives = [c.similarity for c in found if c.role == "dev" and not c.pair.same]
    t = min(1.0, max(dev_negatives) + 1e-6) if dev_negatives else 0.0
    out: dict = {"fitted_threshold": round(t, 4), "roles": {}, "curve": []}
    for at in (0.5, 0.6, 0.7, 0.8, 0.9):  # what a laxer model would buy, and cost
        row: dict = {"threshold": at}
        for role in ("dev", "test", "sealed"):
            mine = [c for c in found if c.role == role and c.similarity >= at]
            row[role] = {
                "paraphrases": sum(c.pair.same for c in mine),
                "false_hits": sum(not c.pair.same for c in mine),
            }
        out["curve"].append(row)
    for role in ("dev", "test", "sealed"):
        mine = [c for c in found if c.role == role]
        out["roles"][role] = {
            "refused_paraphrases_seen": sum(c.pair.same for c in mine),
            "paraphrases_added": sum(c.pair.same and c.similarity >= t for c in mine),
            "negatives_seen": sum(not c.pair.same for c in mine),
            "false_hits_added": sum(not c.pair.same and c.similarity >= t for c in mine),
        }
    return out


def format_learned(r: dict) -> str:
    lines = [
        "cache-eval --learned: the embedder as a judge of the words the verifier cannot explain "
        f"(threshold fitted on dev: {r['fitted_threshold']})"
    ]
    for role, c in r["roles"].items():
        lines.append(
            f"  {role:<6} paraphrases added {c['paraphrases_added']}/{c['refused_paraphrases_seen']} "
            f"(refused for words alone); false hits added {c['false_hits_added']}/{c['negatives_seen']}"
        )
    lines.append("  a laxer threshold (paraphrases added / false hits added, by role):")
    for row in r["curve"]:
        cells = [
            f"{role} {row[role]['paraphrases']}/{row[role]['false_hits']}"
            for role in ("dev", "test", "sealed")
        ]
        lines.append(f"    >= {row['threshold']:.1f}  " + "  ".join(cells))
    return "\n".join(lines)
