"""Reading a question the way the verifier (cache/verify.py) compares it: its canonical form.

Each text is read once (``canon``, cached):

1. casefolded, contractions expanded (what's -> what is, n't -> not, l' -> le), accents folded, chat
   spellings read as words (hw -> how, u -> you);
2. whole questions put another way read in one form (what does X mean -> meaning of X), framings read as
   one token or as nothing (``FRAMES``: how do I / how can I / how to; please, can you tell me), and words
   that never change what is asked dropped (``IGNORED``: articles, the present of "be", "do" as a helper,
   the asker's "my");
3. numbers as digits (ten -> 10, 10k -> 10000, $5 -> 5 dollar, first -> 1st);
4. each word as its stem (plural, -ing, -ed; never -er / -est) and its synonym group's head (``SYNONYMS``);
5. cut into phrases, each opened by a preposition or a clause word ("in Lagos", "for a beginner", "if it
   rains"), which may move in the sentence; the rest is one phrase, in order; "X of Y" and "Y's X" are read
   alike; words joined by and / or are sorted.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from cache import verify_words as vw

_TOKEN = re.compile(
    r"(?P<ord>\d+(?:st|nd|rd|th)\b)"
    r"|(?P<num>\d+(?:[.,]\d+)*(?:\s*(?:k|m|mn|bn|b|thousand|million|billion)\b)?)"
    r"|(?P<word>[^\W\d_]+(?:['-][^\W_]+)*)"
    r"|(?P<sign>[$€£¥₦%°+*/=<>×÷^]|(?<=\s)-(?=\s*\d)|^-(?=\d))"
    r"|(?P<stop>[,.;:!?()\n])",
    re.IGNORECASE,
)
_SCALE = re.compile(r"^([\d.,]+)\s*(k|m|mn|bn|b|thousand|million|billion)?$", re.IGNORECASE)
CLAUSE = "<clause>"  # where a dropped helper ("do", "is") started a clause: a phrase ends there
_POSS = "<'s>"  # a possessive: "Africa's longest river" is read as "the longest river of Africa"
_VOWELS = frozenset("aeiouy")
_INVERTED = frozenset(
    ("je", "tu", "il", "elle", "on", "nous", "vous", "ils", "elles", "ce", "t", "moi", "toi", "lui", "leur")
)
_SOFT_DOUBLES = frozenset("lsz")  # fall, miss, buzz: kept double when a suffix is cut


@dataclass(frozen=True, slots=True)
class Token:
    key: str  # the canonical form compared
    surface: str  # as written (casefolded, accents folded), for spelling and typo explanations


@dataclass(frozen=True, slots=True)
class Canon:
    """One text as the verifier compares it (its key counts made once: a candidate is compared often)."""

    language: str
    phrases: tuple[tuple[str, tuple[Token, ...]], ...]  # (opening word or "", its words)
    counts: Counter[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        keys = [lead for lead, _ in self.phrases if lead] + [t.key for t in self.tokens]
        object.__setattr__(self, "counts", Counter(keys))

    @property
    def tokens(self) -> list[Token]:
        return [t for _, words in self.phrases for t in words]

    def keys(self) -> Counter[str]:
        return self.counts


@lru_cache(maxsize=65536)
def canon(text: str) -> Canon:
    words = _words(text)
    language = _language(text, [w for w in words if w not in ",."])
    language_key = language if language in vw.PREPOSITIONS else "en"
    tokens = _numbers(_framed(_rewritten(words)))
    return Canon(language, _phrases(tokens, vw.PREPOSITIONS[language_key], language_key == "fr"))


def _fold(word: str) -> str:
    if word.isascii():
        return word
    return "".join(ch for ch in unicodedata.normalize("NFD", word) if not unicodedata.combining(ch))


def _words(text: str) -> list[str]:
    """Casefolded words with contractions expanded and accents folded; "," marks a phrase boundary."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("’", "'").replace("‘", "'")
    text = _CHAT_SPELLINGS.sub(lambda m: vw.CONTRACTIONS[m.group()], text)
    out: list[str] = []
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        if kind == "stop":
            if out and out[-1] != ",":
                out.append(",")
        elif kind == "num":
            out.append(value.replace(" ", ""))
        elif kind == "sign":
            out.append(value)
        else:
            out.extend(_expanded(value))
    out = _chat_digits(out)
    return [w if w == "à" else _fold(w) for w in out]  # à (to) is not a (has)


