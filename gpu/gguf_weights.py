"""A GGUF's tensors as torch tensors, through a converted-weights cache so a warm start takes seconds.

Dequantising with gguf's numpy code is slow (tens of seconds for 270M parameters), so the result is kept as a
safetensors file under <cache>/<sha256 of the GGUF>/weights-<dtype>.safetensors. Every file is written to a
temporary name and renamed, so a crash leaves no half file; a file that still fails to read (truncated by
hand, damaged on disk) is deleted and rebuilt. The GGUF's sha256 is remembered in
a small sidecar keyed by (path, size, mtime_ns), so a warm start does not re-read the whole GGUF to hash it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nearshore.cache_home import cache_home, write_whole

log = logging.getLogger(__name__)

CACHE_FORMAT = "1"  # bump when the stored layout changes: old entries are then rebuilt
HASH_CHUNK_BYTES = 1 << 22


@dataclass(frozen=True)
class LoadedWeights:
    tensors: dict[str, torch.Tensor]  # by GGUF tensor name, in the GGUF's [out, in] layout
    load_s: float
    cache_hit: bool
    gguf_sha256: str
    cache_file: Path | None


def default_cache_root() -> Path:
    return cache_home() / "torch-weights"


def cache_entry(gguf_path: str | Path, cache_root: str | Path | None = None) -> Path:
    """The cache folder of a GGUF: <root>/<sha256 of the file>."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / gguf_sha256(Path(gguf_path), root)


def load_weights(
    gguf_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache_root: str | Path | None = None,
    use_cache: bool = True,
    reader: Any = None,
) -> LoadedWeights:
    """All tensors of a GGUF as `dtype` on `device`, from the cache when it holds them.

    `reader`: a gguf.GGUFReader of the file if the caller has one (opening one takes seconds: the tokenizer's
    arrays are parsed in Python).
    """
    started = time.perf_counter()
    if not use_cache:
        tensors = _to_device(dequantize_gguf(gguf_path, dtype, reader), device)
        return LoadedWeights(tensors, time.perf_counter() - started, False, "", None)
    entry = cache_entry(gguf_path, cache_root)
    digest = entry.name
    cache_file = entry / f"weights-{_dtype_name(dtype)}.safetensors"
    tensors = _read_cache(cache_file, digest, device)
    hit = tensors is not None
    if tensors is None:
        host = dequantize_gguf(gguf_path, dtype, reader)
        _write_cache(cache_file, host, digest)
        tensors = _to_device(host, device)
    return LoadedWeights(tensors, time.perf_counter() - started, hit, digest, cache_file)


def read_entry_json(entry: Path, name: str) -> dict[str, Any] | None:
    """A small JSON document kept beside the weights (the model's config); None when absent or damaged."""
    try:
        data = json.loads((entry / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_entry_json(entry: Path, name: str, data: dict[str, Any]) -> None:
    try:
        write_whole(entry / name, lambda tmp: tmp.write_text(json.dumps(data, indent=1)))
    except OSError as exc:
        log.warning("could not write %s: %s", entry / name, exc)


def dequantize_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32, reader: Any = None
) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF dequantised (any type gguf.quants knows: Q4_K, Q5_0, Q6_K, Q8_0, F16...)."""
    import gguf

    reader = reader if reader is not None else gguf.GGUFReader(str(path))
    tensors: dict[str, torch.Tensor] = {}
    for info in reader.tensors:
        array = gguf.quants.dequantize(info.data, info.tensor_type)
        # The reader's arrays are read-only views of a memory map: copy before torch owns them.
        array = np.array(array, dtype=np.float32, copy=True)
        tensors[info.name] = torch.from_numpy(array).to(dtype)
    return tensors


def gguf_sha256(path: Path, cache_root: Path) -> str:
    """The GGUF's sha256, hashed once per (path, size, mtime_ns) and then read from a sidecar."""
    stat = path.stat()
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    sidecar = cache_root / "sha256" / (hashlib.sha1(key.encode()).hexdigest() + ".txt")
    try:
        known = sidecar.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
    digest = hasher.hexdigest()
    write_whole(sidecar, lambda tmp: tmp.write_text(digest + "\n"))
    return digest


def _read_cache(cache_file: Path, digest: str, device: str | torch.device) -> dict[str, torch.Tensor] | None:
    from safetensors import safe_open

    if not cache_file.is_file():
        return None
    try:
        with safe_open(str(cache_file), framework="pt", device=str(device)) as handle:
            meta = handle.metadata() or {}
            if meta.get("gguf_sha256") != digest or meta.get("format") != CACHE_FORMAT:
                raise ValueError(f"stale cache entry (metadata {meta})")
            names = list(handle.keys())
            return {name: handle.get_tensor(name) for name in names}
    except Exception as exc:  # a damaged file of any kind is rebuilt, never served
        log.warning("converted-weights cache %s unreadable (%s); rebuilding it", cache_file, exc)
        cache_file.unlink(missing_ok=True)
        return None


def _write_cache(cache_file: Path, tensors: dict[str, torch.Tensor], digest: str) -> None:
    from safetensors.torch import save_file

    metadata = {"gguf_sha256": digest, "format": CACHE_FORMAT}
    try:
        write_whole(cache_file, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    except OSError as exc:  # a full or read-only disk costs the next start time, not this one
        log.warning("could not write the converted-weights cache %s: %s", cache_file, exc)


def _to_device(tensors: dict[str, torch.Tensor], device: str | torch.device) -> dict[str, torch.Tensor]:
    return {name: t.to(device) for name, t in tensors.items()}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
