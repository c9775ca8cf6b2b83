"""A test-only block book: builds step inputs for the torch model over a simple free list of blocks.

Independent of gpu/kv_blocks.py on purpose: the model's tests check the model (block tables, slot mapping,
masks), not the block manager. Freed sliding-window blocks are poisoned with NaN, so attention that reads a
block it should not turns the logits into NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu.kv_cache import PagedKvCache
from gpu.model_config import SLIDING, ModelConfig
from gpu.step_inputs import StepInputs


class BlockBook:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int) -> None:
        self.config = config
        self.block_size = block_size
        # Hand out high ids first, so tables are not simply 1, 2, 3... in any test.
        self.free = {g: list(range(1, num_blocks)) for g in config.groups}
        self.tables: dict[int, dict[str, list[int]]] = {}
        self.lengths: dict[int, int] = {}

    def step(self, rows: Sequence[tuple[int, Sequence[int]]]) -> StepInputs:
        """Inputs for one step: each (sequence id, its new tokens), all rows' logits returned."""
        tokens: list[int] = []
        positions: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        slots: dict[str, list[int]] = {g: [] for g in self.config.groups}
        for seq, new in rows:
            start = self.lengths.get(seq, 0)
            end = start + len(new)
            tables = self.tables.setdefault(seq, {g: [] for g in self.config.groups})
            for group, table in tables.items():
                while len(table) * self.block_size < end:
                    table.append(self.free[group].pop())
                for pos in range(start, end):
                    slots[group].append(
                        table[pos // self.block_size] * self.block_size + pos % self.block_size
                    )
            tokens += new
            positions += range(start, end)
            query_start.append(len(tokens))
            seq_lens.append(end)
            self.lengths[seq] = end
        width = max(len(self.tables[seq][g]) for seq, _ in rows for g in self.config.groups)
        block_tables = {
            g: torch.tensor(
                [self.tables[seq][g] + [0] * (width - len(self.tables[seq][g])) for seq, _ in rows],
                dtype=torch.int32,
            )
            for g in self.config.groups
        }
        return StepInputs(
            tokens=torch.tensor(tokens, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            query_start=torch.tensor(query_start, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=block_tables,
            slot_mapping={g: torch.tensor(s, dtype=torch.int64) for g, s in slots.items()},
            logit_rows=torch.arange(len(tokens)),
            max_query_len=max(len(new) for _, new in rows),
            max_seq_len=max(seq_lens),
        )

    def drop_out_of_window(self, seq: int, kv: PagedKvCache) -> int:
        """Free the sequence's sliding blocks no later query can see; poison them. Returns how many."""
        window = self.config.sliding_window
        if SLIDING not in self.config.groups or not window:
            return 0
        oldest_visible = self.lengths[seq] - window + 1  # the next query's oldest key
        table = self.tables[seq][SLIDING]
        dropped = 0
        for j, block in enumerate(table):
            if block and (j + 1) * self.block_size <= oldest_visible:
                for layer in self.config.layers_of(SLIDING):
                    kv.k[layer][block] = float("nan")
                    kv.v[layer][block] = float("nan")
                self.free[SLIDING].append(block)
                table[j] = 0
                dropped += 1
        return dropped