_CHAT_DIGITS = {"2": "to", "4": "for"}
# Chat spellings with digits ("b4", "2day"): read whole, before the tokenizer splits letters from digits.
_CHAT_SPELLINGS = re.compile(
    r"(?<![\w'])(?:"
    + "|".join(
        sorted((re.escape(w) for w in vw.CONTRACTIONS if any(c.isdigit() for c in w)), key=len, reverse=True)
    )
    + r")(?![\w'])"
)


def _chat_digits(words: list[str]) -> list[str]:
    """ "hw 2 make", "4 me": a lone 2 or 4 between two words, not before a plural (2 cups), is a word; and
    Pidgin's closing "o" ("cook am o") only stresses what came before."""
    out = list(words)
    for i in range(1, len(out) - 1):
        before, after = out[i - 1], out[i + 1]
        if out[i] in _CHAT_DIGITS and before.isalpha() and after.isalpha() and not after.endswith("s"):
            out[i] = _CHAT_DIGITS[out[i]]
    return [
        w for i, w in enumerate(out) if not (w == "o" and i > 1 and (i + 1 == len(out) or out[i + 1] == ","))
    ]


def _expanded(word: str) -> list[str]:
    if word in vw.CONTRACTIONS:
        return vw.CONTRACTIONS[word].split()
    head, apostrophe, tail = word.partition("'")
    if apostrophe and head in vw.ELISIONS and tail[:1] in "aeiouyhàâéèêëîïôûœ":
        return [vw.ELISIONS[head], *_expanded(tail)]
    if word.endswith("n't"):
        return [*_expanded(word[:-3]), "not"]
    for clitic, full in (("'re", "are"), ("'m", "am"), ("'ve", "have"), ("'ll", "will"), ("'d", "would")):
        if word.endswith(clitic):
            return [*_expanded(word[: -len(clitic)]), full]
    if word.endswith("'s"):
        base = word[:-2]
        return (
            [base, "is"]
            if base in {"he", "she", "it", "that", "there", "what", "who", "here"}
            else [base, _POSS]
        )
    if "-" in word:
        parts = word.split("-")
        # French inversions (puis-je, chauffe-t-il) and compounds (wi-fi, e-mail): words apart or joined.
        if parts[-1] in _INVERTED:
            # the inverted subject of a French question marks the question (le ciel est-il bleu: le ciel
            # est bleu); je / on / moi are kept (puis-je, peut-on, dis-moi are framings)
            return [p for p in parts if p not in {"t", "il", "elle", "ils", "elles"}]
        return ["".join(parts)]
    return [word.replace("'", "")]


def _rewritten(words: list[str]) -> list[str]:
    """A whole question put in one of the ways ``REWRITES`` knows, read in its other form (what does X
    mean -> meaning of X)."""
    core = words[:-1] if words[-1:] == [","] else words
    while core and core[0] in _POLITE:  # "abeg wetin X mean": the politeness is no part of the form
        core = core[2:] if core[1:2] == [","] else core[1:]
    while core and core[-1] in _POLITE:
        core = core[:-1]
    for pattern, form in _REWRITES:
        head, tail = pattern
        if (
            len(core) > len(head) + len(tail)
            and core[: len(head)] == head
            and core[len(core) - len(tail) :] == tail
        ):
            slot = core[len(head) : len(core) - len(tail)]
            if "," not in slot:
                return [*form[0], *slot, *form[1]]
    return words


_POLITE = frozenset(("please", "abeg", "kindly", "biko", "thanks"))


def _split_rewrite(text: str) -> tuple[list[str], list[str]]:
    head, _, tail = text.partition("*")
    return head.split(), tail.split()


_REWRITES = [(_split_rewrite(p), _split_rewrite(f)) for p, f in vw.REWRITES]


def _framed(words: list[str]) -> list[str]:
    """Framings read as one token or dropped, then the ignored words dropped (longest framing first)."""
    out: list[str] = []
    i, at_start = 0, True
    while i < len(words):
        after_knowing = bool(out) and out[-1] in vw.KNOWING  # "learn how to swim" asks no how-to
        n, reading = _framing(words, i, at_start, after_knowing)
        if n:
            out.extend(reading.split())
            i += n
            at_start = at_start and not reading  # after a dropped framing the text still starts ("hi, how")
            continue
        word = vw.ARTICLE_FORMS.get(words[i], words[i])
        if word not in vw.IGNORED:
            out.append(word)
            at_start = word == "," and (len(out) < 2 or out[-2] in ",")
        elif word in vw.CLAUSE_HELPERS:
            out.append(CLAUSE)
        i += 1
    return out


