"""Whether this host has a GPU the torch engine can use, asked without importing torch where it cannot."""

from __future__ import annotations

import ctypes
import os


def gpu_driver_present() -> bool:
    """Whether this host has a GPU driver torch could use: NVIDIA's libcuda (which torch's CUDA loads), or
    ROCm's /dev/kfd. Asked before torch is imported, so a CPU host's "auto" node does not pay torch's import
    (1.5 s of CPU a start) to learn it has no GPU."""
    if os.path.exists("/dev/kfd"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device (never raises)."""
    if not gpu_driver_present():
        return False
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver is no GPU
        return False
