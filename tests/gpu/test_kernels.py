"""The CUDA kernels without a GPU: they compile (NVRTC) and assemble (ptxas) for sm_80 and sm_90 with no
spills and within shared memory; their launch arithmetic covers the torch path's shapes; the sampling kernel's
threshold search, replayed in numpy, picks gpu/sampler.py's draw() token; gpu.cuda_kernels never loads CuPy
where there is no GPU. Their numerics on a device are bench/gpu/kernels.py's job."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.gpu.kernels import decode_inputs
from gpu import cuda_kernels as ck
from gpu import kernel_build as kb
from gpu.sampler import SamplingRow, draw, uniform
from nearshore.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]
needs_nvrtc = pytest.mark.skipif(
    not kb.nvrtc_available(), reason="NVRTC cannot load: pip install nvidia-cuda-nvrtc-cu12 (the dev extra)"
)
EXPECTED_KERNELS = {
    "paged_attention": {
        *(ck.attention_kernel_name(dtype, d) for dtype in ck.DTYPE_NAMES for d in ck.ATTENTION_HEAD_DIMS),
        *(f"paged_attention_combine_{name}" for name in ck.DTYPE_NAMES.values()),
    },
    "sampling": {"sample_from_logits"},
}
THREADS = {"paged_attention": ck.ATTN_THREADS, "sampling": ck.SAMPLE_THREADS}
REGISTERS_PER_SM = 65536
# (num_heads, num_kv_heads, head_dim): Gemma 3 270M, Llama 3 8B, Qwen2 0.5B (group of 7), Llama 3.2 1B,
# and a group of 16 that needs several blocks per kv head.
SHAPES = [(4, 1, 256), (32, 8, 128), (14, 2, 64), (32, 8, 64), (16, 1, 256), (8, 8, 128)]


def _largest_dynamic_shared_bytes(name: str) -> int:
    if name != "paged_attention":
        return ck.sampling_launch(1).shared_bytes
    return max(ck.attention_launch(1, h, kvh, d).shared_bytes for h, kvh, d in SHAPES)


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.parametrize("name", sorted(kb.SOURCES))
def test_kernels_compile_for_sm80_and_sm90_without_spills(name: str) -> None:
    built = kb.build(name, ("sm_80", "sm_90"))
    for arch, result in built.items():
        assert re.search(rf"^\.target {arch}\b", result.ptx, re.MULTILINE), f"PTX not for compute_{arch[3:]}"
        assert result.cubin[:4] == b"\x7fELF"
        assert set(result.resources) == EXPECTED_KERNELS[name], arch
        for r in result.resources.values():
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, f"{arch} {r}"
            assert r.stack_bytes == 0, f"{arch} {r}"
            assert r.registers * THREADS[name] <= REGISTERS_PER_SM, f"{arch} {r}"
            shared = r.shared_bytes + _largest_dynamic_shared_bytes(name)
            assert shared <= ck.MAX_DYNAMIC_SHARED_BYTES, f"{arch} {r}: {shared} bytes of shared memory"
    # __launch_bounds__(128, 4): four attention blocks fit an SM's registers.
    if name == "paged_attention":
        for r in built["sm_90"].resources.values():
            assert r.registers * ck.ATTN_THREADS * 4 <= REGISTERS_PER_SM, r


@needs_nvrtc
def test_a_broken_kernel_fails_with_the_compilers_log() -> None:
    broken = 'extern "C" __global__ void k(float* out) { out[0] = not_declared_anywhere; }'
    with pytest.raises(kb.KernelBuildError) as err:
        kb.compile_ptx(broken, "sm_90", "broken.cu")
    assert "broken.cu" in str(err.value) and "not_declared_anywhere" in str(err.value)
    assert "undefined" in str(err.value)
    assert ".entry k" in kb.compile_ptx(broken.replace("not_declared_anywhere", "1.f"), "sm_80")


def test_ptxas_figures_are_read_per_kernel() -> None:
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 3360 bytes smem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 31 registers, used 0 barriers
"""
    got = kb.parse_ptxas_log(log)
    assert got["a"] == kb.KernelResources("a", 96, 12, 4, 8, 3360)
    assert got["b"] == kb.KernelResources("b", 31, 0, 0, 0, 0)


