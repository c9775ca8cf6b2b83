"""The CUDA kernels' own source executed on the CPU (tests/cuda_emulation.py: one thread per CUDA thread,
launched with gpu/cuda_kernels.py's numbers) against the torch path: paged decode attention against
gpu/attention.py, fused sampling against gpu/sampler.py's draw(). A GPU still checks them on the device
(bench/gpu/kernels.py); this catches indexing, barrier and reduction mistakes on every machine."""

from __future__ import annotations

import random

import pytest
import torch

from bench.gpu.kernels import check_attention, check_sampling, decode_inputs
from gpu import cuda_kernels as ck
from gpu.attention import paged_attention
from gpu.sampler import SamplingRow, draw, uniform
from nearshore.sampling import SamplingParams
from tests import cuda_emulation as emulated

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not emulated.available(), reason="no g++ to build the CPU emulation of the kernels"),
]
# Largest |kernel - reference| in units of the output's largest value: fp32 accumulation either way, so
# what is left is the output's own rounding.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "lens", "window", "dtype", "splits", "partition"),
    [
        # Gemma 3 270M's shape: a global layer, one split and three (combined), and a sliding layer whose
        # dropped blocks are the NaN-filled null block.
        (4, 1, 256, [1, 17, 100], 0, torch.float32, 1, 128),
        (4, 1, 256, [1, 17, 100], 0, torch.bfloat16, 3, 40),
        (4, 1, 256, [5, 40, 200], 64, torch.float16, 2, 32),
        # A group of 7 (Qwen2 0.5B) and a group of 16 split over two blocks per kv head.
        (14, 2, 64, [3, 33, 70], 0, torch.float32, 2, 64),
        (16, 1, 128, [16, 47], 20, torch.bfloat16, 1, 64),
        # The launcher's own choice: one long context alone is split over many blocks.
        (4, 1, 256, [700], 0, torch.bfloat16, None, None),
    ],
)
def test_attention_kernel_matches_the_torch_reference(
    heads: int,
    kv_heads: int,
    head_dim: int,
    lens: list[int],
    window: int,
    dtype: torch.dtype,
    splits: int | None,
    partition: int | None,
) -> None:
    torch.manual_seed(0)
    block_size = 16
    num_blocks = sum(-(-n // block_size) for n in lens) + 2
    inputs = decode_inputs(lens, block_size, num_blocks, window, random.Random(0))
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    k_cache[0], v_cache[0] = float("nan"), float("nan")  # block 0 is never to be read
    # q as the model makes it: a view into a fused projection's rows.
    fused = torch.randn(len(lens), (heads + 2 * kv_heads) * head_dim).to(dtype)
    q = fused[:, : heads * head_dim].view(len(lens), heads, head_dim)
    if splits is not None:
        keys = max(ck.visible_keys(n, window) for n in lens)
        assert (splits - 1) * partition < keys <= splits * partition
    scale = head_dim**-0.5

    got = emulated.paged_attention_decode(
        q, k_cache, v_cache, inputs.block_tables["g"], inputs.seq_lens, scale, window, splits, partition
    )
    want = paged_attention(q.float(), k_cache.float(), v_cache.float(), inputs, "g", window, scale)
    assert torch.isfinite(got.float()).all()
    error = (got.float() - want).abs().max().item() / want.abs().max().item()
    assert error <= TOLERANCE[dtype]


def test_sampling_kernel_picks_draws_token() -> None:
    gen = random.Random(5)
    torch.manual_seed(5)
    vocab = 1500
    params = [
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0),  # the plain draw
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=1.3, top_p=0.9),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.5, top_k=300, top_p=0.95, min_p=0.02),
        SamplingParams(temperature=1.0, top_k=2, top_p=0.3),
        SamplingParams(temperature=1.0, top_k=1),  # top-1 by the filters: the most likely token
    ]
    rows = [SamplingRow(p, seed=gen.getrandbits(63), index=gen.randrange(1000)) for p in params]
    logits = torch.randn(len(rows) + 1, vocab) * 2
    logits[:, :30] += torch.rand(len(rows) + 1, 1) * 6
    arrays = ck.sampling_arrays(rows)
    # One more row at temperature 0: greedy, the first index of the maximum (as torch.argmax).
    logits[-1, 77] = logits[-1, 901] = logits[-1].max() + 1
    arrays = {k: torch.cat([v, v[:1]]) for k, v in arrays.items()}
    arrays["temperature"][-1] = 0.0

    got = emulated.sample_from_logits(logits, arrays)

    assert got[:-1] == draw(logits[:-1], rows).tolist()
    assert got[-1] == 77
    assert got[-2] == int(logits[-2].argmax())


