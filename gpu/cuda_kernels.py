"""The CUDA kernels at run time: CuPy modules compiled lazily, launched on torch's stream, on its tensors.

Nothing here imports CuPy until a kernel is launched on a machine where :func:`available` is True; the launch
arithmetic (grid, block, shared memory, splits) and the argument checks are plain functions, tested on the
CPU against the torch path's shapes. Tensors reach CuPy through DLPack (no copies; 16-bit floats viewed as
int16, which CuPy can hold), and kernels run on torch's current stream, so they order with torch's work and
are captured by a CUDA graph being recorded on it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np
import torch

from gpu import kernel_build
from gpu.sampling_rows import SamplingRow, uniform

# Fixed by the kernels' sources (paged_attention.cu, sampling.cu).
ATTN_THREADS = 128
SAMPLE_THREADS = 1024
ATTENTION_HEAD_DIMS = (64, 128, 256)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
# Dynamic shared memory a kernel may use without opting in to more (the same on sm_80 and sm_90).
MAX_DYNAMIC_SHARED_BYTES = 48 * 1024
DEFAULT_PARTITION_TOKENS = 512
MAX_SAMPLING_VOCAB = 1 << 24  # sampling.cu sums weights of at most 2^40 each in 64 bits
MIN_PARTITION_TOKENS = 64


class Launch(NamedTuple):
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


def attention_group_max(head_dim: int) -> int:
    """Query heads one attention block computes (paged_attention.cu's group_max)."""
    return 8 if head_dim <= 128 else 4


def attention_launch(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_splits: int = 1,
    partition_tokens: int = DEFAULT_PARTITION_TOKENS,
) -> Launch:
    """One block per (kv head and its chunk of query heads, sequence, split); the split's scores, the merged
    output and per-head (max, sum) in dynamic shared memory."""
    if head_dim not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} has no kernel (have {ATTENTION_HEAD_DIMS})")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if num_seqs < 1 or num_splits < 1 or partition_tokens < 1:
        raise ValueError("num_seqs, num_splits and partition_tokens must be positive")
    group = num_heads // num_kv_heads
    group_max = attention_group_max(head_dim)
    heads = min(group, group_max)
    chunks = -(-group // group_max)
    shared = 4 * heads * (partition_tokens + head_dim + 2)
    if shared > MAX_DYNAMIC_SHARED_BYTES:
        raise ValueError(f"{shared} bytes of shared memory: use a partition smaller than {partition_tokens}")
    if num_seqs > 65535 or num_splits > 65535:
        raise ValueError("more than 65535 sequences or splits in one launch")
    return Launch((num_kv_heads * chunks, num_seqs, num_splits), (ATTN_THREADS, 1, 1), shared)


def combine_launch(num_seqs: int, num_heads: int) -> Launch:
    return Launch((num_heads, num_seqs, 1), (ATTN_THREADS, 1, 1), 0)


def visible_keys(max_seq_len: int, window: int) -> int:
    """Keys a decode query reads at most: the whole context, or the window on a sliding layer."""
    return min(max_seq_len, window) if window > 0 else max_seq_len


def attention_splits(max_keys: int, num_seqs: int, num_kv_heads: int, num_sms: int) -> tuple[int, int]:
    """(partition_tokens, num_splits): partitions halve from 512 keys until the grid has two blocks per SM,
    so a small batch over a long context still fills the GPU (flash-decoding)."""
    partition = DEFAULT_PARTITION_TOKENS
    blocks = lambda tokens: num_seqs * num_kv_heads * -(-max_keys // tokens)  # noqa: E731
    while partition > MIN_PARTITION_TOKENS and blocks(partition) < 2 * num_sms:
        partition //= 2
    return partition, max(1, -(-max_keys // partition))


def sampling_launch(num_rows: int) -> Launch:
    if num_rows < 1 or num_rows > 2**31 - 1:
        raise ValueError(f"num_rows {num_rows} out of range")
    return Launch((num_rows, 1, 1), (SAMPLE_THREADS, 1, 1), 0)


def attention_kernel_name(dtype: torch.dtype, head_dim: int) -> str:
    return f"paged_attention_decode_{DTYPE_NAMES[dtype]}_d{head_dim}"


def check_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Raise ValueError unless the tensors have the layout the kernel reads (any device)."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    num_seqs, num_heads, head_dim = q.shape
    if k_cache.shape[3] != head_dim or num_heads % k_cache.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not match the cache {tuple(k_cache.shape)}")
    if q.dtype not in DTYPE_NAMES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"dtypes q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the k/v caches must be contiguous")
    if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        raise ValueError("the k/v caches must start 16-byte aligned")
    # Each lane reads head_dim / 32 elements with 4- to 16-byte loads: rows must start aligned.
    align = 16 // q.element_size()
    if q.stride(2) != 1 or q.stride(0) % align or q.stride(1) % align or q.data_ptr() % 16:
        raise ValueError(f"q rows must be contiguous and 16-byte aligned (strides {q.stride()})")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be int32 [num_seqs, max_blocks], rows contiguous")
    if seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
        raise ValueError("seq_lens must be contiguous int32")
    if block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(f"{num_seqs} queries, {block_tables.shape[0]} tables, {seq_lens.shape[0]} lengths")


# sample_from_logits's row parameters, in its order
SAMPLING_ORDER = ("temperature", "top_k", "top_p", "min_p", "uniform")


def sampling_arrays(rows: Sequence[SamplingRow]) -> dict[str, torch.Tensor]:
    """Per-row parameters as the sampling kernel takes them (CPU tensors); the uniform is draw()'s, rounded
    to float32 as draw() rounds it."""
    return {
        "temperature": torch.tensor([r.params.temperature for r in rows], dtype=torch.float32),
        "top_k": torch.tensor([r.params.top_k for r in rows], dtype=torch.int32),
        "top_p": torch.tensor([r.params.top_p for r in rows], dtype=torch.float32),
        "min_p": torch.tensor([r.params.min_p for r in rows], dtype=torch.float32),
        "uniform": torch.tensor([uniform(r.seed, r.index) for r in rows], dtype=torch.float32),
    }


def available() -> bool:
    """Whether the kernels can run here: a CUDA device for torch and CuPy installed. Never raises."""
    try:
        if not torch.cuda.is_available() or importlib.util.find_spec("cupy") is None:
            return False
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@cache
def _module(name: str) -> Any:
    import cupy

    return cupy.RawModule(code=kernel_build.source(name), options=kernel_build.COMPILE_OPTIONS)


@cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _cupy(t: torch.Tensor) -> Any:
    import cupy

    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)  # CuPy has no bfloat16; the kernel reads the bits
    return cupy.from_dlpack(t)


@contextmanager
def _on_torch_stream(device: torch.device) -> Iterator[None]:
    """CuPy's current device and stream set to the tensor's device and torch's current stream there: DLPack
    exports need no sync event, and a CUDA graph being captured on that stream records the launches."""
    import cupy

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device.index)
    with cupy.cuda.Device(device.index), stream:
        yield


@dataclass(frozen=True, slots=True)
class KernelCall:
    """One launch: the kernel, its grid, block and shared memory, and its parameters in the kernel's order
    (tensors as they are, scalars as numpy scalars of the C types)."""

    kernel: str
    launch: Launch
    args: list[tuple[str, torch.Tensor | np.generic]]


def attention_calls(
    q: torch.Tensor,  # [S, num_heads, head_dim], one decode query per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # int32 [S, max_blocks]
    seq_lens: torch.Tensor,  # int32 [S], context length including this query
    scale: float,
    window: int,
    out: torch.Tensor,  # [S, num_heads, head_dim], q's dtype
    max_seq_len: int,
    num_sms: int,
    num_splits: int | None = None,
    partition_tokens: int | None = None,
) -> list[KernelCall]:
    """The launches of one decode attention (the decode kernel, then the combine when split), with their
    split buffers allocated on q's device; no CUDA needed to build them."""
    check_attention_args(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    keys = max(visible_keys(max_seq_len, window), 1)
    if num_splits is None:
        partition_tokens, num_splits = attention_splits(keys, num_seqs, num_kv_heads, num_sms)
    elif partition_tokens is None:
        partition_tokens = -(-keys // num_splits)
    launch = attention_launch(num_seqs, num_heads, num_kv_heads, head_dim, num_splits, partition_tokens)
    split_shape = (num_seqs, num_heads, num_splits) if num_splits > 1 else (1,)
    split_out = torch.empty((*split_shape, head_dim), dtype=torch.float32, device=q.device)
    split_max = torch.empty(split_shape, dtype=torch.float32, device=q.device)
    split_sum = torch.empty(split_shape, dtype=torch.float32, device=q.device)
    splits = [("out", out), ("split_out", split_out), ("split_max", split_max), ("split_sum", split_sum)]
    decode = KernelCall(
        attention_kernel_name(q.dtype, head_dim),
        launch,
        [
            *splits,
            ("q", q),
            ("q_seq_stride", np.int64(q.stride(0))),
            ("q_head_stride", np.int64(q.stride(1))),
            ("k_cache", k_cache),
            ("v_cache", v_cache),
            ("block_tables", block_tables),
            ("block_table_stride", np.int32(block_tables.stride(0))),
            ("seq_lens", seq_lens),
            ("num_heads", np.int32(num_heads)),
            ("num_kv_heads", np.int32(num_kv_heads)),
            ("block_size", np.int32(block_size)),
            ("window", np.int32(window)),
            ("scale", np.float32(scale)),
            ("partition_tokens", np.int32(partition_tokens)),
            ("num_splits", np.int32(num_splits)),
        ],
    )
    if num_splits == 1:
        return [decode]
    scalars = [("num_heads", np.int32(num_heads)), ("head_dim", np.int32(head_dim))]
    combine = KernelCall(
        f"paged_attention_combine_{DTYPE_NAMES[q.dtype]}",
        combine_launch(num_seqs, num_heads),
        [*splits, *scalars, ("num_splits", np.int32(num_splits))],
    )
    return [decode, combine]


def sampling_call(
    logits: torch.Tensor,  # float32 [N, vocab], after penalties; rows contiguous
    temperature: torch.Tensor,  # float32 [N]; <= 0 is greedy
    top_k: torch.Tensor,  # int32 [N]; <= 0 is off
    top_p: torch.Tensor,  # float32 [N]
    min_p: torch.Tensor,  # float32 [N]
    uniform_draws: torch.Tensor,  # float32 [N], gpu/sampler.py's uniform(seed, index)
    out: torch.Tensor,  # int64 [N]
) -> KernelCall:
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("logits must be float32 [N, vocab] with contiguous rows")
    num_rows, vocab = logits.shape
    if vocab > MAX_SAMPLING_VOCAB:
        raise ValueError(
            f"vocabulary of {vocab}: the kernel's 40-bit fixed-point sums hold {MAX_SAMPLING_VOCAB}"
        )
    params = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    params["uniform"] = uniform_draws
    for name, t in params.items():
        dtype = torch.int32 if name == "top_k" else torch.float32
        if t.dtype != dtype or t.shape != (num_rows,) or not t.is_contiguous() or t.device != logits.device:
            raise ValueError(f"{name} is {t.dtype} {tuple(t.shape)}, expected {dtype} ({num_rows},)")
    if out.dtype != torch.int64 or out.shape != (num_rows,):
        raise ValueError(f"out is {out.dtype} {tuple(out.shape)}, expected int64 ({num_rows},)")
    args = [("tokens", out), ("logits", logits), ("row_stride", np.int64(logits.stride(0)))]
    args += [("vocab", np.int32(vocab)), *params.items()]
    return KernelCall("sample_from_logits", sampling_launch(num_rows), args)


def _launch(module_name: str, call: KernelCall) -> None:
    """Run ``call`` on the current CuPy stream (inside :func:`_on_torch_stream`)."""
    kernel = _module(module_name).get_function(call.kernel)
    args = tuple(_cupy(v) if isinstance(v, torch.Tensor) else v for _, v in call.args)
    kernel(call.launch.grid, call.launch.block, args, shared_mem=call.launch.shared_bytes)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    *,
    max_seq_len: int | None = None,  # known on the host: saves a device sync
    num_splits: int | None = None,  # fixed by a CUDA graph capture (with partition_tokens)
    partition_tokens: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention with the CUDA kernel (shapes as in :func:`attention_calls`); the same result as
    gpu/attention.py's paged_attention on decode rows, within the storage dtype's rounding."""
    num_seqs, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    calls = attention_calls(
        q, k_cache, v_cache, block_tables, seq_lens, scale, window, out, max_seq_len,
        _num_sms(q.device.index), num_splits, partition_tokens,
    )  # fmt: skip
    with _on_torch_stream(q.device):
        for call in calls:
            _launch("paged_attention", call)
    return out


def sample_from_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniform_draws: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # int64 [N]
    """Filter and draw one token per row with the fused kernel (arguments as in :func:`sampling_call`):
    gpu/sampler.py's draw() on the device."""
    if out is None:
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if logits.shape[0] == 0:
        return out
    call = sampling_call(logits, temperature, top_k, top_p, min_p, uniform_draws, out)
    with _on_torch_stream(logits.device):
        _launch("sampling", call)
    return out
