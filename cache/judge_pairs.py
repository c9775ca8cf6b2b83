"""Make the pair judge's question pairs from intent datasets (banking77, CLINC150, HWU64).

    .venv/bin/python -m cache.judge_pairs --repo banking77=GIT_DIR --repo clinc150=GIT_DIR \\
        --repo hwu64=GIT_DIR [--out cache/data/judge]

Intent datasets label single utterances, not pairs, yet they are how people type to a bank's or an
assistant's chat, so pairs are made from them mechanically. Two utterances of one intent are the same
question (label 1) only under filters, because "the same intent" is looser than "the same question": the
intent's answer must not depend on a value in the question, both must carry the same numbers, currency words,
names and intent-rare words, and no contrast word (next/last, visa/checking, on/off...) may be on one side
only. A hard negative (label 0) is, for one utterance, one of its nearest neighbours by IDF-weighted word
overlap among the utterances of the same domain with another intent: close in words, different in meaning.

Every choice is ordered by SHA-256 of the source's ids (no random generator, no set order), so the files
(``{name}.jsonl.gz``, gzip without a timestamp) come out byte for byte the same from the same commits. Each
GIT_DIR is the git directory of a clone of the source's repository (:mod:`cache.judge_pairs_sources`
pins the commits and reads the files).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cache.judge_pairs_sources import SOURCES, IntentSource, PairRules, Utterance


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


MAX_ROWS = 20000  # per file; none reaches it
# A content word in fewer than this share of its intent's utterances stands in for a slot value (a bank's
# or a city's name), so both sides of a positive must have the same ones.
RARE_WORD_SHARE = 0.05
MIN_RARE_THRESHOLD = 2  # in a small intent, a word of a single utterance still counts as rare
PARTNERS_TRIED = 200  # per utterance, in hash order, before it gives up finding a positive partner
# Words in more than this share of a domain's utterances (or MIN_COMMON_COUNT) do not make neighbours.
COMMON_WORD_SHARE = 0.06
MIN_COMMON_COUNT = 50
NEIGHBOURS_SCORED = 60  # of the most shared weight, the ones whose overlap is computed
NEGATIVE_CHOICES = 3  # one of the nearest few, so negatives are not all the single closest
# Below the lower bound a negative is too easy to teach anything; at the upper bound a pair of another
# intent is more likely label noise than a negative.
MIN_NEGATIVE_OVERLAP = 0.15
MAX_NEGATIVE_OVERLAP = 0.9
NEGATIVES_PER_POSITIVE = 1.25

STOP_WORDS = _word_set(
    """a an the i me my mine we our you your he she it its they them their is are was were be been being am do
    does did doing have has had having to of in on at for from by with about as into over under and or but
    if so than then that this these those there here what which who whom whose when where why how can could
    would should will shall may might must please pls just also too very really ok okay hey hi hello any
    some all get got"""
)
# Fillers carry no slot value, so they are never counted as intent-rare words.
FILLER_WORDS = _word_set(
    """want wanna need know tell show let help like love wondering wonder curious find check look see give
    trying try going gonna able possible anyway still yet again now today right thanks thank explain way
    something anything someone anyone thing things sure much many one also else bit lot kind sort already"""
)
# Present in one question but not the other, these usually make them different questions.
CONTRAST_WORDS = _word_set(
    """next last previous first second third latest earlier later yesterday today tomorrow tonight morning
    afternoon evening night week weekend month year monday tuesday wednesday thursday friday saturday sunday
    visa mastercard amex chase discover checking savings credit debit business personal joint list lists
    item items song songs album playlist artist podcast radio kitchen bedroom bathroom living room office
    garage red blue green yellow white orange purple pink all every each new old virtual physical disposable
    spare cash cheque check card transfer top bank apple google pin passcode password phone email address
    name number change reset cancel add remove delete set update activate block unblock freeze unfreeze
    increase decrease lower raise up down on off"""
)
CURRENCY_WORDS = _word_set(
    """usd eur gbp euro euros dollar dollars pound pounds sterling yen yuan rupee rupees franc francs peso
    pesos krona kroner crypto bitcoin chf aud cad jpy"""
)
FIRST_PERSON = frozenset({"I", "I'm", "I've", "I'd", "I'll"})  # capitalised, but not a name
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_CASED_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_SPACE = re.compile(r"\s+")


def stable_hash(*parts: object) -> str:
    """The sort key of every choice: the same on every run and machine, unlike Python's ``hash``."""
    return hashlib.sha256("\x1f".join(str(part) for part in parts).encode("utf-8")).hexdigest()


