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

from gpu.kv_blocks import GroupSpec, KvBlockManager
from gpu.kv_cache import PagedKvCache
from gpu.model import CausalLM
from gpu.model_config import GLOBAL, SLIDING, ModelConfig
from gpu.step_inputs import SeqChunk, build_step_inputs, chunks_from_rows
from regional.engine import GenerationRequest, SamplingParams
from regional.kv_paged import PagedMemory
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler, Sequence

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
    c = model.config
    groups = [GroupSpec(g, num_blocks, window=c.window_of(g) or None) for g in c.groups]
    return KvBlockManager(groups, BLOCK_SIZE)


def alone(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of ``tokens``, one sequence in a fresh cache, one prefill."""
    blocks = block_manager(model, num_blocks=64)
    kv = PagedKvCache(model.config, 64, BLOCK_SIZE)
    blocks.allocate(0, tokens, max_cached=0)
    blocks.append(0, tokens)
    inputs = build_step_inputs([SeqChunk(0, tokens, 0, [True] * len(tokens))], blocks)
    return model.forward(inputs, kv)


def test_streams_in_a_mixed_paged_batch_equal_each_stream_alone():
    model = tiny_gemma()
    blocks = block_manager(model, num_blocks=13)  # 12 usable blocks of 4: 48 tokens for five streams
    kv = PagedKvCache(model.config, 13, BLOCK_SIZE)
    sched = Scheduler(
        PagedMemory(blocks), 4, batch_tokens=24, prefill_chunk=5, is_end_of_generation=lambda t: False
    )
    shared = [5, 17, 29, 41, 53, 65, 77, 89, 3]  # a common prefix: shared blocks
    prompts = [[*shared, i, 2 * i + 1] for i in range(1, 4)] + [[11, 22, 33], list(range(40, 58))]
    seqs = [
        Sequence(GenerationRequest(str(i), p, 10), arrived_at=0.0, sampler=TokenSampler(SamplingParams(0.0)))
        for i, p in enumerate(prompts)
    ]
    for s in seqs:
        sched.add(s)
    seen: dict[str, list[tuple[int, torch.Tensor]]] = {s.request_id: [] for s in seqs}
    steps = 0
    while sched.has_work:
        plan = sched.schedule(0.0)
        assert not plan.finished
        rows = chunks_from_rows(plan.tokens, plan.positions, plan.seq_ids, plan.want_logits)
        logits = model.forward(build_step_inputs(rows, blocks), kv)
        row_of = {row: i for i, row in enumerate(r for r, want in enumerate(plan.want_logits) if want)}
        sampled = []
        for s, row in plan.samples:
            row_logits = logits[row_of[row]]
            seen[s.request_id].append((plan.positions[row], row_logits))
            sampled.append(int(torch.argmax(row_logits)))
        sched.postprocess(plan, sampled, 0.0)
        blocks.check_invariants()
        steps += 1
        assert steps < 500
    assert sched.num_preemptions > 0  # recomputes were in play
    assert blocks.usage().prefix_hit_tokens > 0  # and shared prefixes
    for s in seqs:
        assert len(s.output) == 10
        reference = alone(model, s.prompt + s.output[:-1])
        for position, row_logits in seen[s.request_id]:
            torch.testing.assert_close(row_logits, reference[position], rtol=1e-4, atol=1e-4)
        assert s.output == [int(t) for t in reference[len(s.prompt) - 1 :].argmax(-1)]
