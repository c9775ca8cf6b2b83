"""Where the project keeps what it works out once and reuses across processes (models copied out of their
packages, converted weights, the dictionary, a quantised embedder, facts about model files):
``$XDG_CACHE_HOME/nearshore``, else ``~/.cache/nearshore``; and how a file there is written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nearshore"


def write_whole(target: Path, write: Callable[[Path], object]) -> None:
    """``write(temporary)``, then the temporary renamed to ``target``: processes starting at once never read
    half a file, and a write that fails (a full disk) leaves nothing behind. Raises OSError."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        write(temporary)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        temporary.replace(target)
    finally:
        temporary.unlink(missing_ok=True)
