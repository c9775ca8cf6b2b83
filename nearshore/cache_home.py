"""Where the project keeps what it works out once and reuses across processes (models copied out of their
packages, converted weights, the dictionary, a quantised embedder, facts about model files):
``$XDG_CACHE_HOME/nearshore``, else ``~/.cache/nearshore``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nearshore"
