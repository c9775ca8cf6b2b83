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


def _from_first_element(t: torch.Tensor) -> bytes:
    """The tensor's storage from its first element on: a strided view reaches its elements through its
    strides, as the kernel does."""
    length = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    flat = t.detach().cpu().as_strided((length,), (1,))
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.view(torch.int16)
    return flat.numpy().tobytes()


def run(name: str, calls: list[ck.KernelCall], threads: int | None = None) -> dict[str, bytes]:
    """Run kernel file ``name``'s launches on the CPU; the bytes of every tensor argument afterwards.
    ``threads`` replaces the block size (for kernels that work with any multiple of 32)."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for call in calls:
            scalars = []
            for arg, value in call.args:
                if isinstance(value, torch.Tensor):
                    (work / f"{arg}.bin").write_bytes(_from_first_element(value))
                else:
                    scalars.append(repr(float(value)) if isinstance(value, np.floating) else str(int(value)))
            grid, block = call.launch.grid, threads or call.launch.block[0]
            lines.append(" ".join(map(str, [call.kernel, *grid, block, call.launch.shared_bytes, *scalars])))
        (work / "calls.txt").write_text("\n".join(lines) + "\n")
        binary = build(name)
        done = subprocess.run([str(binary), str(work)], capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"{name} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return {p.stem: p.read_bytes() for p in work.glob("*.bin")}


def _tensor(raw: bytes, like: torch.Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(raw[: like.numel() * like.element_size()]), dtype=like.dtype).view(
        like.shape
    )


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int,
    num_splits: int | None = None,
    partition_tokens: int | None = None,
    num_sms: int = 132,
) -> torch.Tensor:
    """The decode kernel's output, from gpu/cuda_kernels.py's launches (its splits when none are given)."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    max_seq_len = int(seq_lens.max())
    calls = ck.attention_calls(
        q, k_cache, v_cache, block_tables, seq_lens, scale, window, out, max_seq_len, num_sms,
        num_splits, partition_tokens,
    )  # fmt: skip
    return _tensor(run("paged_attention", calls)["out"], out)


def sample_from_logits(logits: torch.Tensor, arrays: dict[str, torch.Tensor], threads: int = 64) -> list[int]:
    """The sampling kernel's tokens, with ``threads`` per block (the kernel works with any multiple of 32;
    fewer than on a GPU keeps the emulation quick)."""
    out = torch.full((logits.shape[0],), -1, dtype=torch.int64)
    a = arrays
    call = ck.sampling_call(logits, a["temperature"], a["top_k"], a["top_p"], a["min_p"], a["uniform"], out)
    return _tensor(run("sampling", [call], threads)["tokens"], out).tolist()
