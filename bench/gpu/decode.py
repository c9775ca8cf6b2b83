"""Decode-step timing against the memory-bandwidth floor.

A decode step reads every weight once and every running sequence's keys and values once; on a GPU at
moderate batch sizes that traffic, not arithmetic, sets the time. So the floor of a step is
``(weight bytes + KV bytes read) / copy bandwidth``, with the bandwidth measured on the same device by a
large device-to-device copy, and the figure that matters is how far above the floor a step runs.

Used by ``nearshore gpu-check``; runs on the CPU too (the same code, small sizes), which is how its tests
check it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from gpu.decode_graphs import DecodeGraphs
from gpu.kv_cache import PagedKvCache, block_manager_for
from gpu.model import CausalLM, decode_kernel_usable
from gpu.step_inputs import SeqChunk, build_step_inputs


@dataclass(frozen=True, slots=True)
class DecodeTiming:
    batch: int
    context_tokens: int
    graphs: bool
    step_ms: float  # median
    tokens_per_s: float
    bytes_per_step: int
    floor_ms: float
    over_floor: float  # step_ms / floor_ms

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (read + write), the median of ``repeats``."""
    source = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm up
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return 2 * source.numel() / sorted(times)[len(times) // 2]


def weight_bytes(model: CausalLM) -> int:
    """Bytes a decode step reads of the weights (each buffer once; the tied output is the embedding)."""
    seen: set[int] = set()
    total = 0
    for tensor in model.buffers():
        if tensor is None or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    # The embedding table is read one row per token, unless it is also the output projection.
    if model.output.data_ptr() != model.embedding.data_ptr():
        total -= model.embedding.numel() * model.embedding.element_size()
    return total


def kv_bytes_read(model: CausalLM, context_tokens: int, batch: int, dtype: torch.dtype) -> int:
    """Keys and values a decode step reads: each sequence's context on full layers, its window on sliding."""
    c = model.config
    per_token = 2 * c.num_kv_heads * c.head_dim * torch.empty(0, dtype=dtype).element_size()
    total = 0
    for group in c.layer_groups:
        window = c.window_of(group)
        total += per_token * (min(window, context_tokens) if window else context_tokens)
    return total * batch


def time_decode(
    model: CausalLM,
    batch_sizes: Sequence[int],
    context_tokens: int,
    steps: int,
    bandwidth_bytes_per_s: float,
    graphs: bool,
    block_size: int = 16,
    log: Callable[[str], object] = print,
) -> list[DecodeTiming]:
    """Median decode-step time for ``batch`` sequences of ``context_tokens`` each, at every batch size."""
    device, c = model.device, model.config
    largest = max(batch_sizes)
    blocks_per_seq = math.ceil((context_tokens + steps + 1) / block_size) + 1
    num_blocks = largest * blocks_per_seq + 1
    kv = PagedKvCache(c, num_blocks, block_size, model.dtype, device)
    use_graphs = graphs and decode_kernel_usable(device)
    runner = None
    if use_graphs:
        width = blocks_per_seq + 1
        runner = DecodeGraphs(
            model, kv, batch_sizes, dict.fromkeys(c.groups, width), context_tokens + steps + 1
        )
    out = []
    gen = torch.Generator().manual_seed(0)
    for batch in batch_sizes:
        blocks = block_manager_for(c, num_blocks, block_size)
        prompts = torch.randint(0, c.vocab_size, (batch, context_tokens), generator=gen).tolist()
        tables = []
        for prompt in prompts:  # prefill, one sequence at a time (not timed)
            table = blocks.allocate(prompt, max_cached=0)
            blocks.append(table, prompt)
            tables.append(table)
            want = [False] * (len(prompt) - 1) + [True]
            inputs = build_step_inputs([SeqChunk(table, prompt, 0, want)], blocks.groups)
            model.forward(inputs.to(device), kv)
        times = []
        for step in range(steps):
            chunks = []
            for seq, table in enumerate(tables):
                token = (seq * 31 + step) % c.vocab_size
                blocks.append(table, [token])
                chunks.append(SeqChunk(table, [token], context_tokens + step, [True]))
            inputs = build_step_inputs(chunks, blocks.groups).to(device)
            synchronize(device)
            started = time.perf_counter()
            size = runner.size_for(inputs) if runner is not None else None
            if size is not None:
                runner.run(inputs, size)
            else:
                model.forward(inputs, kv)
            synchronize(device)
            times.append(time.perf_counter() - started)
        step_s = sorted(times)[len(times) // 2]
        moved = weight_bytes(model) + kv_bytes_read(model, context_tokens, batch, kv.dtype)
        floor_s = moved / bandwidth_bytes_per_s
        timing = DecodeTiming(
            batch,
            context_tokens,
            runner is not None,
            step_s * 1e3,
            batch / step_s,
            moved,
            floor_s * 1e3,
            step_s / floor_s,
        )
        log(
            f"  batch {batch:>4}: step {timing.step_ms:8.2f} ms, {timing.tokens_per_s:9.1f} tok/s, floor "
            f"{timing.floor_ms:7.3f} ms ({timing.over_floor:.2f}x), graphs {'on' if timing.graphs else 'off'}"
        )
        out.append(timing)
    return out