def _framing(words: list[str], i: int, at_start: bool, after_knowing: bool) -> tuple[int, str]:
    """How many words from ``i`` make a framing (0 if none), and its reading."""
    lengths = _FRAME_LENGTHS.get(words[i])
    if lengths is None:
        return 0, ""
    for n in lengths:
        if i + n > len(words):
            continue
        phrase = " ".join(words[i : i + n])
        if at_start and phrase in vw.OPENINGS:
            return n, vw.OPENINGS[phrase]
        if not after_knowing and phrase in vw.QUESTIONS:
            return n, vw.QUESTIONS[phrase]
        if phrase in vw.FRAMES:
            return n, vw.FRAMES[phrase]
        if phrase in vw.REQUEST_OPENERS and i + n < len(words) and words[i + n] in vw.REQUEST_VERBS:
            return n, ""
    return 0, ""


def _frame_lengths() -> dict[str, tuple[int, ...]]:
    """Each framing's first word -> the framings' lengths in words, longest first."""
    out: dict[str, set[int]] = {}
    for phrase in (*vw.QUESTIONS, *vw.OPENINGS, *vw.FRAMES, *vw.REQUEST_OPENERS):
        words = phrase.split()
        out.setdefault(words[0], set()).add(len(words))
    return {word: tuple(sorted(lengths, reverse=True)) for word, lengths in out.items()}


_FRAME_LENGTHS = _frame_lengths()


def _numbers(words: list[str]) -> list[str]:
    """Digits for numbers and number words, with their scale; a currency sign after its number."""
    out: list[str] = []
    pending_sign = ""
    for word in words:
        if word in vw.CURRENCY_SIGNS and word != "%":
            pending_sign = vw.CURRENCY_SIGNS[word]
            continue
        if word in vw.SCALE and out and out[-1].replace(".", "").isdigit():
            out[-1] = _number(f"{out[-1]}{word}")
            continue
        number = _number(word) if word[:1].isdigit() else vw.NUMBER_WORDS.get(word)
        if number is not None:
            out.append(number)
            if pending_sign:
                out.append(pending_sign)
                pending_sign = ""
            continue
        if word == "%":
            word = "percent"
        if pending_sign:  # "$" with no number after it
            out.append(pending_sign)
            pending_sign = ""
        out.append(word)
    if pending_sign:
        out.append(pending_sign)
    return out


