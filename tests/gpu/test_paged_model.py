"""The paged bookkeeping under the real torch model: no cross-talk.

A tiny random-weight Gemma 3 (sliding and global layers) decodes several greedy streams through the
shared scheduler over paged blocks, with prefix-shared blocks, chunked prefill, sliding-window blocks
dropped and reused, and preemption (the pool is small). Every sampled row's logits must equal those of
the same sequence run alone in a fresh cache (teacher-forced): a block table, slot or window that
pointed at another sequence's (or a reused) block would change them.
"""

from __future__ import annotations

import math

import torch

from bench.gpu.crosstalk import check_crosstalk
from gpu.kv_blocks import KvBlockManager
from gpu.kv_cache import block_manager_for
from gpu.model import CausalLM
from gpu.model_config import GLOBAL, SLIDING, ModelConfig

BLOCK_SIZE = 4
HEAD_DIM = 8


def tiny_gemma(seed: int = 0) -> CausalLM:
    config = ModelConfig(
        arch="gemma3",
        vocab_size=97,
        hidden_size=32,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        ffn_size=48,
        rms_eps=1e-6,
        rope_base=1_000_000.0,
        rope_base_local=10_000.0,
        rope_linear_factor=1.0,
        rope_neox=True,
        sliding_window=6,
        layer_groups=(SLIDING, SLIDING, GLOBAL),
        attention_scale=HEAD_DIM**-0.5,
        embedding_scale=math.sqrt(32),
        tied_embeddings=True,
        final_logit_softcap=0.0,
        eos_ids=(),
        bos_id=None,
    )
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen) * 0.3  # noqa: E731
    ones = lambda n: 1.0 + torch.randn(n, generator=gen) * 0.1  # noqa: E731
    weights = {"token_embd.weight": rand(97, 32), "output_norm.weight": ones(32)}
    for i in range(config.num_layers):
        p = f"blk.{i}."
        for norm in ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"):
            weights[p + norm + ".weight"] = ones(32)
        weights[p + "attn_q_norm.weight"] = ones(HEAD_DIM)
        weights[p + "attn_k_norm.weight"] = ones(HEAD_DIM)
        weights[p + "attn_q.weight"] = rand(4 * HEAD_DIM, 32)
        weights[p + "attn_k.weight"] = rand(2 * HEAD_DIM, 32)
        weights[p + "attn_v.weight"] = rand(2 * HEAD_DIM, 32)
        weights[p + "attn_output.weight"] = rand(32, 4 * HEAD_DIM)
        weights[p + "ffn_gate.weight"] = rand(48, 32)
        weights[p + "ffn_up.weight"] = rand(48, 32)
        weights[p + "ffn_down.weight"] = rand(32, 48)
    return CausalLM(config, weights)


def block_manager(model: CausalLM, num_blocks: int) -> KvBlockManager:
    return block_manager_for(model.config, num_blocks, BLOCK_SIZE)


def test_streams_in_a_mixed_paged_batch_equal_each_stream_alone():
    model = tiny_gemma()
    shared = [5, 17, 29, 41, 53, 65, 77, 89, 3]  # a common prefix: shared blocks
    prompts = [[*shared, i, 2 * i + 1] for i in range(1, 4)] + [[11, 22, 33], list(range(40, 58))]
    result = check_crosstalk(  # 12 usable blocks of 4: 48 tokens for five streams
        model,
        prompts,
        max_tokens=10,
        num_blocks=13,
        block_size=BLOCK_SIZE,
        max_sequences=4,
        batch_tokens=24,
        prefill_chunk=5,
        after_step=lambda blocks, live: blocks.check_invariants(live),
    )
    assert result.positions == 50 and result.top1_agreement == 1.0
    assert result.max_abs_diff < 1e-4, result.max_abs_diff
    assert result.preemptions > 0  # recomputes were in play
    assert result.prefix_hit_tokens > 0  # and shared prefixes
