"""The words the verifier knows are words: to tell a typo ("recieve") from another word ("relieve").

English and French word lists (the frequency lists pyspellchecker ships: about 160k and 140k words) and the
embedder's own vocabulary, held as a sorted array of 64-bit hashes (about 2 MB, where the strings would
take 25 MB in every edge process) and read once, off the request's path, on first use. A hash collision
can only make a typo look like a word, which makes the verifier refuse it: it never admits a difference.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

log = logging.getLogger("nearshore.cache")
LANGUAGES = ("en", "fr")


def _hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


class Dictionary:
    def __init__(self, words: np.ndarray) -> None:
        self.hashes = words  # sorted uint64

    def __contains__(self, word: str) -> bool:
        h = np.uint64(_hash(word))
        i = int(np.searchsorted(self.hashes, h))
        return i < len(self.hashes) and self.hashes[i] == h

    def __len__(self) -> int:
        return len(self.hashes)


@lru_cache(maxsize=1)
def dictionary() -> Dictionary:
    """The known words (an empty dictionary when no list is installed: then no typo is explained)."""
    return Dictionary(np.unique(np.fromiter((_hash(w) for w in _words()), dtype=np.uint64)))


def _words():
    try:
        folder = resources.files("spellchecker") / "resources"
        for language in LANGUAGES:
            for word in json.loads(gzip.decompress((folder / f"{language}.json.gz").read_bytes())):
                if word.isalpha():
                    yield word
    except (ModuleNotFoundError, OSError, ValueError) as exc:
        log.warning("cache: no word lists (%s): typos are differences", exc)
    try:
        from cache.embedder import embedded_model_dir

        for word in (Path(embedded_model_dir()) / "vocab.txt").read_text(encoding="utf-8").split():
            if word.isalpha():
                yield word
    except Exception:  # no embedded model: the word lists alone
        return