def _seeds_drawing_near_one(count: int) -> list[int]:
    """Seeds whose first uniform is above 0.9999: their draw is the least likely token the filters keep."""
    return [s for s in range(200_000) if uniform(s, 0) > 0.9999][:count]


def test_sampling_kernel_keeps_what_the_filters_keep() -> None:
    torch.manual_seed(6)
    vocab = 1200
    params = [
        SamplingParams(temperature=1.0, top_k=2),
        SamplingParams(temperature=1.0, top_k=40),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=1.0, min_p=0.5),
        SamplingParams(temperature=2.0, top_k=100, top_p=0.3, min_p=0.9),
    ]
    rows = [SamplingRow(p, seed=s) for p, s in zip(params, _seeds_drawing_near_one(len(params)), strict=True)]
    logits = torch.randn(len(rows), vocab) * 0.5  # flat: the last kept token has a visible share
    want = draw(logits, rows)
    probs = torch.softmax(logits / torch.tensor([p.temperature for p in params])[:, None], dim=-1)
    ranks = [int((probs[i] > probs[i, t]).sum()) for i, t in enumerate(want.tolist())]
    assert ranks[:2] == [1, 39]  # the k-th most likely: the reference itself draws at the filter's edge

    got = emulated.sample_from_logits(logits, ck.sampling_arrays(rows))

    assert got == want.tolist()


def test_sampling_kernel_never_draws_a_forbidden_token_at_the_top_of_the_uniforms_range() -> None:
    # A grammar's mask leaves a few tokens; a draw whose u rounds to 1 takes the least likely allowed one,
    # never a forbidden token of weight 0 (draw() the same).
    torch.manual_seed(7)
    vocab = 900
    rows = [SamplingRow(SamplingParams(temperature=t), seed=s) for s, t in enumerate((0.5, 1.0, 2.0))]
    logits = torch.full((len(rows), vocab), float("-inf"))
    allowed = torch.randperm(vocab)[:5]
    logits[:, allowed] = torch.randn(len(rows), 5)
    arrays = ck.sampling_arrays(rows)
    arrays["uniform"] = torch.full_like(arrays["uniform"], 1.0)

    got = emulated.sample_from_logits(logits, arrays)

    least_likely = [int(allowed[logits[i, allowed].argmin()]) for i in range(len(rows))]
    assert got == least_likely


def test_the_device_checks_pass_through_the_emulation() -> None:
    """bench/gpu/kernels.py's checks, with the emulation standing in for the device: the script's own
    inputs, references and verdicts run here, and fail as they would on a GPU when a kernel is wrong."""

    def attention(q, k_cache, v_cache, table, seq_lens, scale, window, *, max_seq_len, num_splits):
        assert max_seq_len >= int(seq_lens.max())
        args = (q, k_cache, v_cache, table, seq_lens, scale, window)
        return emulated.paged_attention_decode(*args, num_splits)

    def sampling(logits, temperature, top_k, top_p, min_p, uniform_draws):
        arrays = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
        return torch.tensor(emulated.sample_from_logits(logits, {**arrays, "uniform": uniform_draws}))

    check = check_attention(4, 1, 256, [1, 17, 100], window=64, device="cpu", kernel_fn=attention, repeats=1)
    assert check.passed, check
    check = check_sampling(num_rows=6, vocab=1000, device="cpu", kernel_fn=sampling, repeats=1)
    assert check.passed, check

    def off_by_one(q, k_cache, v_cache, table, seq_lens, scale, window, **kwargs):
        return attention(q, k_cache, v_cache, table, seq_lens - 1, scale, window, **kwargs)

    wrong = check_attention(4, 1, 64, [3, 40], device="cpu", kernel_fn=off_by_one, repeats=1)
    assert not wrong.passed
