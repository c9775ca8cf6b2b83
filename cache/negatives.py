"""Hard negatives made mechanically from paraphrase pairs, and the fixed split they are measured on.

A labelled set written by the people who tune the verifier measures only what they thought of. Here every
paraphrase pair ``(a, b)`` (same question) is turned into negatives ``(a, t(b))`` (and ``(b, t(a))``) by
transformations ``t`` that change what is asked while keeping the sentence alike: an argument swap, a word
replaced by its opposite or by another of its kind, a qualifier added, a quantifier, modal, tense, number or
ordinal changed, a negation put in, the asker replaced by someone else. The word tables are this module's
own (:mod:`cache.negatives_words`), never the verifier's.

The split is fixed by the seed pair's text (a hash, not a choice): ``dev`` pairs may be looked at while the
verifier is tuned, ``test`` pairs are only measured. Every negative of a seed falls in the seed's half, so a
phrasing seen in ``dev`` never reappears, transformed, in ``test``. The generation is deterministic (its
random choices are seeded by the seed pair), so a run of cache-eval reproduces the same pairs.
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cache import negatives_words as w

SPLITS = ("dev", "test")
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*", re.UNICODE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_TAIL = re.compile(r"\s*([?.!]*)\s*$")


@dataclass(frozen=True, slots=True)
class Seed:
    a: str
    b: str
    lang: str = "en"


@dataclass(frozen=True, slots=True)
class Negative:
    a: str
    b: str
    kind: str  # "gen-<transformation>"
    lang: str
    split: str  # "dev" | "test"
    changed: tuple[str, ...]  # the words the transformation put in or took out (lowercased)
    seed: int  # which seed pair it came from

    def as_pair(self) -> dict:
        return {"a": self.a, "b": self.b, "same": False, "kind": self.kind, "lang": self.lang}


def split_of(text: str) -> str:
    """``dev`` or ``test``: half the seeds each, by a hash of the seed's first question."""
    key = unicodedata.normalize("NFC", text).casefold().strip()
    return SPLITS[hashlib.blake2b(key.encode(), digest_size=8).digest()[0] & 1]


# --- text surgery ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Word:
    start: int
    end: int
    text: str

    @property
    def lower(self) -> str:
        return self.text.casefold()


