"""On a GPU: each CUDA kernel against its torch reference on random inputs, and their times.

- paged decode attention (gpu/cuda_kernels.py) against gpu/attention.py's paged_attention on decode rows,
  computed in fp32 from the same bf16/fp16 inputs; Gemma 3 270M's shape (4 heads, 1 kv head, head_dim 256)
  and two GQA shapes, full and sliding-window layers, one split and several. Blocks outside a sequence's
  window or table are filled with NaN, so a kernel that reads one fails.
- fused sampling against gpu/sampler.py's draw() (and argmax for greedy rows) with the same uniforms: the
  same token on (nearly) every row; a differing row must be a near-tie in the reference's own order.

``run_kernel_checks()`` returns the results; ``nearshore gpu-check`` prints them. Needs CUDA and CuPy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpu import cuda_kernels
from gpu.attention import paged_attention
from gpu.sampler import SamplingRow, draw
from gpu.step_inputs import StepInputs
from nearshore.sampling import SamplingParams

# Largest |kernel - reference| allowed, relative to the reference's largest value, per storage dtype.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}
MIN_SAMPLING_AGREEMENT = 0.99


@dataclass(frozen=True, slots=True)
class KernelCheck:
    name: str
    passed: bool
    detail: str
    kernel_ms: float
    reference_ms: float


def _time_ms(fn: Callable[[], object], device: torch.device, repeats: int = 20) -> float:
    fn()
    if device.type != "cuda":
        start_s = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start_s) * 1000 / repeats
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def decode_inputs(
    seq_lens: list[int], block_size: int, num_blocks: int, window: int, gen: random.Random
) -> StepInputs:
    """StepInputs for one decode row per sequence, block ids shuffled over the pool; blocks wholly before a
    sliding window point at the null block 0, as gpu/kv_blocks.py leaves them."""
    ids = list(range(1, num_blocks))
    gen.shuffle(ids)
    width = max(-(-n // block_size) for n in seq_lens)
    tables, slots = [], []
    for n in seq_lens:
        used = -(-n // block_size)
        table = [ids.pop() for _ in range(used)]
        if window:
            dead = max(0, (n - window) // block_size)
            table[:dead] = [0] * dead
        tables.append(table + [0] * (width - used))
        slots.append(table[(n - 1) // block_size] * block_size + (n - 1) % block_size)
    s = len(seq_lens)
    return StepInputs(
        tokens=torch.zeros(s, dtype=torch.int64),
        positions=torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64),
        query_start=torch.arange(s + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables={"g": torch.tensor(tables, dtype=torch.int32)},
        slot_mapping={"g": torch.tensor(slots, dtype=torch.int64)},
        logit_rows=torch.arange(s, dtype=torch.int64),
        max_query_len=1,
        max_seq_len=max(seq_lens),
    )


def check_attention(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: list[int],
    window: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    num_splits: int | None = None,
    block_size: int = 16,
    seed: int = 0,
    device: str = "cuda",
    kernel_fn: Callable[..., torch.Tensor] | None = None,  # cuda_kernels.paged_attention_decode's signature
    repeats: int = 20,
) -> KernelCheck:
    """The decode kernel against the torch reference on random inputs; ``kernel_fn`` and ``device`` let the
    tests run the same check through the CPU emulation."""
    kernel_fn = kernel_fn or cuda_kernels.paged_attention_decode
    device = torch.device(device)
    gen = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 2
    inputs = decode_inputs(seq_lens, block_size, num_blocks, window, gen).to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device).to(dtype)
    v_cache = torch.randn(shape, device=device).to(dtype)
    k_cache[0], v_cache[0] = float("nan"), float("nan")  # the null block: never to be read
    q = torch.randn(len(seq_lens), num_heads, head_dim, device=device).to(dtype)
    scale = head_dim**-0.5
    table = inputs.block_tables["g"]

    def kernel() -> torch.Tensor:
        return kernel_fn(
            q, k_cache, v_cache, table, inputs.seq_lens, scale, window,
            max_seq_len=inputs.max_seq_len, num_splits=num_splits,
        )  # fmt: skip

    def reference() -> torch.Tensor:
        return paged_attention(q.float(), k_cache.float(), v_cache.float(), inputs, "g", window, scale)

    got, want = kernel().float(), reference()
    error = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    passed = bool(torch.isfinite(got).all()) and error <= TOLERANCE[dtype]
    name = (
        f"attention {num_heads}/{num_kv_heads}x{head_dim} {str(dtype)[6:]} S={len(seq_lens)} "
        f"max_len={max(seq_lens)} window={window} splits={num_splits or 'auto'}"
    )
    kv_bytes = (
        sum(min(n, window or n) for n in seq_lens) * 2 * num_kv_heads * head_dim * k_cache.element_size()
    )
    kernel_ms = _time_ms(kernel, device, repeats)
    detail = f"max rel error {error:.2e}; {kv_bytes / kernel_ms / 1e6:.0f} GB/s of KV"
    return KernelCheck(name, passed, detail, kernel_ms, _time_ms(reference, device, min(repeats, 3)))


def _sampling_rows(num_rows: int, gen: random.Random) -> list[SamplingRow]:
    rows = []
    for i in range(num_rows):
        kind = i % 5
        rows.append(
            SamplingRow(
                SamplingParams(
                    temperature=gen.choice([0.5, 0.8, 1.0, 1.3]),
                    top_k=gen.choice([0, 1, 5, 40, 1000]) if kind in (1, 4) else 0,
                    top_p=gen.choice([0.5, 0.9, 0.95]) if kind in (2, 4) else 1.0,
                    min_p=gen.choice([0.02, 0.1]) if kind in (3, 4) else 0.0,
                ),
                seed=gen.getrandbits(63),
                index=gen.randrange(1000),
            )
        )
    return rows


def check_sampling(
    num_rows: int = 256,
    vocab: int = 262_144,
    seed: int = 0,
    device: str = "cuda",
    kernel_fn: Callable[..., torch.Tensor] | None = None,  # cuda_kernels.sample_from_logits's signature
    repeats: int = 20,
) -> KernelCheck:
    """The sampling kernel against draw() (argmax on greedy rows) on random peaked rows."""
    kernel_fn = kernel_fn or cuda_kernels.sample_from_logits
    device = torch.device(device)
    gen = random.Random(seed)
    torch.manual_seed(seed)
    # Peaked rows, like a model's: a few large logits over a long tail.
    logits = torch.randn(num_rows, vocab, device=device) * 2
    logits[:, :64] += torch.rand(num_rows, 1, device=device) * 12
    rows = _sampling_rows(num_rows, gen)
    arrays = {k: t.to(device) for k, t in cuda_kernels.sampling_arrays(rows).items()}
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    drawn = [i for i, r in enumerate(rows) if not r.params.greedy]
    arrays["temperature"][greedy] = 0.0  # top_k == 1 is greedy in sample(); the kernel's greedy is T <= 0

    def kernel() -> torch.Tensor:
        return kernel_fn(
            logits,
            arrays["temperature"],
            arrays["top_k"],
            arrays["top_p"],
            arrays["min_p"],
            arrays["uniform"],
        )

    def reference() -> torch.Tensor:
        want = logits.argmax(dim=-1)
        if drawn:
            index = torch.tensor(drawn, device=device)
            want[index] = draw(logits[index], [rows[i] for i in drawn])
        return want

    got, want = kernel(), reference()
    differ = (got != want).nonzero().flatten().tolist()
    near_ties = [i for i in differ if _near_tie(logits[i], rows[i], int(got[i]), int(want[i]))]
    agreement = 1 - len(differ) / num_rows
    greedy_exact = all(int(got[i]) == int(want[i]) for i in greedy)
    passed = agreement >= MIN_SAMPLING_AGREEMENT and len(near_ties) == len(differ) and greedy_exact
    detail = f"{num_rows - len(differ)}/{num_rows} rows agree; differing rows near ties: {len(near_ties)}"
    name = f"sampling rows={num_rows} vocab={vocab}"
    kernel_ms, reference_ms = _time_ms(kernel, device, repeats), _time_ms(reference, device, min(repeats, 3))
    return KernelCheck(name, passed, detail, kernel_ms, reference_ms)


def _near_tie(row_logits: torch.Tensor, row: SamplingRow, got: int, want: int) -> bool:
    """Whether two picks can differ by rounding alone: equal probabilities (an order the sort may break
    either way), or neighbours in the descending order (a cumulative sum or a filter's cutoff rounded to the
    other side of the target)."""
    probs = torch.softmax(row_logits.double() / row.params.temperature, dim=-1)
    a, b = probs[got].item(), probs[want].item()
    rank_a, rank_b = int((probs > a).sum()), int((probs > b).sum())
    return abs(a - b) <= 1e-6 * max(a, b) or abs(rank_a - rank_b) <= 1


def run_kernel_checks() -> list[KernelCheck]:
    if not cuda_kernels.available():
        raise RuntimeError("the kernel checks need a CUDA device and CuPy (pip install 'nearshore[gpu]')")
    lens = [1, 17, 100, 511, 512, 513, 1000, 2048]
    checks = [
        check_attention(4, 1, 256, lens),  # Gemma 3 270M, global layer, split by the launcher
        check_attention(4, 1, 256, lens, window=512),  # its sliding layers
        check_attention(4, 1, 256, lens, num_splits=1),
        check_attention(4, 1, 256, lens, dtype=torch.float16, num_splits=3),
        check_attention(32, 8, 128, lens, dtype=torch.float32),
        check_attention(14, 2, 64, lens, window=100),  # Qwen2-0.5B: a group of 7
        check_attention(16, 1, 256, lens[:4]),  # a group of 16: four blocks per kv head
        check_attention(4, 1, 256, [4096] * 64),  # batch 64 for the timing
        check_sampling(num_rows=256),
        check_sampling(num_rows=1),
        check_sampling(num_rows=64, vocab=32_000, seed=1),
    ]
    return checks


def main() -> int:
    start = time.perf_counter()
    checks = run_kernel_checks()
    for c in checks:
        print(
            f"{'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}; kernel {c.kernel_ms:.3f} ms, "
            f"torch {c.reference_ms:.3f} ms"
        )
    elapsed_s = time.perf_counter() - start
    print(f"{sum(c.passed for c in checks)}/{len(checks)} kernel checks passed in {elapsed_s:.1f} s")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
