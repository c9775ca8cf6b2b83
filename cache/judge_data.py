"""The pair judge's data: which pairs it is trained on, and the half of each public set kept apart.

Each public set in ``cache/data/judge/`` (JSON Lines ``{"a", "b", "label", ...}``; provenance and licences in
that folder's README) is split in two by a hash of the pair, fixed before the judge was first trained:
:func:`half` says ``train`` or ``held-out``. Only ``train`` halves are trained on; ``held-out`` halves are
only measured (``nearshore cache-eval``). The project's own dev sets (``cache/data/*.jsonl``) and the
generated negatives of their ``dev`` half are trained on whole; ``cache/data/sealed`` and the generated
``test`` half never are.

What counts as "the same question" per source: MRPC and PAWS say so (0/1); STS-B scores 0-5 are the same
from 4.2 and different up to 3.0 (between: left out); SICK pairs are the same when related 4.5 or more and
entailed, different when contradictory or related under 3.5.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
JUDGE_DATA = DATA / "judge"
HALVES = ("train", "held-out")
# Of a train half, one pair in eight is never trained on: the judge's threshold is calibrated on it.
CALIBRATION_SHARE = 8
# SICK is CC BY-NC-SA: measured (its held-out half) but never trained on, so the shipped judge carries
# no non-commercial terms from it.
MEASURED_ONLY = frozenset({"sick"})
# Pairs made from intent datasets (two utterances of one intent; the nearest of another intent in the same
# domain): how people type to an assistant, but "the same intent" is looser than "the same question", so
# they weigh less than pairs people labelled one by one.
SOURCE_WEIGHTS = {"banking77": 0.7, "clinc150": 0.7, "hwu64": 0.7}


@dataclass(frozen=True, slots=True)
class TrainingPair:
    a: str
    b: str
    label: float  # 1.0: the same question; 0.0: not
    weight: float = 1.0
    source: str = ""


def half(a: str, b: str) -> str:
    """``train``, ``calibrate`` (an eighth of the train half) or ``held-out``, by a hash of the pair
    (either order gives the same)."""
    key = "\x1f".join(sorted(unicodedata.normalize("NFC", t).casefold().strip() for t in (a, b)))
    digest = hashlib.sha256(key.encode()).digest()
    if digest[0] & 1:
        return "held-out"
    return "calibrate" if digest[1] % CALIBRATION_SHARE == 0 else "train"


def read_rows(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def label_of(row: dict) -> float | None:
    """1.0, 0.0, or None for a pair its source leaves in between."""
    source = row.get("source", "")
    value = float(row["label"])
    if source == "stsb":
        return 1.0 if value >= 4.2 else 0.0 if value <= 3.0 else None
    if source == "sick":
        entailment = row.get("entailment", "")
        if value >= 4.5 and entailment == "ENTAILMENT":
            return 1.0
        return 0.0 if entailment == "CONTRADICTION" or value < 3.5 else None
    return 1.0 if value >= 0.5 else 0.0


def public_pairs(folder: Path, wanted_half: str) -> list[TrainingPair]:
    """The labelled pairs of every public set in ``folder`` that fall in ``wanted_half`` (for ``train``,
    none of a set measured only)."""
    out = []
    for path in sorted(folder.glob("*.jsonl*")):
        for row in read_rows(path):
            if wanted_half == "train" and row.get("source") in MEASURED_ONLY:
                continue
            label = label_of(row)
            if label is None or half(row["a"], row["b"]) != wanted_half:
                continue
            source = row.get("source", path.stem)
            out.append(TrainingPair(row["a"], row["b"], label, SOURCE_WEIGHTS.get(source, 1.0), source))
    return out


def held_out_sets(folder: Path = JUDGE_DATA, limit: int = 1000) -> dict[str, list[dict]]:
    """Each public source's held-out half, as cache-eval's labelled pairs (``{"a", "b", "same", "kind"}``):
    at most ``limit`` a source, the first by their hash (so a run is quick and always the same pairs). A
    pair its source calls barely related (STS-B under 2, SICK under 2.5) is of kind ``unrelated``: an easy
    negative, not counted among the hard ones."""
    out: dict[str, list[tuple[bytes, dict]]] = {}
    for path in sorted(folder.glob("*.jsonl*")):
        for row in read_rows(path):
            label = label_of(row)
            if label is None or half(row["a"], row["b"]) != "held-out":
                continue
            source = row.get("source", path.stem)
            score = float(row["label"])
            unrelated = (source == "stsb" and score < 2.0) or (source == "sick" and score < 2.5)
            kind = "unrelated" if unrelated else f"{source}-{'same' if label else 'different'}"
            digest = hashlib.sha256(f"{row['a']}\x1f{row['b']}".encode()).digest()
            out.setdefault(source, []).append(
                (digest, {"a": row["a"], "b": row["b"], "same": bool(label), "kind": kind})
            )
    return {source: [p for _, p in sorted(rows, key=lambda r: r[0])[:limit]] for source, rows in out.items()}
