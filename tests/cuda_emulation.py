"""Runs gpu/kernels' CUDA kernels on the CPU (tests/cuda_cpu: a thread per CUDA thread), for tests here.

The kernel source is gpu/kernel_build.py's, with its shared-memory declarations turned into C++ (a static
shared by the block's threads; the dynamic area from the launch), built with g++ against cuda_on_cpu.h.
The launch numbers come from gpu/cuda_kernels.py, as on a GPU.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import torch

from gpu import cuda_kernels as ck
from gpu import kernel_build as kb

HERE = Path(__file__).parent / "cuda_cpu"
CXX = shutil.which("g++")
BUILD_ROOT = Path(tempfile.gettempdir()) / "nearshore-cuda-cpu"
_DYNAMIC = re.compile(r"extern __shared__ float (\w+)\[\];")
_STATIC = re.compile(r"^(\s*)__shared__ ", re.MULTILINE)


def available() -> bool:
    return CXX is not None


def host_source(name: str) -> str:
    code = _DYNAMIC.sub(r"float* \1 = emu::dynamic_shared<float>();", kb.source(name))
    return _STATIC.sub(r"\1static ", code)


@cache
def build(name: str) -> Path:
    """The driver for kernel file ``name``, built once per source (kept between runs, keyed by content)."""
    code = host_source(name)
    key_text = code + (HERE / "cuda_on_cpu.h").read_text() + (HERE / "driver.cpp").read_text()
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    out_dir = BUILD_ROOT / f"{name}-{key}"
    binary = out_dir / "driver"
    if binary.exists():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernel.cu").write_text(code)
    flag = {"paged_attention": "-DATTENTION", "sampling": "-DSAMPLING"}[name]
    tmp = out_dir / f"driver.{id(code)}.tmp"
    cmd = [CXX, "-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing"]
    cmd += [
        "-Wno-unknown-pragmas",
        flag,
        f"-I{HERE}",
        f"-I{out_dir}",
        str(HERE / "driver.cpp"),
        "-o",
        str(tmp),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"g++ failed for {name}:\n{done.stderr[-4000:]}")
    tmp.rename(binary)
    return binary


def _raw(t: torch.Tensor) -> bytes:
    t = t.contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int,
    num_splits: int,
    partition_tokens: int,
) -> torch.Tensor:
    """The decode kernel's output, launched as gpu/cuda_kernels.py launches it."""
    ck.check_attention_args(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    launch = ck.attention_launch(num_seqs, num_heads, num_kv_heads, head_dim, num_splits, partition_tokens)
    numbers = [
        ck.DTYPE_NAMES[q.dtype], head_dim, *launch.grid, launch.block[0], launch.shared_bytes,
        q.stride(0), q.stride(1), block_tables.stride(0), num_seqs, num_heads, num_kv_heads,
        k_cache.shape[1], window, repr(float(np.float32(scale))), partition_tokens, num_splits,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # q is passed whole from its first element, as the kernel reads it through its strides.
        base = q.as_strided((q.untyped_storage().nbytes() // q.element_size() - q.storage_offset(),), (1,))
        files = {"q.bin": base, "k.bin": k_cache, "v.bin": v_cache, "tables.bin": block_tables}
        files["lens.bin"] = seq_lens
        for name, t in files.items():
            (work / name).write_bytes(_raw(t))
        (work / "launch.txt").write_text(" ".join(map(str, numbers)))
        _run(build("paged_attention"), work)
        raw = np.frombuffer(
            (work / "out.bin").read_bytes(), dtype=np.int16 if q.element_size() == 2 else np.float32
        )
    out = torch.from_numpy(raw.copy())
    return (out.view(q.dtype) if q.element_size() == 2 else out).view(num_seqs, num_heads, head_dim)


def sample_from_logits(logits: torch.Tensor, arrays: dict[str, torch.Tensor], threads: int = 64) -> list[int]:
    """The sampling kernel's tokens, with ``threads`` per block (the kernel works with any multiple of 32;
    fewer than on a GPU keeps the emulation quick)."""
    launch = ck.sampling_launch(logits.shape[0])
    numbers = [launch.grid[0], threads, launch.shared_bytes, logits.stride(0), logits.shape[1]]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "logits.bin").write_bytes(_raw(logits))
        for name, t in arrays.items():
            (work / f"{name}.bin").write_bytes(_raw(t))
        (work / "launch.txt").write_text(" ".join(map(str, numbers)))
        _run(build("sampling"), work)
        return np.frombuffer((work / "tokens.bin").read_bytes(), dtype=np.int64).tolist()


def _run(binary: Path, work: Path) -> None:
    done = subprocess.run([str(binary), str(work)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{binary.name} exited {done.returncode}:\n{done.stderr[-4000:]}")
