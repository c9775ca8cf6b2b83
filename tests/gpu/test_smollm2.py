"""The torch model on the second embedded model, SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1):
its config from the GGUF's metadata, and teacher-forced parity with llama.cpp as for Gemma
(tests/gpu/test_model.py, bench/gpu/parity.py): exact against llama.cpp in fp32 on the F32 copy, and the
served file no further from llama.cpp than llama.cpp is from itself."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.gpu.parity import compare_sequences, dequantized_copy, open_llama, sample_continuation  # noqa: E402
from gpu.model import CausalLM  # noqa: E402
from gpu.model_config import GLOBAL, ModelConfig  # noqa: E402

pytestmark = pytest.mark.slow

# Chats as the node renders them (SmolLM2's ChatML template), each continued by a sampled answer.
CHATS = (
    "What is the capital of Nigeria?",
    "Give me three tips for staying cool in Lagos in March.",
    "Write a Python function that reverses a string.",
)


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    from regional.model_store import resolve_model_path

    return resolve_model_path("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> CausalLM:
    return CausalLM.load(smollm2_path)  # the user's cache: warm after the first run


def test_smollm2_config_from_metadata(smollm2: CausalLM, smollm2_path: Path) -> None:
    config = ModelConfig.from_gguf(smollm2_path)
    assert config == smollm2.config
    assert config.arch == "llama" and config.vocab_size == 49152 and config.num_layers == 30
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_size) == (9, 3, 64, 1536)
    assert config.layer_groups == (GLOBAL,) * 30 and config.sliding_window == 0
    assert config.rope_of(0) == (100_000.0, 1.0) and not config.rope_neox  # Llama: adjacent pairs
    assert config.tied_embeddings and config.embedding_scale == 1.0 and config.attention_scale == 1 / 8
    assert {0, 2} <= set(config.eos_ids)  # <|endoftext|> and <|im_end|>


def test_smollm2_teacher_forced_parity_with_llama_cpp(smollm2: CausalLM, smollm2_path: Path) -> None:
    """Three chats with sampled answers (about 60 tokens each) and one 300-token sequence of them all."""
    served = open_llama(smollm2_path, 512)
    prompts = [
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        f"<|im_end|>\n<|im_start|>user\n{chat}<|im_end|>\n<|im_start|>assistant\n"
        for chat in CHATS
    ]
    sequences = []
    for seed, prompt in enumerate(prompts):  # the template's markers as control tokens, no BOS (as served)
        tokens = served.tokenize(prompt.encode(), add_bos=False, special=True)
        sequences.append(tokens + sample_continuation(served, tokens, 60, seed))
    assert all(seq[0] == 1 for seq in sequences)  # <|im_start|>, one token
    joined = [t for seq in sequences for t in seq]
    sequences.append((joined * 3)[:300])
    result = compare_sequences(
        smollm2,
        sequences,
        served,
        open_llama(smollm2_path, 512, f32_kv=True),
        open_llama(dequantized_copy(smollm2_path), 512, f32_kv=True),
    )
    print(result.summary())
    assert result.exact is not None and result.exact.positions >= 400
    # Exact: llama.cpp in fp32 on the same weights.
    assert result.exact.top1 >= 0.99 and result.exact.mean_kl < 1e-4 and result.exact.max_kl < 1e-3
    # Served: no further from llama.cpp than llama.cpp is from itself with another KV precision.
    assert result.served.top1 >= 0.95
    assert result.served.mean_kl <= 2 * result.llama_self.mean_kl + 1e-3
