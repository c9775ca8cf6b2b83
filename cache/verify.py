"""The verifier: a semantic hit must say the same thing, not merely sound alike.

Sentence embeddings put "Is it safe to drink tap water in London?" and "... unsafe ..." at cosine 0.99,
Celsius->Fahrenheit beside Fahrenheit->Celsius, 100 dollars beside 1000. So after the similarity threshold a
candidate must pass cheap structural checks, each of which names why it failed:

language  the same language (script, then the common words of a few languages, English on a tie)
numbers   the same numbers (digits, number words, ordinals, 10k / 1.5m, 50kg), in the same order
negation  the same negation cues, one form for all of not / n't / cannot / no (and stop / avoid, which
          negate what follows); no word that is the other's with a negating prefix (safe / unsafe,
          venomous / non-venomous); no pair of opposites, one on each side (good / bad, enable / disable)
entities  the same capitalised names and acronyms (London / Paris, USD / EUR), casefolded
units     the same units of measure and currencies, in the same order (Celsius -> Fahrenheit)
direction no pair of opposite directions or comparisons, one on each side (buy / sell, before / after,
          largest / smallest); nothing that is "from X" on one side and "to X" on the other; the same
          target of "than" / "vs"
dates     the same years, months, weekdays, seasons, parts of the day and relative days (today, next)

The checks compare opposites only when each side has its own half of a pair: a word present on one side
alone ("set up Python" beside "install Python") is left to the similarity threshold. A check compares small
sets extracted once per text (``facts`` is cached): microseconds, so it runs on every candidate.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from cache.verify_words import (
    DATE_WORDS,
    DETERMINERS,
    DIRECTION_PAIRS,
    FILLER,
    KINDS,
    LANGUAGE_WORDS,
    NEGATING_PREFIXES,
    NEGATION_CUES,
    NEGATION_PAIRS,
    NUMBER_WORDS,
    ONE_SIDED_DOWNWARDS,
    PHRASES,
    SCALE,
    UNITS,
    ordinal,
)

# Words (hyphens and apostrophes inside a word kept), and currency / percent signs as words of their own.
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*|[$€£¥₦%°]", re.UNICODE)
# A number and its scale (10k, 1.5m, 2bn, 10 thousand) or percent; an ordinal (2nd) is read as a word.
_NUMBER = re.compile(
    r"(?<![\w.])((?>\d+(?:[.,]\d+)*))(?!(?:st|nd|rd|th)\b)"
    r"(?:\s*(k|m|mn|b|bn|thousand|million|billion)\b|\s*(%))?",
    re.IGNORECASE,
)
# Letters stuck to a number that are neither a scale nor an ordinal suffix are a unit: 50kg, 10-day -> 50 kg,
# 10 day.
_ATTACHED = re.compile(r"(?<=\d)-?(?=[a-zA-Z])(?!(?:st|nd|rd|th|k|m|mn|b|bn)\b)", re.IGNORECASE)
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
# An arithmetic sign before a number ("5 + 3", "-5 degrees", "3/4", "5 x 4"): part of what is asked.
_OPERATOR = re.compile(r"(?:(?<=\d)|(?<=\d )|(?<=^)|(?<= ))([-+*/×÷^=<>]|x(?= ))(?= ?\d)")
_POSSESSIVE = re.compile(r"['’]s$", re.IGNORECASE)  # Africa's: Africa (what's: what)
_GREETING = re.compile(r"\bgood (morning|afternoon|evening|night|day)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Facts:
    """What one text asserts, in the forms the checks compare."""

    numbers: tuple[str, ...]
    negations: frozenset[str]
    words: frozenset[str]
    entities: frozenset[str]
    entity_order: tuple[str, ...]  # the entities in the order they first appear
    units: tuple[str, ...]
    sources: frozenset[str]  # what follows "from"
    targets: frozenset[str]  # what follows "to" / "into" / "towards"
    compared: tuple[str, ...]  # what follows "than" / "vs" / "versus"
    dates: frozenset[str]
    language: str


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""  # which check failed, e.g. "numbers: 100 vs 1000"


def _tokens(text: str) -> tuple[list[str], list[str]]:
    """The words as written (hyphens dropped: M-Pesa is mpesa) and lowercased, phrases joined
    (turn on -> turn_on), ordinals kept whole (2nd) and units split from their numbers (50kg -> 50 kg)."""
    text = _GREETING.sub(" ", text)  # "Good morning!" greets; it does not ask about the morning
    tokens = [_POSSESSIVE.sub("", t.replace("-", "")) for t in _WORD.findall(text)]
    lower = [t.lower().replace("’", "'") for t in tokens]
    joined, out_tokens, i = [], [], 0
    while i < len(lower):
        pair = f"{lower[i]} {lower[i + 1]}" if i + 1 < len(lower) else ""
        if pair in PHRASES:
            joined.append(PHRASES[pair])
            out_tokens.append(PHRASES[pair])
            i += 2
            continue
        joined.append(lower[i])
        out_tokens.append(tokens[i])
        i += 1
    return out_tokens, joined


@lru_cache(maxsize=65536)
def facts(text: str) -> Facts:
    text = _ATTACHED.sub(" ", unicodedata.normalize("NFKC", text))
    tokens, lower = _tokens(text)
    words = frozenset(lower)
    entities = _entities(tokens)
    numbers = _numbers(text, lower)
    dates = frozenset(w for w in lower if w in DATE_WORDS) | frozenset(
        n for n in numbers if len(n) == 4 and n.isdigit() and 1000 < int(n) < 2200
    )
    return Facts(
        numbers=numbers,
        negations=frozenset(NEGATION_CUES.get(w, "not" if w.endswith("n't") else "") for w in lower) - {""},
        words=words,
        entities=frozenset(entities),
        entity_order=tuple(dict.fromkeys(entities)),
        units=tuple(UNITS[w] for w in lower if w in UNITS),
        sources=_after(lower, ("from",)),
        targets=_after(lower, ("to", "into", "towards")),
        compared=tuple(sorted(_after(lower, ("than", "vs", "versus")))),
        dates=dates,
        language=_language(text, lower),
    )


def verify(query: str, cached: str) -> Verdict:
    """Whether a cached answer to ``cached`` may answer ``query``."""
    a, b = facts(query), facts(cached)
    if a.language != b.language:
        return Verdict(False, f"language: {a.language} vs {b.language}")
    if a.numbers != b.numbers:
        return Verdict(False, f"numbers: {' '.join(a.numbers) or '-'} vs {' '.join(b.numbers) or '-'}")
    if a.negations != b.negations:
        return Verdict(False, f"negation: {sorted(a.negations)} vs {sorted(b.negations)}")
    opposite = _prefixed_antonym(a.words, b.words) or _opposites(a.words, b.words, NEGATION_PAIRS)
    if opposite:
        return Verdict(False, f"negation: {opposite}")
    # A name must be in the other text too, capitalised or not ("france" asks about France).
    missing = (a.entities - b.words) | (b.entities - a.words)
    if missing:
        return Verdict(False, f"entities: {sorted(missing)}")
    other = _other_of_kind(a.words, b.words)
    if other:
        return Verdict(False, f"entities: {other}")
    if a.units != b.units:
        return Verdict(False, f"units: {' '.join(a.units) or '-'} vs {' '.join(b.units) or '-'}")
    opposite = _opposites(a.words, b.words, DIRECTION_PAIRS)
    if opposite:
        return Verdict(False, f"direction: {opposite}")
    downwards = (a.words ^ b.words) & ONE_SIDED_DOWNWARDS
    if downwards:
        return Verdict(False, f"direction: {sorted(downwards)} on one side")
    shared = a.entities & b.entities
    order_a = [e for e in a.entity_order if e in shared]
    if len(shared) > 1 and order_a != [e for e in b.entity_order if e in shared]:
        return Verdict(False, f"direction: {order_a} in another order")
    swapped = (a.sources & b.targets) | (a.targets & b.sources)
    if swapped:
        return Verdict(False, f"direction: from/to {sorted(swapped)} swapped")
    if a.compared and b.compared and a.compared != b.compared:
        return Verdict(False, f"direction: than {a.compared} vs {b.compared}")
    if a.dates != b.dates:
        return Verdict(False, f"dates: {sorted(a.dates ^ b.dates)}")
    return Verdict(True)


def _numbers(text: str, lower: list[str]) -> tuple[str, ...]:
    found: list[tuple[int, str]] = []
    for m in _NUMBER.finditer(text):
        digits = m.group(1).replace(",", "")
        if digits.count(".") > 1:
            digits = m.group(1)  # a version or a date: keep as written
        scale = (m.group(2) or "").lower()
        try:
            value = float(digits) * SCALE.get(scale, 1.0)
            normal = f"{value:.12g}" if value < 1e15 else digits
        except ValueError:
            normal = digits
        if m.group(3):
            normal += "%"
        found.append((m.start(), normal))
    found += [(m.start(), m.group(1).replace("×", "*").replace("x", "*")) for m in _OPERATOR.finditer(text)]
    for position, word in enumerate(lower):  # number words and ordinals, after the digits
        match = _ORDINAL.match(word)
        if match:
            found.append((10**9 + position, ordinal(int(match.group(1)))))
        elif word in SCALE and position and lower[position - 1][-1:].isdigit():
            continue  # "1.5 million": the scale of the number before it, read with the digits
        elif word in NUMBER_WORDS:
            found.append((10**9 + position, str(NUMBER_WORDS[word])))
    return tuple(n for _, n in sorted(found))


def _entities(tokens: list[str]) -> list[str]:
    """Capitalised words not at a sentence start, and acronyms anywhere, casefolded."""
    out = []
    sentence_start = True
    for token in tokens:
        if token in (".", "?", "!"):
            sentence_start = True
            continue
        acronym = len(token) > 1 and token.isupper() and token.isalpha()
        if acronym or (token[:1].isupper() and not sentence_start and token.casefold() not in FILLER):
            out.append(token.casefold())
        sentence_start = False
    return out


def _after(lower: list[str], markers: tuple[str, ...]) -> frozenset[str]:
    """The word after each marker, past determiners ("from my savings" -> savings)."""
    out = set()
    for i, w in enumerate(lower):
        if w in markers:
            j = i + 1
            while j < len(lower) and lower[j] in DETERMINERS:
                j += 1
            if j < len(lower):
                out.add(lower[j])
    return frozenset(out)


def _opposites(a: frozenset[str], b: frozenset[str], pairs: dict[str, frozenset[str]]) -> str:
    """A word on one side only whose opposite is on the other side only."""
    only_a, only_b = a - b, b - a
    for word in only_a:
        for other in pairs.get(word, ()):
            if other in only_b:
                return f"{word} vs {other}"
    return ""


def _kind(word: str) -> tuple[str, str] | None:
    found = KINDS.get(word)
    if found is None and word.endswith("s"):
        found = KINDS.get(word[:-1]) or (KINDS.get(word[:-2]) if word.endswith("es") else None)
    return found


def _other_of_kind(a: frozenset[str], b: frozenset[str]) -> str:
    """A thing of some kind on one side only, and another thing of that kind on the other side only."""
    only_b = {}
    for word in b - a:
        found = _kind(word)
        if found is not None:
            only_b.setdefault(found[0], (found[1], word))
    for word in a - b:
        found = _kind(word)
        if found is not None and found[0] in only_b and only_b[found[0]][0] != found[1]:
            return f"{word} vs {only_b[found[0]][1]}"
    return ""


def _prefixed_antonym(a: frozenset[str], b: frozenset[str]) -> str:
    only_a, only_b = a - b, b - a
    for x, y in ((only_a, only_b), (only_b, only_a)):
        for word in x:
            for prefix in NEGATING_PREFIXES:
                if word.startswith(prefix) and len(word) - len(prefix) >= 3 and word[len(prefix) :] in y:
                    return f"{word} vs {word[len(prefix) :]}"
    return ""


def _language(text: str, lower: list[str]) -> str:
    """A script other than Latin names itself; in Latin script, the language with the most of its common
    words, English unless another has more and two or more (or one, and accented letters or no English
    word); four words or more with no common word of any language listed: "unknown"."""
    scripts = {unicodedata.name(ch, "?").split()[0] for ch in text if ch.isalpha()}
    scripts.discard("LATIN")
    if scripts:
        return "script:" + "+".join(sorted(scripts))
    accented = any(ord(ch) > 127 and ch.isalpha() for ch in text)
    counts = {language: sum(1 for w in lower if w in common) for language, common in LANGUAGE_WORDS.items()}
    english = counts.pop("en")
    best, best_count = max(counts.items(), key=lambda kv: kv[1])
    if best_count > english and (best_count >= 2 or accented or english == 0):
        return best
    return "en" if english or len(lower) < 4 else "unknown"
