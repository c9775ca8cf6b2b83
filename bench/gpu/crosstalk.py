"""The no-cross-talk check of the torch engine, on any device: streams decoded together through the real
scheduler over paged blocks, with shared prefixes, chunked prefill, dropped sliding-window blocks and
preemption in play, each compared teacher-forced with the same stream run alone.

A block table, slot or window mask that pointed at another sequence's (or a reused) block would change a
stream's logits; batching itself may only move them by the device's rounding. Used by ``nearshore
gpu-check`` on a GPU and by the tests on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpu.kv_blocks import BlockTable, KvBlockManager
from gpu.kv_cache import PagedKvCache, block_manager_for
from gpu.model import CausalLM
from gpu.step_inputs import SeqChunk, build_step_inputs, chunks_from_rows
from regional.engine import GenerationRequest, SamplingParams
from regional.kv_paged import PagedMemory
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler, Sequence


@dataclass(frozen=True, slots=True)
class CrossTalk:
    sequences: int
    positions: int  # sampled rows compared
    max_abs_diff: float  # between a row's logits in the batch and alone
    top1_agreement: float
    preemptions: int
    prefix_hit_tokens: int
    steps: int

    def summary(self) -> str:
        return (
            f"{self.sequences} streams, {self.positions} positions: top-1 {100 * self.top1_agreement:.2f}%, "
            f"max |logit diff| {self.max_abs_diff:.2e}; {self.preemptions} preemptions, "
            f"{self.prefix_hit_tokens} prefix tokens shared, {self.steps} steps"
        )


def alone_logits(model: CausalLM, tokens: list[int], block_size: int) -> torch.Tensor:
    """Logits at every position of ``tokens``: one sequence in a fresh cache, one prefill."""
    num_blocks = len(tokens) // block_size + 3
    blocks = block_manager_for(model.config, num_blocks, block_size)
    kv = PagedKvCache(model.config, num_blocks, block_size, model.dtype, model.device)
    table = blocks.allocate(tokens, max_cached=0)
    blocks.append(table, tokens)
    inputs = build_step_inputs([SeqChunk(table, tokens, 0, [True] * len(tokens))], blocks.groups)
    return model.forward(inputs.to(model.device), kv)


def check_crosstalk(
    model: CausalLM,
    prompts: list[list[int]],
    max_tokens: int,
    num_blocks: int,
    block_size: int = 16,
    max_sequences: int = 8,
    batch_tokens: int = 256,
    prefill_chunk: int = 32,
    after_step: Callable[[KvBlockManager, list[BlockTable]], object] | None = None,
) -> CrossTalk:
    """Greedy streams of ``prompts`` through the scheduler in a pool of ``num_blocks`` (small enough to
    preempt), each sampled row compared with the stream's own prefill alone. ``after_step`` sees the block
    manager and the running sequences' tables after every step (the tests check its invariants there)."""
    blocks = block_manager_for(model.config, num_blocks, block_size)
    kv = PagedKvCache(model.config, num_blocks, block_size, model.dtype, model.device)
    sched = Scheduler(PagedMemory(blocks), max_sequences, batch_tokens, prefill_chunk, lambda _t: False)
    seqs = [
        Sequence(GenerationRequest(str(i), p, max_tokens), 0.0, TokenSampler(SamplingParams(0.0)))
        for i, p in enumerate(prompts)
    ]
    for seq in seqs:
        sched.add(seq)
    seen: dict[str, list[tuple[int, torch.Tensor]]] = {s.request_id: [] for s in seqs}
    steps = 0
    while sched.has_work:
        plan = sched.schedule(0.0)
        if plan.finished:
            raise ValueError("a stream cannot fit the pool even alone: give the check more blocks")
        if not plan.tokens:
            continue
        tables = {seq.slot: seq.blocks for seq, _ in plan.advances}
        chunks = chunks_from_rows(plan.tokens, plan.positions, plan.seq_ids, plan.want_logits, tables)
        logits = model.forward(build_step_inputs(chunks, blocks.groups).to(model.device), kv)
        row_of = {row: i for i, row in enumerate(r for r, want in enumerate(plan.want_logits) if want)}
        sampled = []
        for seq, row in plan.samples:
            row_logits = logits[row_of[row]].float().cpu()
            seen[seq.request_id].append((plan.positions[row], row_logits))
            sampled.append(int(torch.argmax(row_logits)))
        sched.postprocess(plan, sampled, 0.0)
        if after_step is not None:
            after_step(blocks, [s.blocks for s in sched.running])
        steps += 1
    worst, agree, total = 0.0, 0, 0
    for seq in seqs:
        reference = alone_logits(model, seq.prompt + seq.output[:-1], block_size).float().cpu()
        for position, row_logits in seen[seq.request_id]:
            worst = max(worst, float((row_logits - reference[position]).abs().max()))
            agree += int(row_logits.argmax() == reference[position].argmax())
            total += 1
    return CrossTalk(
        len(seqs),
        total,
        worst,
        agree / max(total, 1),
        sched.num_preemptions,
        blocks.usage().prefix_hit_tokens,
        steps,
    )