def _number(text: str) -> str:
    """'10k' -> '10000', '1,500' -> '1500', '1.5m' -> '1500000', '2nd' -> '2nd'; letters stuck to digits
    that are no scale stay apart ('50kg' is read as two words before this)."""
    match = _SCALE.match(text)
    if match is None:
        return text
    digits, scale = match.group(1), (match.group(2) or "").lower()
    if digits.count(".") > 1 or (digits.count(",") and not re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", digits)):
        return digits  # a version, a date or a decimal comma: kept as written
    try:
        value = float(digits.replace(",", "")) * vw.SCALE.get(scale, 1.0)
    except ValueError:
        return digits
    return f"{value:.12g}" if value < 1e15 else digits


def stem(word: str, french: bool) -> str:
    """The word without its inflection: plural, -ing, -ed and a final e (make / making / made apart),
    never -er or -est (bigger is not big)."""
    if word in vw.IRREGULAR:
        return vw.IRREGULAR[word]
    if not word.isalpha() or len(word) <= 2:
        return word
    if french:
        if len(word) > 3 and word[-1] in "sx" and not word.endswith("ss"):
            word = word[:-1]
        return word[:-1] if len(word) > 3 and word.endswith("e") else word
    if len(word) > 3:
        if word.endswith("ies") and len(word) > 4:
            word = word[:-3] + "i"
        elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(word) >= 5 and _VOWELS & set(stem) and not word.endswith("eed"):
            if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in _VOWELS | _SOFT_DOUBLES:
                stem = stem[:-1]
            word = stem
            break
    if word.endswith("y") and len(word) > 3:
        word = word[:-1] + "i"
    return word[:-1] if len(word) >= 3 and word.endswith("e") else word


# Each synonym's stem to its group head's stem.
_SYNONYM_STEMS = {stem(w, False): stem(head, False) for w, head in vw.SYNONYMS.items()}


def _token(word: str, french: bool) -> Token:
    base = stem(word, french)
    return Token(_SYNONYM_STEMS.get(base, base), word)


def _phrases(
    words: list[str], leads: frozenset[str], french: bool
) -> tuple[tuple[str, tuple[Token, ...]], ...]:
    """The words cut into phrases at each preposition or clause word; a comma ends such a phrase (the
    fronted "In Lagos, ..."); the words outside any of them are one phrase, in order. An owner ("X of Y",
    "Y's X") stands before the last word of what it owns, so both read "Y X" (the capital of Nigeria,
    Nigeria's capital); words joined by and / or are sorted."""
    core: list[Token] = []
    phrases: list[tuple[str, list[Token]]] = [("", core)]
    owned: list[tuple[list[Token], list[Token]]] = []  # (what is owned, the "of" phrase that owns it)
    current, owner = core, None
    for word in words:
        if word == _POSS:
            owner = len(current) - 1 if current else None
            continue
        ends_phrase = word in (",", CLAUSE) or (word in vw.CLAUSE_WORDS or word in _OPENED_QUESTIONS)
        if ends_phrase or word in leads:
            _place_owner(current, owner)
            owner = None
        if word in (",", CLAUSE):
            current = core
        elif ends_phrase and current is not core and word not in leads:
            current = core
            current.append(_token(word, french))
        elif word in leads:
            new: list[Token] = []
            if word in ("of", "de") and current:
                owned.append((current, new))
            else:
                phrases.append((word, new))
            current = new
        else:
            current.append(_token(word, french))
    _place_owner(current, owner)
    for target, of_phrase in reversed(owned):  # the price of a bag of rice: the innermost first
        target[len(target) - 1 : len(target) - 1] = of_phrase
    return tuple((lead, _sorted_conjuncts(tokens)) for lead, tokens in phrases if lead or tokens)


_OPENED_QUESTIONS = frozenset((vw.HOW_TO, vw.WHERE_TO))


def _place_owner(group: list[Token], at: int | None) -> None:
    """The owner at ``at`` moved before the group's last word (Africa's longest river: longest Africa
    river, as "the longest river of Africa" reads)."""
    if at is not None and at < len(group) - 1:
        token = group.pop(at)
        group.insert(len(group) - 1, token)


def _sorted_conjuncts(tokens: list[Token]) -> tuple[Token, ...]:
    out = list(tokens)
    for i in range(1, len(out) - 1):
        if out[i].key in vw.CONJUNCTIONS and out[i - 1].key > out[i + 1].key:
            out[i - 1], out[i + 1] = out[i + 1], out[i - 1]
    return tuple(out)


def _language(text: str, words: list[str]) -> str:
    """A script other than Latin names itself; in Latin script, the language with the most of its common
    words (Pidgin: any word only Pidgin has), English unless another has more and two or more (or one,
    and accented letters or no English word); four words or more with none listed: "unknown"."""
    text = unicodedata.normalize("NFKC", text)  # full-width Latin (an East Asian keyboard's) is Latin
    scripts = (
        set()
        if text.isascii()
        else {unicodedata.name(ch, "?").split()[0] for ch in text if ch.isalpha() and ord(ch) > 0x24F}
    )  # below U+0250 every letter is Latin
    scripts.discard("LATIN")
    if scripts:
        return "script:" + "+".join(sorted(scripts))
    raw = unicodedata.normalize("NFKC", text).casefold().split()
    if any(w.strip("?,.!") in vw.LANGUAGE_WORDS["pcm"] for w in raw):
        return "pcm"
    accented = any(ord(ch) > 127 and ch.isalpha() for ch in text)
    lowered = [w.strip("?,.!") for w in raw]
    counts = {lang: sum(1 for w in lowered if w in common) for lang, common in vw.LANGUAGE_WORDS.items()}
    counts.pop("pcm")
    english = counts.pop("en")
    best, best_count = max(counts.items(), key=lambda kv: kv[1])
    if best_count > english and (best_count >= 2 or accented or english == 0):
        return best
    return "en" if english or len(words) < 4 else "unknown"