def _words(text: str) -> list[_Word]:
    return [_Word(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]


def _cased(new: str, old: str) -> str:
    if old.isupper() and len(old) > 1:
        return new.upper()
    if old[:1].isupper():
        return new[:1].upper() + new[1:]
    return new


def _replace(text: str, word: _Word, new: str) -> str:
    return text[: word.start] + _cased(new, word.text) + text[word.end :]


def _before_tail(text: str, addition: str) -> str:
    """``addition`` put before the question's closing punctuation."""
    match = _TAIL.search(text)
    assert match is not None
    return f"{text[: match.start()]} {addition}{match.group(1)}"


Result = tuple[str, tuple[str, ...]] | None
Transform = Callable[[str, str, random.Random], Result]


def _swap_word(text: str, table: dict[str, str]) -> Result:
    for word in _words(text):
        other = table.get(word.lower)
        if other is not None:
            return _replace(text, word, other), (word.lower, other)
    return None


def antonym(text: str, lang: str, rng: random.Random) -> Result:
    return _swap_word(text, w.ANTONYMS[lang])


def superlative(text: str, lang: str, rng: random.Random) -> Result:
    return _swap_word(text, w.SUPERLATIVES[lang])


def _from_group(text: str, groups: Sequence[Sequence[str]], rng: random.Random) -> Result:
    for word in _words(text):
        for group in groups:
            if word.lower in group:
                other = rng.choice([g for g in group if g != word.lower])
                return _replace(text, word, other), (word.lower, other)
    return None


def sibling(text: str, lang: str, rng: random.Random) -> Result:
    return _from_group(text, w.SIBLINGS[lang], rng)


def quantifier(text: str, lang: str, rng: random.Random) -> Result:
    return _from_group(text, w.QUANTIFIERS[lang], rng)


def ordinal(text: str, lang: str, rng: random.Random) -> Result:
    """Another ordinal, or an ordinal put before a superlative (the largest -> the second largest)."""
    found = _from_group(text, w.ORDINALS[lang], rng)
    if found is not None:
        return found
    for word in _words(text):
        if word.lower in w.SUPERLATIVES[lang]:
            extra = w.ORDINAL_BEFORE[lang]
            return text[: word.start] + extra + " " + text[word.start :], (extra,)
    return None


def qualifier(text: str, lang: str, rng: random.Random) -> Result:
    phrase = rng.choice(w.QUALIFIERS[lang])
    if phrase.casefold() in text.casefold():
        return None
    return _before_tail(text, phrase), tuple(phrase.casefold().split())


def number(text: str, lang: str, rng: random.Random) -> Result:
    """A number (digits, or a number word) replaced by another."""
    match = _NUMBER.search(text)
    if match is None:
        return _from_group(text, [w.NUMBER_WORDS[lang]], rng)
    old = match.group()
    digits = old.replace(",", "")
    try:
        value = float(digits)
    except ValueError:
        return None
    new_value = value * 10 if value >= 20 else value + rng.choice((1, 2, 3))
    new = f"{new_value:g}" if "." in digits else str(int(new_value))
    return text[: match.start()] + new + text[match.end() :], (old, new)


def modal(text: str, lang: str, rng: random.Random) -> Result:
    """The question's first word, when it is a modal, replaced by one that asks another thing."""
    words = _words(text)
    table = w.MODALS[lang]
    for word in words[:2] if lang != "en" else words[:1]:
        if word.lower in table:
            return _replace(text, word, table[word.lower]), (word.lower, table[word.lower])
    return None


def tense(text: str, lang: str, rng: random.Random) -> Result:
    words = _words(text)
    table = w.TENSES[lang]
    for word in words[:3]:
        if word.lower in table:
            return _replace(text, word, table[word.lower]), (word.lower, table[word.lower])
    return None


def negation(text: str, lang: str, rng: random.Random) -> Result:
    words = _words(text)
    if lang == "fr":
        for word in words:
            if word.lower in w.FRENCH_NEGATIONS:
                return _replace(text, word, w.FRENCH_NEGATIONS[word.lower]), ("ne", "pas")
        return None
    marker = "not" if lang == "en" else "no"
    for i, word in enumerate(words[:-1]):
        if word.lower in w.NEGATE_AFTER[lang] and words[i + 1].lower not in ("not", "no", "never"):
            if lang == "en":
                # "Is it safe" -> "Is it not safe": after the subject when one follows the auxiliary.
                nxt = words[i + 1]
                at = nxt if nxt.lower in ("i", "it", "you", "we", "they", "he", "she", "people") else word
                return text[: at.end] + f" {marker}" + text[at.end :], (marker,)
            return text[: word.start] + f"{marker} " + text[word.start :], (marker,)
    return None


def person(text: str, lang: str, rng: random.Random) -> Result:
    """The asker ("I") replaced by someone else, when "I" follows the question's auxiliary."""
    words = _words(text)
    subject = {"en": "i", "pcm": "i", "fr": "je"}[lang]
    for i, word in enumerate(words[1:], 1):
        if word.lower == subject and (lang == "fr" or words[i - 1].lower in w.NEGATE_AFTER["en"] | {"fit"}):
            other = rng.choice(w.PERSONS[lang])
            new = text[: word.start] + other + text[word.end :]
            if lang == "en" and words[i - 1].lower == "do":
                aux = words[i - 1]
                new = new[: aux.start] + _cased("does", aux.text) + new[aux.end :]
            return new, tuple(other.split())
    return None


def swap(text: str, lang: str, rng: random.Random) -> Result:
    """Two nouns of the question exchanged, when nothing between them makes the order free."""
    words = _words(text)
    nouns = [i for i, word in enumerate(words) if word.lower in w.NOUNS]
    for x in range(len(nouns)):
        for y in range(x + 1, len(nouns)):
            i, j = nouns[x], nouns[y]
            first, second = words[i], words[j]
            between = {word.lower for word in words[max(0, i - 1) : j + 1]}
            if first.lower == second.lower or between & w.SWAP_JOINERS:
                continue
            if between & {"from", "to", "into", "than"}:
                continue  # a from/to or than swap is caught by its markers: not what this measures
            out = (
                text[: first.start]
                + _cased(second.lower, first.text)
                + text[first.end : second.start]
                + _cased(first.lower, second.text)
                + text[second.end :]
            )
            return out, (first.lower, second.lower)
    return None


TRANSFORMS: dict[str, Transform] = {
    "swap": swap,
    "antonym": antonym,
    "sibling": sibling,
    "qualifier": qualifier,
    "quantifier": quantifier,
    "modal": modal,
    "tense": tense,
    "number": number,
    "negation": negation,
    "superlative": superlative,
    "ordinal": ordinal,
    "person": person,
}


def generate(seeds: Iterable[Seed], transforms: dict[str, Transform] = TRANSFORMS) -> list[Negative]:
    """Every transformation that applies, to each side of each seed pair, against the other side."""
    out: list[Negative] = []
    seen: set[tuple[str, str]] = set()
    for index, seed in enumerate(seeds):
        split = split_of(seed.a)
        rng = random.Random(hashlib.blake2b(seed.a.encode(), digest_size=8).digest())
        for name, transform in transforms.items():
            for source, target in ((seed.b, seed.a), (seed.a, seed.b)):
                found = transform(source, seed.lang, rng)
                if found is None:
                    continue
                text, changed = found
                key = (target.casefold(), text.casefold())
                if text == source or key in seen:
                    continue
                seen.add(key)
                out.append(Negative(target, text, f"gen-{name}", seed.lang, split, changed, index))
    return out