def collapse_space(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def content_words(text: str) -> frozenset[str]:
    return frozenset(token for token in tokens(text) if token not in STOP_WORDS)


def slot_signature(text: str) -> frozenset[str]:
    """Numbers, currency words and names (capitalised words not at the start): values that usually change
    what is asked, so two questions are the same only when these agree."""
    signature = {
        token for token in tokens(text) if token in CURRENCY_WORDS or any(c.isdigit() for c in token)
    }
    for position, word in enumerate(_CASED_WORD.findall(text)):
        is_name = position > 0 and word[0].isupper() and not word.isupper() and word not in FIRST_PERSON
        is_currency_code = word.isupper() and word.lower() in CURRENCY_WORDS  # "USD", also in "100USD"
        if is_name or is_currency_code:
            signature.add(word.lower())
    return frozenset(signature)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An utterance with the words the filters compare."""

    utterance: Utterance
    words: frozenset[str]  # content words
    signature: frozenset[str]
    rare_words: frozenset[str]  # content words rare within the intent


def unique_utterances(utterances: Sequence[Utterance]) -> list[Utterance]:
    """Space collapsed, one utterance per text (case aside), the first kept; a text found under two
    intents is dropped, as neither label can be trusted."""
    by_text: dict[str, Utterance] = {}
    ambiguous = set()
    for utterance in utterances:
        text = collapse_space(utterance.text)
        if not text:
            continue
        key = text.lower()
        if key in by_text and by_text[key].intent != utterance.intent:
            ambiguous.add(key)
        by_text.setdefault(key, replace(utterance, text=text))
    return [utterance for key, utterance in by_text.items() if key not in ambiguous]


def prepare(utterances: Sequence[Utterance]) -> list[Candidate]:
    """The utterances as candidates, in the same order (which breaks ties between equal neighbours)."""
    words_of = [content_words(utterance.text) for utterance in utterances]
    word_counts: dict[str, Counter[str]] = defaultdict(Counter)  # per intent: utterances holding a word
    sizes = Counter(utterance.intent for utterance in utterances)
    for utterance, words in zip(utterances, words_of, strict=True):
        word_counts[utterance.intent].update(words)
    candidates = []
    for utterance, words in zip(utterances, words_of, strict=True):
        counts = word_counts[utterance.intent]
        rare_below = max(MIN_RARE_THRESHOLD, RARE_WORD_SHARE * sizes[utterance.intent])
        rare_words = frozenset(
            word for word in words if counts[word] < rare_below and word not in FILLER_WORDS
        )
        candidates.append(Candidate(utterance, words, slot_signature(utterance.text), rare_words))
    return candidates


def grouped(candidates: Sequence[Candidate], by: str) -> dict[str, list[Candidate]]:
    """Candidates by their utterance's ``intent`` or ``domain``, each group in the candidates' order."""
    groups: dict[str, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        groups[getattr(candidate.utterance, by)].append(candidate)
    return groups


def may_be_same(a: Candidate, b: Candidate, same_entities: bool = False) -> bool:
    """Two utterances of one intent count as the same question only when nothing tells them apart."""
    if a.signature != b.signature or a.rare_words != b.rare_words:
        return False
    if same_entities and a.utterance.entities != b.utterance.entities:
        return False
    if (a.words ^ b.words) & CONTRAST_WORDS:
        return False
    return bool(a.words & b.words)  # at least one content word in common


def choose_positives(
    name: str, candidates: Sequence[Candidate], rules: PairRules
) -> list[tuple[Candidate, Candidate]]:
    """Up to an even share per intent; partners in hash order, so many positives share few words."""
    by_intent = grouped(candidates, "intent")
    intents = sorted(intent for intent in by_intent if intent not in rules.never_same)
    per_intent = math.ceil(rules.max_positives / max(1, len(intents)))
    positives = []
    seen = set()
    for intent in intents:
        members = sorted(by_intent[intent], key=lambda c: stable_hash(name, "posq", c.utterance.id))
        found = 0
        for a in members:
            if found >= per_intent:
                break
            partners = sorted(
                members, key=lambda c: stable_hash(name, "posp", a.utterance.id, c.utterance.id)
            )
            for b in partners[:PARTNERS_TRIED]:
                key = tuple(sorted((a.utterance.id, b.utterance.id)))
                if b is a or key in seen or not may_be_same(a, b, rules.same_entities):
                    continue
                seen.add(key)
                positives.append((a, b))
                found += 1
                break
    return positives


class DomainIndex:
    """One domain's utterances for nearest-neighbour search: IDF-weighted Jaccard over content words, the
    candidates found through an inverted index of the words that are not too common."""

    def __init__(self, members: Sequence[Candidate]) -> None:
        self.members = members
        word_counts = Counter(word for member in members for word in member.words)
        self.idf = {word: math.log((len(members) + 1) / (n + 0.5)) for word, n in word_counts.items()}
        common_above = max(MIN_COMMON_COUNT, COMMON_WORD_SHARE * len(members))
        self.indexed = frozenset(word for word, n in word_counts.items() if n <= common_above)
        self.holders: dict[str, list[int]] = defaultdict(list)  # word -> indices of the members holding it
        for index, member in enumerate(members):
            for word in member.words & self.indexed:
                self.holders[word].append(index)
        # Sums run over sorted words so that float rounding, hence the ranking, never depends on set order.
        self.weights = [self._weight(member.words) for member in members]

    def _weight(self, words: frozenset[str]) -> float:
        return sum(self.idf[word] for word in sorted(words))

    def nearest_other_intents(
        self, i: int, confusable: frozenset[tuple[str, str]]
    ) -> list[tuple[float, int]]:
        """(overlap, index) of the members nearest to member ``i`` with another, non-confusable intent,
        nearest first."""
        a = self.members[i]
        shared_weight: dict[int, float] = defaultdict(float)
        for word in sorted(a.words & self.indexed):
            for j in self.holders[word]:
                shared_weight[j] += self.idf[word]
        ranked = sorted(shared_weight.items(), key=lambda item: (-round(item[1], 9), item[0]))
        nearest = []
        for j, _ in ranked[:NEIGHBOURS_SCORED]:
            b = self.members[j]
            intents = (a.utterance.intent, b.utterance.intent)
            if intents[0] == intents[1] or intents in confusable:
                continue
            if a.words == b.words:
                continue  # the same content words under another intent: more likely label noise
            shared = self._weight(a.words & b.words)
            overlap = shared / (self.weights[i] + self.weights[j] - shared + 1e-9)  # never divides by zero
            nearest.append((overlap, j))
        return sorted(nearest, key=lambda item: (-round(item[0], 9), item[1]))


def domain_negatives(
    name: str, members: Sequence[Candidate], quota: int, confusable: frozenset[tuple[str, str]]
) -> list[tuple[Candidate, Candidate]]:
    """Up to ``quota`` hard negatives within one domain: for each utterance in hash order, one of its few
    nearest of another intent, picked by hash."""
    index = DomainIndex(members)
    negatives = []
    seen = set()
    for i in sorted(range(len(members)), key=lambda i: stable_hash(name, "negq", members[i].utterance.id)):
        if len(negatives) >= quota:
            break
        a = members[i]
        nearest = index.nearest_other_intents(i, confusable)
        choices = [j for overlap, j in nearest if MIN_NEGATIVE_OVERLAP <= overlap < MAX_NEGATIVE_OVERLAP]
        choices = sorted(
            choices[:NEGATIVE_CHOICES],
            key=lambda j: stable_hash(name, "negp", a.utterance.id, members[j].utterance.id),
        )
        for j in choices:
            key = tuple(sorted((a.utterance.id, members[j].utterance.id)))
            if key not in seen:
                seen.add(key)
                negatives.append((a, members[j]))
                break
    return negatives


def choose_negatives(
    name: str, candidates: Sequence[Candidate], rules: PairRules, num_positives: int
) -> list[tuple[Candidate, Candidate]]:
    """Hard negatives from every domain, each domain's quota in proportion to its size, about
    ``NEGATIVES_PER_POSITIVE`` per positive in all."""
    confusable = frozenset(rules.confusable) | frozenset((b, a) for a, b in rules.confusable)
    wanted = min(rules.max_negatives, NEGATIVES_PER_POSITIVE * num_positives)
    negatives = []
    for _, members in sorted(grouped(candidates, "domain").items()):
        quota = math.ceil(wanted * len(members) / len(candidates))
        negatives += domain_negatives(name, members, quota, confusable)
    return negatives


def pair_row(name: str, a: Candidate, b: Candidate, label: int) -> dict:
    either = len(a.words | b.words) or 1
    return {
        "a": a.utterance.text,
        "b": b.utterance.text,
        "label": label,
        "source": name,
        "intent_a": a.utterance.intent,
        "intent_b": b.utterance.intent,
        "domain": a.utterance.domain,
        "id_a": a.utterance.id,
        "id_b": b.utterance.id,
        "word_jaccard": round(len(a.words & b.words) / either, 3),
    }


def make_pairs(name: str, utterances: Sequence[Utterance], rules: PairRules) -> list[dict]:
    """Positives (label 1) then hard negatives (label 0) as rows, before :func:`finalize`."""
    candidates = prepare(unique_utterances(utterances))
    positives = choose_positives(name, candidates, rules)
    negatives = choose_negatives(name, candidates, rules, len(positives))
    return [pair_row(name, a, b, 1) for a, b in positives] + [pair_row(name, a, b, 0) for a, b in negatives]


def finalize(name: str, rows: Sequence[dict]) -> list[dict]:
    """Drop empty and self pairs and repeats (either order, case aside), cap at ``MAX_ROWS`` and shuffle by
    hash, so a file never lists one source's intents or labels in runs."""
    kept = []
    seen = set()
    for row in rows:
        row = {**row, "a": collapse_space(row["a"]), "b": collapse_space(row["b"])}
        key = tuple(sorted((row["a"].lower(), row["b"].lower())))
        if not row["a"] or not row["b"] or key[0] == key[1] or key in seen:
            continue
        seen.add(key)
        kept.append(row)
    if len(kept) > MAX_ROWS:
        kept = sorted(kept, key=lambda row: stable_hash(name, "sample", row["a"], row["b"]))[:MAX_ROWS]
    return sorted(kept, key=lambda row: stable_hash(name, "order", row["a"], row["b"]))


def jsonl_gz(rows: Sequence[dict]) -> bytes:
    """JSON Lines, gzipped without a timestamp so that the same rows give the same bytes."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return gzip.compress(text.encode("utf-8"), mtime=0)


def build(source: IntentSource, git_dir: Path) -> list[dict]:
    utterances = source.read(source.tree(git_dir))
    if not utterances:  # a path moved in the clone would otherwise give an empty file
        raise RuntimeError(f"{source.name}: no utterances read from {git_dir}")
    return finalize(source.name, make_pairs(source.name, utterances, source.rules))


def parse_repo(value: str) -> tuple[str, Path]:
    name, sep, git_dir = value.partition("=")
    if not sep or name not in SOURCES:
        raise argparse.ArgumentTypeError(f"expected NAME=GIT_DIR with NAME one of {', '.join(SOURCES)}")
    return name, Path(git_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo",
        type=parse_repo,
        action="append",
        required=True,
        metavar="NAME=GIT_DIR",
        help="a source and the git directory of a clone of its repository (repeat per source)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data" / "judge")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, git_dir in args.repo:
        try:
            rows = build(SOURCES[name], git_dir)
        except RuntimeError as error:
            parser.exit(1, f"{error}\n")
        path = args.out / f"{name}.jsonl.gz"
        path.write_bytes(jsonl_gz(rows))
        num_positives = sum(row["label"] for row in rows)
        print(
            f"{name}: {len(rows)} rows, {num_positives} same, {len(rows) - num_positives} different -> {path}"
        )


if __name__ == "__main__":
    main()
