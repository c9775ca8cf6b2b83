"""Decode steps replayed from CUDA graphs: one capture per batch size, inputs copied into fixed buffers.

A decode step (one row per sequence) launches a few hundred small kernels; at small batches launching them
costs more than running them. Captured once per batch size in ``sizes``, a step becomes: copy this step's
tokens, positions, block tables and slots into the captured buffers, replay, read the logits. A batch is
padded up to the next captured size with rows that write to and read from the null block only (block 0,
which no sequence owns), so padding never touches a sequence's keys.

What a graph cannot follow is fixed at capture: the block tables' width (``max_blocks`` per group, from the
context window) and the attention kernel's split of the keys (from ``max_seq_len``). Steps with a prompt
chunk, wider tables or more rows than the largest size run eagerly.

``capture=False`` runs the same padded buffers eagerly: the CPU tests check the padding with it, and a GPU
without graphs still gets one code path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu.kv_blocks import NULL_BLOCK
from gpu.kv_cache import PagedKvCache
from gpu.step_inputs import StepInputs


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        kv: PagedKvCache,
        sizes: Sequence[int],
        max_blocks: dict[str, int],
        max_seq_len: int,
        capture: bool = True,
    ) -> None:
        self.model, self.kv = model, kv
        self.sizes = sorted(set(sizes))
        self.max_blocks = max_blocks
        self.max_seq_len = max_seq_len
        self.capture = capture
        device, largest = kv.device, self.sizes[-1]
        self._tokens = torch.zeros(largest, dtype=torch.int64, device=device)
        self._positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self._seq_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self._query_start = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self._rows = torch.arange(largest, dtype=torch.int64, device=device)
        self._tables = {
            g: torch.full((largest, width), NULL_BLOCK, dtype=torch.int32, device=device)
            for g, width in max_blocks.items()
        }
        self._slots = {g: torch.zeros(largest, dtype=torch.int64, device=device) for g in max_blocks}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def inputs_for(self, size: int) -> StepInputs:
        """The fixed buffers' first ``size`` rows as a step's inputs (what the graph of ``size`` reads)."""
        return StepInputs(
            tokens=self._tokens[:size],
            positions=self._positions[:size],
            query_start=self._query_start[: size + 1],
            seq_lens=self._seq_lens[:size],
            block_tables={g: t[:size] for g, t in self._tables.items()},
            slot_mapping={g: s[:size] for g, s in self._slots.items()},
            logit_rows=self._rows[:size],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
        )

    def _capture_all(self) -> None:
        # Warm up on a side stream first (lazy inits, the kernels' first compile), as torch advises.
        stream = torch.cuda.Stream(self.kv.device)
        stream.wait_stream(torch.cuda.current_stream(self.kv.device))
        with torch.cuda.stream(stream):
            for size in self.sizes:
                self.model.forward(self.inputs_for(size), self.kv)
        torch.cuda.current_stream(self.kv.device).wait_stream(stream)
        pool = None
        for size in reversed(self.sizes):  # the largest first: the smaller ones reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self.model.forward(self.inputs_for(size), self.kv)
            pool = graph.pool()
            self._graphs[size] = graph

    def size_for(self, inputs: StepInputs) -> int | None:
        """The captured size that runs ``inputs``, or None when it must run eagerly."""
        if inputs.max_query_len != 1 or inputs.max_seq_len > self.max_seq_len:
            return None
        if inputs.num_rows != inputs.num_seqs or inputs.logit_rows.shape[0] != inputs.num_rows:
            return None
        if any(inputs.block_tables[g].shape[1] > w for g, w in self.max_blocks.items()):
            return None
        return next((s for s in self.sizes if s >= inputs.num_seqs), None)

    def run(self, inputs: StepInputs, size: int) -> torch.Tensor:
        """The logits of a decode step (``size`` from :meth:`size_for`), rows as in ``inputs``."""
        n = inputs.num_seqs
        self._tokens[:n].copy_(inputs.tokens, non_blocking=True)
        self._positions[:n].copy_(inputs.positions, non_blocking=True)
        self._seq_lens[:n].copy_(inputs.seq_lens, non_blocking=True)
        for group, table in self._tables.items():
            width = inputs.block_tables[group].shape[1]
            table[:n, :width].copy_(inputs.block_tables[group], non_blocking=True)
            table[:n, width:].fill_(NULL_BLOCK)
            self._slots[group][:n].copy_(inputs.slot_mapping[group], non_blocking=True)
        # Padding rows: one key at position 0, written to and read from the null block's first slot.
        self._tokens[n:size].zero_()
        self._positions[n:size].zero_()
        self._seq_lens[n:size].fill_(1)
        for group, table in self._tables.items():
            table[n:size].fill_(NULL_BLOCK)
            self._slots[group][n:size].fill_(NULL_BLOCK * self.kv.block_size)
        if not self.capture:
            return self.model.forward(self.inputs_for(size), self.kv)[:n]
        self._graphs[size].replay()
        return self._outputs[size][:n]
