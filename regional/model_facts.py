"""Facts about a model file that take a scan to work out (the longest token's bytes: 0.4 s of CPU over
Gemma's 262k-token vocabulary) are worked out once per file and kept in the cache folder, so every later
start of a node on the same file reads them instead.

A fact is keyed by the file's real path, size and modification time: a file replaced or edited in place is
scanned again. Keeping a fact is best effort; a cache folder that cannot be written costs the scan, nothing
else."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from nearshore.cache_home import cache_home, write_whole


def facts_dir() -> Path:
    return cache_home() / "model-facts"


def remembered(model_path: str, fact: str, work_out: Callable[[], int], folder: Path | None = None) -> int:
    """``fact`` about the model at ``model_path``: kept from an earlier start, else ``work_out()`` (kept)."""
    try:
        stat = os.stat(model_path)
    except OSError:
        return work_out()
    identity = f"{os.path.realpath(model_path)}\0{stat.st_size}\0{stat.st_mtime_ns}"
    path = (folder or facts_dir()) / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
    try:
        kept = json.loads(path.read_text())
        if isinstance(kept.get(fact), int):
            return kept[fact]
    except (OSError, ValueError, AttributeError):
        kept = {}
    value = work_out()
    facts = json.dumps({**kept, fact: value, "model": os.path.realpath(model_path)})
    with contextlib.suppress(OSError):  # a folder that cannot be written costs the next start the scan
        write_whole(path, lambda temporary: temporary.write_text(facts))
    return value
