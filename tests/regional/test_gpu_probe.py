"""Whether a node has a GPU is asked of the host's driver before torch: a CPU host never imports torch."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

from regional import gpu_probe
from regional.config import EngineConfig
from regional.engine_select import choose_kind


def no_library(name: str) -> None:
    raise OSError(f"{name}: cannot open shared object file")


@pytest.fixture
def asked_torch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A torch that records being asked whether CUDA is there (and says it is)."""
    asked: list[str] = []

    def is_available() -> bool:
        asked.append("is_available")
        return True

    monkeypatch.setitem(
        sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=is_available))
    )
    return asked


def test_without_a_driver_torch_is_never_asked(monkeypatch: pytest.MonkeyPatch, asked_torch: list[str]):
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(gpu_probe.os.path, "exists", lambda path: False)
    assert not gpu_probe.gpu_driver_present()
    assert choose_kind(EngineConfig(kind="auto")) == "llama.cpp"
    assert asked_torch == []


def test_with_nvidias_or_rocms_driver_torch_decides(monkeypatch: pytest.MonkeyPatch, asked_torch: list[str]):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # libcuda.so.1 loads
    monkeypatch.setattr(gpu_probe.os.path, "exists", lambda path: False)
    assert choose_kind(EngineConfig(kind="auto")) == "gpu"
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(gpu_probe.os.path, "exists", lambda path: path == "/dev/kfd")
    assert choose_kind(EngineConfig(kind="auto")) == "gpu"
    assert asked_torch == ["is_available", "is_available"]


def test_a_driver_torch_cannot_use_is_no_gpu(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    broken = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: 1 / 0))
    monkeypatch.setitem(sys.modules, "torch", broken)
    assert not gpu_probe.cuda_available()
    monkeypatch.setitem(sys.modules, "torch", None)  # torch not installed
    assert not gpu_probe.cuda_available()
