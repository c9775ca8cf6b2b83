"""The torch model (gpu/): config from GGUF metadata, weight cache, paged equivalence, llama.cpp parity.

Parity is teacher-forced: both engines read the same tokens and their next-token distributions are compared
at every position. Against the quantised GGUF llama.cpp's own arithmetic (8-bit activations in its matmuls,
fp16 KV) moves distributions as much as any difference between two correct models, so the exact check runs
on the GGUF's F32 copy with an fp32 KV cache, and the served file is checked against llama.cpp's noise floor.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench.gpu.parity import (  # noqa: E402
    compare_logits,
    compare_sequences,
    dequantized_copy,
    llama_cpp_logits,
    open_llama,
    torch_logits,
)
from gpu.gguf_weights import dequantize_gguf, gguf_sha256, load_weights  # noqa: E402
from gpu.kv_cache import PagedKvCache, blocks_that_fit, bytes_per_block  # noqa: E402
from gpu.model import CONFIG_FILE, CausalLM  # noqa: E402
from gpu.model_config import GLOBAL, SLIDING, ModelConfig, UnsupportedModelError  # noqa: E402
from tests.gguf_fixtures import write_tiny_gguf  # noqa: E402
from tests.gpu_paging import BlockBook  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    from regional.model_store import resolve_model_path

    return resolve_model_path("")


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> CausalLM:
    return CausalLM.load(gemma_path)  # the user's cache: warm after the first run


# --- config ------------------------------------------------------------------------------------------


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(UnsupportedModelError, match=r"'mamba'.*gemma3, llama, qwen2"):
        ModelConfig.from_gguf(path)
    with pytest.raises(UnsupportedModelError):
        CausalLM.load(path, cache_root=tmp_path / "cache")


@pytest.mark.slow
def test_gemma3_config_from_metadata(gemma: CausalLM, gemma_path: Path) -> None:
    config = ModelConfig.from_gguf(gemma_path)
    assert config == gemma.config  # the copy cached beside the weights reads back the same
    assert config.arch == "gemma3" and config.vocab_size == 262144 and config.num_layers == 18
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 1, 256)
    # Five sliding-window layers, then a global one; RoPE 10k locally, the file's 1M globally.
    assert config.layer_groups == ((SLIDING,) * 5 + (GLOBAL,)) * 3
    assert config.sliding_window == 512
    assert config.rope_of(0) == (10_000.0, 1.0) and config.rope_of(5) == (1_000_000.0, 1.0)
    assert config.attention_scale == 1 / 16  # query_pre_attn_scalar = head_dim
    assert config.embedding_scale == pytest.approx(math.sqrt(640))
    assert config.tied_embeddings and config.rope_neox and not config.final_logit_softcap
    assert {1, 106} <= set(config.eos_ids)  # <eos> and <end_of_turn>


def test_kv_cache_sizing_and_write() -> None:
    config = _toy_config()
    per_block = bytes_per_block(config, SLIDING, 4, torch.float32)
    assert per_block == 2 * 4 * config.num_kv_heads * config.head_dim * 4 * len(config.layers_of(SLIDING))
    both = per_block + bytes_per_block(config, GLOBAL, 4, torch.float32)
    assert blocks_that_fit(config, 10 * both + both // 2, 4) == {GLOBAL: 10, SLIDING: 10}
    kv = PagedKvCache(config, {GLOBAL: 6, SLIDING: 3}, block_size=4)
    assert kv.k[0].shape == (3, 4, config.num_kv_heads, config.head_dim)  # layer 0 is sliding
    assert kv.k[2].shape == (6, 4, config.num_kv_heads, config.head_dim)
    assert kv.total_bytes == 2 * (2 * 3 + 6) * 4 * config.num_kv_heads * config.head_dim * 4
    k = torch.randn(2, config.num_kv_heads, config.head_dim)
    kv.write(2, torch.tensor([5, 22]), k, -k)  # block 1 slot 1, block 5 slot 2
    assert torch.equal(kv.k[2][1, 1], k[0]) and torch.equal(kv.v[2][5, 2], -k[1])
    with pytest.raises(ValueError, match="at least 2 blocks"):
        PagedKvCache(config, 1)


def _toy_config() -> ModelConfig:
    return ModelConfig(
        arch="gemma3", vocab_size=10, hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=1,
        head_dim=4, ffn_size=16, rms_eps=1e-6, rope_base=1e6, rope_base_local=1e4, rope_linear_factor=1.0,
        rope_neox=True, sliding_window=8, layer_groups=(SLIDING, SLIDING, GLOBAL), attention_scale=0.5,
        embedding_scale=1.0, tied_embeddings=True, final_logit_softcap=0.0, eos_ids=(1,), bos_id=2,
    )  # fmt: skip


# --- the weight cache --------------------------------------------------------------------------------


def test_weight_cache_hits_and_rebuilds_a_truncated_file(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "cache"
    expected = dequantize_gguf(path)
    first = load_weights(path, cache_root=root)
    assert not first.cache_hit and first.cache_file is not None and first.cache_file.is_file()
    size = first.cache_file.stat().st_size
    second = load_weights(path, cache_root=root)
    assert second.cache_hit and second.gguf_sha256 == first.gguf_sha256
    assert second.tensors.keys() == expected.keys()
    assert all(torch.equal(second.tensors[n], expected[n]) for n in expected)

    with first.cache_file.open("r+b") as handle:  # a crash mid-copy, a full disk: half a file
        handle.truncate(size // 2)
    third = load_weights(path, cache_root=root)
    assert not third.cache_hit and first.cache_file.stat().st_size == size
    assert all(torch.equal(third.tensors[n], expected[n]) for n in expected)
    assert load_weights(path, cache_root=root).cache_hit
    assert not list(root.rglob("*.part"))


def test_sha256_is_remembered_by_path_size_and_mtime(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    root = tmp_path / "cache"
    digest = gguf_sha256(path, root)
    stat = path.stat()
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=2).read_bytes()
    assert len(other) == stat.st_size
    path.write_bytes(other)  # same size; the old mtime put back: the sidecar answers, no re-hash
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert gguf_sha256(path, root) == digest
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert gguf_sha256(path, root) != digest


def test_model_load_caches_its_config_and_reports_the_hit(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "cache"
    cold = CausalLM.load(path, cache_root=root)
    warm = CausalLM.load(path, cache_root=root)
    assert cold.weights_info is not None and not cold.weights_info.cache_hit
    assert warm.weights_info is not None and warm.weights_info.cache_hit
    assert warm.config == cold.config == ModelConfig.from_gguf(path)
    config_file = root / warm.weights_info.gguf_sha256 / CONFIG_FILE
    config_file.write_text('{"format": 1, "arch": "llama"')  # damaged: read from the GGUF again
    again = CausalLM.load(path, cache_root=root)
    assert again.config == cold.config and json.loads(config_file.read_text())["arch"] == "llama"


# --- the Llama / Qwen2 family: tiny random models that llama.cpp loads -------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_family_matches_llama_cpp(tmp_path: Path, arch: str) -> None:
    # Llama untied, RoPE on adjacent pairs; Qwen2 with q/k/v biases, NEOX RoPE, tied output.
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch, tied=arch == "qwen2")
    model = CausalLM.load(path, cache_root=tmp_path / "cache")
    assert model.config.rope_neox == (arch == "qwen2")
    assert model.config.tied_embeddings == (arch == "qwen2")
    llm = open_llama(path, 128, f32_kv=True)  # F32 weights and KV: llama.cpp computes in fp32
    rng = np.random.default_rng(7)
    for length in (9, 45, 100):
        tokens = [1, *rng.integers(3, model.config.vocab_size, length - 1).tolist()]
        reference = llama_cpp_logits(llm, tokens)
        mine = torch_logits(model, tokens, chunk_tokens=32, block_size=4)
        agree, kl = compare_logits(reference, mine)
        assert agree.all() and kl.max() < 1e-6
        centred = (reference - reference.mean(1, keepdims=True)) - (mine - mine.mean(1, keepdims=True))
        assert np.abs(centred).max() < 1e-3


# --- paged equivalence on Gemma 3 --------------------------------------------------------------------


@pytest.mark.slow
def test_paged_steps_give_the_logits_of_one_prefill(gemma: CausalLM, gemma_path: Path) -> None:
    """One prefill, chunks then token-by-token decode, and a mixed batch give the same logits.

    A window of 8 and blocks of 4 make the sliding layers drop blocks within a few steps; dropped blocks are
    poisoned with NaN and handed to other sequences, so reading one shows."""
    config = replace(gemma.config, sliding_window=8)
    model = CausalLM(config, load_weights(gemma_path).tensors).eval()
    rng = np.random.default_rng(3)
    seqs = {s: rng.integers(3, 50_000, n).tolist() for s, n in ((0, 30), (1, 19), (2, 11))}

    def fresh() -> tuple[BlockBook, PagedKvCache]:
        return BlockBook(config, 40, block_size=4), PagedKvCache(config, 40, block_size=4)

    def single(seq: int) -> torch.Tensor:
        book, kv = fresh()
        return model(book.step([(seq, seqs[seq])]), kv)

    reference = {s: single(s) for s in seqs}

    book, kv = fresh()  # (b) chunks of 7 and 10, then one token a step
    steps = [seqs[0][:7], seqs[0][7:17], *([t] for t in seqs[0][17:])]
    dropped = 0
    rows = []
    for new in steps:
        rows.append(model(book.step([(0, new)]), kv))
        dropped += book.drop_out_of_window(0, kv)
    assert dropped >= 4
    _assert_same(torch.cat(rows), reference[0])

    book, kv = fresh()  # (c) a mixed batch: prefill chunks and decodes of three sequences in each step
    out: dict[int, list[torch.Tensor]] = {s: [] for s in seqs}
    plan = [
        [(1, seqs[1][:6])],
        [(0, seqs[0][:9]), (1, seqs[1][6:7])],
        [(1, seqs[1][7:8]), (2, seqs[2][:11]), (0, seqs[0][9:20])],
        *([(0, seqs[0][i : i + 1]), (1, seqs[1][i - 12 : i - 11])] for i in range(20, 30)),
        [(1, seqs[1][18:19])],
    ]
    for step in plan:
        logits = model(book.step(step), kv)
        start = 0
        for seq, new in step:
            out[seq].append(logits[start : start + len(new)])
            start += len(new)
        for seq, _ in step:
            book.drop_out_of_window(seq, kv)
    for seq in seqs:
        _assert_same(torch.cat(out[seq]), reference[seq])


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-4)


# --- teacher-forced parity with llama.cpp on the embedded Gemma 3 ------------------------------------

SHORT_PROMPTS = (
    "The history of the printing press begins in Mainz, where Johannes Gutenberg",
    "Here is a simple recipe for jollof rice: first, blend the tomatoes and peppers",
    "Photosynthesis is the process by which plants turn light into chemical energy.",
)


@pytest.mark.slow
def test_gemma_teacher_forced_parity_with_llama_cpp(gemma: CausalLM, gemma_path: Path) -> None:
    """Three short prompts and a 700-token text scored past the 512-token window (positions 440..699)."""
    served = open_llama(gemma_path, 768)
    questions = [json.loads(line)["a"] for line in (REPO / "cache/data/pairs.jsonl").open()]
    long_text = served.tokenize("\n".join(questions).encode(), add_bos=True)[:700]
    assert len(long_text) == 700
    sequences = [served.tokenize(p.encode(), add_bos=True) for p in SHORT_PROMPTS] + [long_text]
    result = compare_sequences(
        gemma,
        sequences,
        served,
        open_llama(gemma_path, 768, f32_kv=True),
        open_llama(dequantized_copy(gemma_path), 768, f32_kv=True),
        logit_from=[0, 0, 0, 440],
    )
    print(result.summary())
    assert result.exact is not None and result.exact.positions >= 300
    # Exact: llama.cpp in fp32 on the same weights.
    assert result.exact.top1 >= 0.99 and result.exact.mean_kl < 1e-4 and result.exact.max_kl < 1e-3
    # Served: no further from llama.cpp than llama.cpp is from itself with another KV precision.
    assert result.served.top1 >= 0.95
    assert result.served.mean_kl <= 2 * result.llama_self.mean_kl + 1e-3


# --- the reference attention against dense attention -------------------------------------------------


@pytest.mark.parametrize("window", [0, 5])
def test_paged_attention_matches_dense_attention(window: int) -> None:
    """Mixed prefill and decode rows, GQA (4 query heads on 2 kv heads), shuffled blocks of 4, a window."""
    from gpu.attention import paged_attention
    from gpu.step_inputs import StepInputs

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim, block_size, scale = 4, 2, 8, 4, 0.3
    group = SLIDING if window else GLOBAL
    # (tokens already cached, tokens this step) per sequence: prefill, decode, a chunk after a prefix.
    shapes = [(0, 9), (13, 1), (6, 7), (21, 1)]
    free = torch.randperm(40, generator=gen)[:30].add(1).tolist()  # ids 1..40, never the null block
    k_cache = torch.randn(41, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(41, block_size, kv_heads, head_dim, generator=gen)
    tables, positions, query_start, dense = [], [], [0], []
    for cached, new in shapes:
        length = cached + new
        table = [free.pop() for _ in range(-(-length // block_size))]
        tables.append(table + [0] * (8 - len(table)))
        positions += range(cached, length)
        query_start.append(query_start[-1] + new)
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(length)])
        dense.append(
            (k_cache.view(-1, kv_heads, head_dim)[slots], v_cache.view(-1, kv_heads, head_dim)[slots])
        )
    rows = query_start[-1]
    q = torch.randn(rows, heads, head_dim, generator=gen)
    inputs = StepInputs(
        tokens=torch.zeros(rows, dtype=torch.int64),
        positions=torch.tensor(positions),
        query_start=torch.tensor(query_start, dtype=torch.int32),
        seq_lens=torch.tensor([c + n for c, n in shapes], dtype=torch.int32),
        block_tables={group: torch.tensor(tables, dtype=torch.int32)},
        slot_mapping={group: torch.zeros(rows, dtype=torch.int64)},
        logit_rows=torch.arange(rows),
        max_query_len=9,
        max_seq_len=22,
    )
    got = paged_attention(q, k_cache, v_cache, inputs, group, window, scale)
    for i, (keys, values) in enumerate(dense):
        for row in range(query_start[i], query_start[i + 1]):
            pos = positions[row]
            seen = [j for j in range(pos + 1) if not window or pos - j < window]
            for h in range(heads):
                kv = h // (heads // kv_heads)
                weights = torch.softmax(keys[seen, kv] @ q[row, h] * scale, dim=0)
                torch.testing.assert_close(got[row, h], weights @ values[seen, kv])


def test_bf16_model_tracks_fp32(tmp_path: Path) -> None:
    """The GPU's dtype on the CPU: weights cached per dtype, KV in bf16, logits near fp32's."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=4)
    root = tmp_path / "cache"
    full = CausalLM.load(path, cache_root=root)
    half = CausalLM.load(path, dtype=torch.bfloat16, cache_root=root)
    assert half.dtype == torch.bfloat16 and half.weights_info is not None
    assert half.weights_info.cache_file is not None and half.weights_info.cache_file.name.endswith(
        "bfloat16.safetensors"
    )
    tokens = [1, *np.random.default_rng(5).integers(3, full.config.vocab_size, 59).tolist()]
    want, got = torch_logits(full, tokens, block_size=4), torch_logits(half, tokens, block_size=4)
    agree, kl = compare_logits(want, got)
    assert agree.mean() >= 0.95 and kl.mean() < 0.01
