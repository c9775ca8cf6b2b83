"""The words the verifier knows are words: to tell a typo ("recieve") from another word ("relieve").

English and French word lists (the frequency lists pyspellchecker ships: about 160k and 140k words) and the
embedder's own vocabulary, held as a sorted array of 64-bit hashes (about 2 MB, where the strings would
take 25 MB in every edge process). Reading the lists takes a second of CPU that holds Python's lock (a
3 MB JSON parse), so the array is built once into a file beside the embedded models and read from it
after: a tool builds it where it first needs it; an edge builds it in a separate process at start
(:func:`build_apart`) and, until it is there, explains no typo (refusing, never admitting, is the safe
side). A hash collision can only make a typo look like a word, which makes the verifier refuse it.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import logging
import os
import sys
import threading
from importlib import resources
from pathlib import Path

import numpy as np

from nearshore.cache_home import cache_home

log = logging.getLogger("nearshore.cache")
LANGUAGES = ("en", "fr")
SOURCES_VERSION = "pyspellchecker-0.9.1+minilm"  # a new name when the sources change: the file is rebuilt


def _hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


class Dictionary:
    def __init__(self, hashes: np.ndarray) -> None:
        self.hashes = hashes  # sorted uint64

    def __contains__(self, word: str) -> bool:
        h = np.uint64(_hash(word))
        i = int(np.searchsorted(self.hashes, h))
        return i < len(self.hashes) and self.hashes[i] == h

    def __len__(self) -> int:
        return len(self.hashes)


EMPTY = Dictionary(np.zeros(0, dtype=np.uint64))


def default_path() -> Path:
    return cache_home() / f"words-{SOURCES_VERSION}.npy"


class _Words:
    """The process's dictionary: loaded once; built here only where building may block (not an edge)."""

    def __init__(self) -> None:
        self.loaded: Dictionary | None = None
        self.build_here = True
        self.lock = threading.Lock()

    def get(self, path: Path) -> Dictionary:
        if self.loaded is not None:
            return self.loaded
        with self.lock:
            if self.loaded is None:
                found = _read(path)
                if found is None and self.build_here:
                    found = _read(build(path))
                if found is None:
                    return EMPTY  # not built yet (an edge's builder is still at work): no typo explained
                self.loaded = found
        return self.loaded


_WORDS = _Words()


def dictionary(path: Path | None = None) -> Dictionary:
    return _WORDS.get(path or default_path())


async def build_apart(path: Path | None = None) -> None:
    """For an edge: build the file in another process if it is missing, then read it (off the loop)."""
    path = path or default_path()
    _WORDS.build_here = False
    if not path.exists():
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cache.dictionary", str(path), stdout=asyncio.subprocess.DEVNULL
        )
        if await process.wait() != 0:
            log.warning(
                "cache: the word list could not be built (exit %s): typos are differences", process.returncode
            )
            return
    await asyncio.to_thread(_WORDS.get, path)


def build(path: Path) -> Path:
    hashes = np.unique(np.fromiter((_hash(w) for w in _words()), dtype=np.uint64))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(partial, hashes)
    os.replace(partial, path)
    return path


def _read(path: Path) -> Dictionary | None:
    try:
        return Dictionary(np.load(path))
    except (OSError, ValueError):
        return None


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


if __name__ == "__main__":  # `python -m cache.dictionary PATH`: what an edge runs apart
    build(Path(sys.argv[1]))