def test_sources_are_self_contained() -> None:
    for name in kb.SOURCES:
        code = kb.source(name)
        assert "#include" not in code, name
        assert code.count("struct Bf16 {") == 1, name


def test_launch_constants_agree_with_the_sources() -> None:
    attention = (kb.KERNEL_DIR / "paged_attention.cu").read_text()
    warps = int(re.search(r"#define ATTN_WARPS (\d+)", attention).group(1))
    assert warps * 32 == ck.ATTN_THREADS
    rule = re.search(r"group_max\(int head_dim\) \{ return head_dim <= (\d+) \? (\d+) : (\d+); \}", attention)
    for d in ck.ATTENTION_HEAD_DIMS:
        want = int(rule.group(2)) if d <= int(rule.group(1)) else int(rule.group(3))
        assert ck.attention_group_max(d) == want
        assert f"DEFINE_DECODE(DTYPE, T, {d})" in attention
    sampling = (kb.KERNEL_DIR / "sampling.cu").read_text()
    assert int(re.search(r"#define SAMPLE_THREADS (\d+)", sampling).group(1)) == ck.SAMPLE_THREADS


def _heads_of_block(x: int, num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[int, range]:
    """paged_attention.cu's arithmetic: blockIdx.x -> (kv head, the query heads it computes)."""
    group = num_heads // num_kv_heads
    group_max = ck.attention_group_max(head_dim)
    chunks = -(-group // group_max)
    kv_head = x // chunks
    head0 = kv_head * group + (x % chunks) * group_max
    return kv_head, range(head0, head0 + min(group_max, kv_head * group + group - head0))


@pytest.mark.parametrize("shape", SHAPES)
def test_attention_grid_covers_every_sequence_and_head_once(shape: tuple[int, int, int]) -> None:
    num_heads, num_kv_heads, head_dim = shape
    inputs = decode_inputs([1, 16, 17, 300, 1000], 16, 200, 0, random.Random(0))
    num_seqs = inputs.num_seqs
    grid, block, shared = ck.attention_launch(num_seqs, num_heads, num_kv_heads, head_dim, num_splits=3)
    assert block == (ck.ATTN_THREADS, 1, 1) and grid[1] == num_seqs and grid[2] == 3
    covered: list[tuple[int, int]] = []
    for x in range(grid[0]):
        kv_head, heads = _heads_of_block(x, num_heads, num_kv_heads, head_dim)
        assert all(h // (num_heads // num_kv_heads) == kv_head for h in heads)  # GQA: h reads kv h // group
        covered += [(seq, h) for seq in range(grid[1]) for h in heads]
    assert sorted(covered) == [(s, h) for s in range(num_seqs) for h in range(num_heads)]
    heads_per_block = max(len(_heads_of_block(x, *shape)[1]) for x in range(grid[0]))
    assert shared == 4 * heads_per_block * (ck.DEFAULT_PARTITION_TOKENS + head_dim + 2)


def test_attention_shared_memory_fits_head_dim_256() -> None:
    # Gemma 3 270M: a group of 4 heads of 256 over 512-key partitions.
    launch = ck.attention_launch(64, 4, 1, 256)
    assert launch.shared_bytes == 4 * 4 * (512 + 256 + 2) <= ck.MAX_DYNAMIC_SHARED_BYTES
    assert launch.grid == (1, 64, 1)
    # The largest block any head_dim gets (a full group), and what is refused.
    for head_dim in ck.ATTENTION_HEAD_DIMS:
        assert ck.attention_launch(1, 128, 1, head_dim).shared_bytes <= ck.MAX_DYNAMIC_SHARED_BYTES
    with pytest.raises(ValueError, match="shared memory"):
        ck.attention_launch(1, 8, 1, 128, partition_tokens=2048)


def test_attention_splits_cover_the_visible_keys() -> None:
    for max_seq_len in (1, 15, 16, 511, 512, 513, 4096, 32768):
        for window in (0, 512):
            keys = ck.visible_keys(max_seq_len, window)
            assert keys == (min(max_seq_len, 512) if window else max_seq_len)
            for num_seqs in (1, 8, 64, 128):
                partition, splits = ck.attention_splits(keys, num_seqs, 1, num_sms=132)
                assert ck.MIN_PARTITION_TOKENS <= partition <= ck.DEFAULT_PARTITION_TOKENS
                assert (splits - 1) * partition < keys <= splits * partition
                ck.attention_launch(num_seqs, 4, 1, 256, splits, partition)
    # A long context at batch 1 is split across the GPU; a full batch of short ones is not.
    assert ck.attention_splits(8192, 1, 1, 132) == (64, 128)
    assert ck.attention_splits(200, 128, 8, 132) == (512, 1)


def test_attention_launch_refuses_shapes_without_a_kernel() -> None:
    with pytest.raises(ValueError, match="head_dim 96"):
        ck.attention_launch(1, 4, 1, 96)
    with pytest.raises(ValueError, match="multiple"):
        ck.attention_launch(1, 6, 4, 128)
    with pytest.raises(ValueError):
        ck.attention_launch(0, 4, 1, 256)


def test_attention_arguments_match_the_kv_cache_layout() -> None:
    inputs = decode_inputs([5, 40, 33], 16, 12, 0, random.Random(1))
    q = torch.zeros(3, 4, 256, dtype=torch.bfloat16)
    cache = torch.zeros(12, 16, 1, 256, dtype=torch.bfloat16)  # [num_blocks, block_size, kv_heads, head_dim]
    table = inputs.block_tables["g"]
    ck.check_attention_args(q, cache, cache, table, inputs.seq_lens)
    # q split from a fused projection: a strided view with aligned rows is fine; a misaligned one is not.
    fused = torch.zeros(3, 6 * 256, dtype=torch.bfloat16)
    ck.check_attention_args(fused[:, : 4 * 256].view(3, 4, 256), cache, cache, table, inputs.seq_lens)
    with pytest.raises(ValueError, match="aligned"):
        ck.check_attention_args(
            fused[:, 1 : 4 * 256 + 1].view(3, 4, 256), cache, cache, table, inputs.seq_lens
        )
    with pytest.raises(ValueError, match="int32"):
        ck.check_attention_args(q, cache, cache, table.long(), inputs.seq_lens)
    with pytest.raises(ValueError, match="dtypes"):
        ck.check_attention_args(q, cache.float(), cache.float(), table, inputs.seq_lens)
    with pytest.raises(ValueError, match="contiguous"):
        ck.check_attention_args(q, cache.transpose(0, 1), cache.transpose(0, 1), table, inputs.seq_lens)
    pool = torch.zeros(13 * 16 * 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="aligned"):
        shifted_cache = pool[1 : 1 + 12 * 16 * 256].view(12, 16, 1, 256)
        ck.check_attention_args(q, shifted_cache, shifted_cache, table, inputs.seq_lens)
    with pytest.raises(ValueError, match="lengths"):
        ck.check_attention_args(q, cache, cache, table, inputs.seq_lens[:2])


def test_sampling_arrays_carry_draws_uniforms() -> None:
    rows = [
        SamplingRow(SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05), seed=s, index=i)
        for s, i in [(1, 0), (2**62, 7)]
    ]
    arrays = ck.sampling_arrays(rows)
    assert arrays["uniform"].tolist() == [np.float32(uniform(r.seed, r.index)) for r in rows]
    assert arrays["top_k"].dtype == torch.int32 and arrays["top_k"].tolist() == [40, 40]
    assert arrays["temperature"].dtype == torch.float32
    grid, block, shared = ck.sampling_launch(len(rows))
    assert grid == (2, 1, 1) and block == (ck.SAMPLE_THREADS, 1, 1) and shared == 0


def test_importing_the_kernels_does_not_load_cupy() -> None:
    code = "import sys, gpu.cuda_kernels as k; print(k.available(), 'cupy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    available, cupy_loaded = done.stdout.split()
    assert cupy_loaded == "False"
    if not torch.cuda.is_available():
        assert available == "False"


# The sampling kernel's algorithm, replayed in numpy step for step (fp32 weights, 40-bit fixed-point masses,
# two radix searches), so the CPU checks that its thresholds choose draw()'s token.
FIXED_ONE = np.float32(2.0**40)


def _radix_search(bits: np.ndarray, fixed: np.ndarray, pred) -> int | None:
    prefix, above_count, above_mass, total = 0, 0, 0, None
    for shift in (24, 16, 8, 0):
        high = 0 if shift == 24 else (0xFFFFFFFF << (shift + 8)) & 0xFFFFFFFF
        chosen = (bits & np.uint32(high)) == prefix
        digits = ((bits[chosen] >> np.uint32(shift)) & np.uint32(255)).astype(np.int64)
        count = np.bincount(digits, minlength=256)
        mass = [0] * 256
        for d, f in zip(digits.tolist(), fixed[chosen].tolist(), strict=True):
            mass[d] += f
        if total is None:
            total = sum(mass)
        c, m, digit = above_count, above_mass, None
        for d in range(255, -1, -1):
            c, m = c + int(count[d]), m + mass[d]
            if pred(c, m, total):
                digit = d
                break
        if digit is None:
            return None
        prefix |= digit << shift
        above_count, above_mass = c - int(count[digit]), m - mass[digit]
    return prefix


def _kernel_pick(x: np.ndarray, t: float, k: int, p: float, min_p: float, u: float) -> int:
    x = x.astype(np.float32)
    if t <= 0:
        return int(np.argmax(x))
    t32 = np.float32(t)
    e = np.exp((x / t32) - np.float32(x.max()) / t32).astype(np.float32)
    bits = e.view(np.uint32)
    fixed = (e * FIXED_ONE).astype(np.uint64)
    use_k, use_p = 0 < k < len(x), np.float32(p) < 1
    tau = 0
    if use_k or use_p:
        found = _radix_search(
            bits, fixed, lambda c, m, z: (use_k and c >= k) or (use_p and m >= float(np.float32(p)) * z)
        )
        tau = found or 0
    if min_p > 0:
        tau = max(tau, int(np.float32(min_p).view(np.uint32)))
    tau = min(tau, int(np.float32(1).view(np.uint32)))
    kept = int(fixed[bits >= tau].sum())
    target = float(np.float32(u)) * kept
    pick = _radix_search(bits, fixed, lambda c, m, z: m > target)
    if pick is None or pick < tau:
        pick = int(bits[bits >= tau].min())
    return int(np.flatnonzero(bits == pick)[0])


def test_the_kernels_threshold_search_picks_draws_token() -> None:
    gen = random.Random(3)
    torch.manual_seed(3)
    vocab, num_rows = 2000, 120
    logits = torch.randn(num_rows, vocab) * 2
    logits[:, :20] += torch.rand(num_rows, 1) * 8
    rows = [
        SamplingRow(
            SamplingParams(
                temperature=gen.choice([0.5, 1.0, 1.5]),
                top_k=gen.choice([0, 0, 2, 10, 300]),
                top_p=gen.choice([1.0, 0.3, 0.9, 0.99]),
                min_p=gen.choice([0.0, 0.0, 0.05, 0.3]),
            ),
            seed=gen.getrandbits(63),
            index=gen.randrange(100),
        )
        for _ in range(num_rows)
    ]
    want = draw(logits, rows).tolist()
    got = []
    for i, r in enumerate(rows):
        p, u = r.params, uniform(r.seed, r.index)
        got.append(_kernel_pick(logits[i].numpy(), p.temperature, p.top_k, p.top_p, p.min_p, u))
    assert got == want
    # u rounded up to 1: the least likely kept token, as draw() clamps to its last kept one.
    row = logits[0].numpy()
    top10 = np.argsort(-row, kind="stable")[:10]
    assert _kernel_pick(row, 1.0, 10, 1.0, 0.0, 1.0) == int(top10[-1])
    assert _kernel_pick(row, 0.0, 0, 1.0, 0.0, 0.5) == int(np.argmax(row))


def test_the_device_check_says_what_it_needs() -> None:
    from bench.gpu.kernels import run_kernel_checks

    if ck.available():
        pytest.skip("a GPU and CuPy are here: run nearshore gpu-check instead")
    with pytest.raises(RuntimeError, match="CUDA device and CuPy"):
        run_kernel_checks()


C_TYPES = {"long long": np.int64, "int": np.int32, "float": np.float32}
POINTEE = {"float": torch.float32, "int": torch.int32, "long long": torch.int64}


def _signature(code: str, start: str) -> list[tuple[str, str, bool]]:
    """(name, C type, is pointer) of each parameter of the list that opens at ``start``."""
    text = code[code.index(start) + len(start) :]
    if start.startswith("#define"):  # a macro's body: its continued lines
        text = re.match(r"(?:.*\\\n)*.*", text).group(0)
    else:
        text = text[: text.index(")")]
    text = text.replace("\\", " ")
    params = []
    for param in text.split(","):
        words = param.replace("*", " * ").replace("const", " ").replace("__restrict__", " ").split()
        pointer = "*" in words
        words = [w for w in words if w != "*"]
        params.append((words[-1], " ".join(words[:-1]), pointer))
    return params


def _check_call(call: ck.KernelCall, params: list[tuple[str, str, bool]], storage: torch.dtype) -> None:
    assert [name for name, _ in call.args] == [name for name, _, _ in params], call.kernel
    for (name, value), (_, c_type, pointer) in zip(call.args, params, strict=True):
        if pointer:
            assert isinstance(value, torch.Tensor), name
            assert value.dtype == (storage if c_type in ("S", "T::storage") else POINTEE[c_type]), name
        else:
            assert type(value) is C_TYPES[c_type], f"{call.kernel} {name}: {type(value)} for {c_type}"


@pytest.mark.parametrize("dtype", list(ck.DTYPE_NAMES))
def test_launch_arguments_follow_the_kernels_signatures(dtype: torch.dtype) -> None:
    attention = (kb.KERNEL_DIR / "paged_attention.cu").read_text()
    inputs = decode_inputs([5, 40, 700], 16, 60, 0, random.Random(2))
    q = torch.zeros(3, 4, 256, dtype=dtype)
    cache = torch.zeros(60, 16, 1, 256, dtype=dtype)
    out = torch.empty_like(q)
    table, lens = inputs.block_tables["g"], inputs.seq_lens
    decode, combine = ck.attention_calls(q, cache, cache, table, lens, 0.0625, 0, out, 700, 132)
    assert decode.kernel == ck.attention_kernel_name(dtype, 256) and decode.launch.grid[2] > 1
    _check_call(decode, _signature(attention, "#define ATTENTION_PARAMS(S)"), dtype)
    assert combine.kernel == f"paged_attention_combine_{ck.DTYPE_NAMES[dtype]}"
    _check_call(combine, _signature(attention, "paged_attention_combine_##DTYPE("), dtype)
    assert combine.launch == ck.combine_launch(3, 4)
    (only,) = ck.attention_calls(q, cache, cache, table, lens, 0.0625, 0, out, 700, 132, num_splits=1)
    assert only.kernel == decode.kernel and only.launch.grid[2] == 1

    sampling = (kb.KERNEL_DIR / "sampling.cu").read_text()
    rows = [
        SamplingRow(SamplingParams(temperature=0.8, top_k=5), seed=0),
        SamplingRow(SamplingParams(top_p=0.9), seed=0),
    ]
    a = ck.sampling_arrays(rows)
    tokens = torch.empty(2, dtype=torch.int64)
    logits = torch.zeros(2, 1000)
    params = (a["temperature"], a["top_k"], a["top_p"], a["min_p"], a["uniform"])
    call = ck.sampling_call(logits, *params, tokens)
    _check_call(call, _signature(sampling, "sample_from_logits("), torch.float32)
    with pytest.raises(ValueError, match="top_k"):
        ck.sampling_call(logits, params[0], params[1].long(), *params[2:], tokens)
    with pytest.raises(ValueError, match="vocabulary"):
        ck.sampling_call(torch.empty(2, ck.MAX_SAMPLING_VOCAB + 1), *params, tokens)
