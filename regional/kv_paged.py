"""The GPU engine's KV memory: paged blocks with a prefix cache, as the scheduler's :class:`KvMemory`.

A thin adapter over :class:`gpu.kv_blocks.KvBlockManager` (pure Python: importing this module loads no
torch). Unlike llama.cpp's slots, nothing is reserved for a sequence's completion at admission: blocks
are taken as tokens are computed (:meth:`PagedMemory.append`), and the scheduler preempts when they run
out. Freed blocks keep their cached prefixes until the block is needed for other tokens, so there is
no idle cache to evict and nothing for the engine to clear.

A sequence's block table is its own (``Sequence.blocks``, from admission to :meth:`PagedMemory.release`);
the manager keeps only the pools. ``Sequence.slot`` is an id that groups the sequence's rows in a step.
"""

from __future__ import annotations

import itertools

from gpu.kv_blocks import KvBlockManager
from regional.kv_memory import Admission
from regional.sequence import Sequence


class PagedMemory:
    def __init__(self, blocks: KvBlockManager) -> None:
        self.blocks = blocks
        # The first full-attention group sizes the memory in tokens (a sliding group holds only windows).
        self._main_group = next(
            (g.name for g in blocks.groups.values() if g.window is None), next(iter(blocks.groups))
        )
        self._seq_ids = itertools.count()

    @property
    def total_tokens(self) -> int:
        return self.blocks.usage().blocks_total[self._main_group] * self.blocks.block_size

    def used_tokens(self) -> int:
        """Tokens' room in blocks that sequences hold (cached blocks no one holds are free room)."""
        return self.blocks.usage().blocks_used[self._main_group] * self.blocks.block_size

    def allocate(self, seq: Sequence) -> Admission | None:
        """Admit ``seq`` with its cached prefix when blocks for the rest of its tokens are free.

        A preempted sequence comes back with its outputs as well as its prompt to compute."""
        seq_id = next(self._seq_ids)
        tokens = seq.prompt + seq.output
        max_cached = self._max_cached(seq)
        if not self.blocks.can_allocate(tokens, max_cached):
            return None
        seq.slot = seq_id
        seq.blocks = self.blocks.allocate(tokens, max_cached)
        return Admission(seq, seq_id, seq_id, seq.blocks.num_tokens)

    @staticmethod
    def _max_cached(seq: Sequence) -> int | None:
        # Prompt positions still to score need their logits, so they cannot come from the cache.
        if seq.request.prompt_logprobs is not None:
            return len(seq.prompt_logprobs)
        return None

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        assert seq.blocks is not None
        return self.blocks.can_append(seq.blocks, num_tokens)

    def append(self, seq: Sequence, num_tokens: int) -> None:
        assert seq.blocks is not None
        self.blocks.append(seq.blocks, seq.uncomputed(num_tokens))

    def release(self, seq: Sequence, now: float) -> None:
        """The sequence's blocks go back to the pools (named ones stay cached); it holds none after."""
        assert seq.blocks is not None
        self.blocks.free(seq.blocks)
        seq.blocks = None

    def evict_idle(self) -> list[int]:
        return []  # cached blocks are reused as needed, never cleared

    def reset(self) -> None:
        self.blocks.reset()
