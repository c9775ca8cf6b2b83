"""The paged KV storage: per layer, k and v pools of fixed-size blocks, one pool size per attention group.

Layout (fixed by the issue-11 architecture): for each layer, `k` and `v` of shape
[num_blocks, block_size, num_kv_heads, head_dim], sized by the layer's group ("global" or "sliding"). A token
at position p lives in slot block_table[p // block_size] * block_size + p % block_size of its group's pool.
Block 0 of each group is the null block: never allocated, the target of table padding. Which block holds what
is decided elsewhere (gpu/kv_blocks.py); this module only stores.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gpu.kv_blocks import GroupSpec, KvBlockManager
from gpu.model_config import ModelConfig

DEFAULT_BLOCK_SIZE = 16
NULL_BLOCK = 0


def bytes_per_block(config: ModelConfig, group: str, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of `group` takes across all the group's layers (k and v)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * block_size * config.num_kv_heads * config.head_dim * itemsize
    return per_layer * len(config.layers_of(group))


def block_manager_for(
    config: ModelConfig, num_blocks: int | Mapping[str, int], block_size: int = DEFAULT_BLOCK_SIZE
) -> KvBlockManager:
    """The block bookkeeping for ``config``'s attention groups (a sliding group with its window)."""
    counts = num_blocks if isinstance(num_blocks, Mapping) else dict.fromkeys(config.groups, num_blocks)
    groups = [GroupSpec(g, int(counts[g]), window=config.window_of(g) or None) for g in config.groups]
    return KvBlockManager(groups, block_size)


def blocks_that_fit(
    config: ModelConfig,
    budget_bytes: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dtype: torch.dtype = torch.float32,
) -> dict[str, int]:
    """Blocks per group (null block included) that fit in `budget_bytes`: the same count in every group.

    A sliding group needs fewer blocks per sequence than the global one (a window's worth), so an equal count
    errs on the side of the global group; the block manager admits by whichever pool runs out first.
    """
    groups = config.groups
    per_block_all = sum(bytes_per_block(config, g, block_size, dtype) for g in groups)
    count = max(budget_bytes // per_block_all, 0) if per_block_all else 0
    return {g: int(count) for g in groups}


class PagedKvCache:
    """k/v pools for every layer; `write` scatters a step's new keys and values into their slots."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int | Mapping[str, int],
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        blocks = (
            {g: int(num_blocks) for g in config.groups}
            if isinstance(num_blocks, int)
            else {g: int(num_blocks[g]) for g in config.groups}
        )
        for group, count in blocks.items():
            if count < 2:
                raise ValueError(
                    f"group {group!r} needs at least 2 blocks (block 0 is reserved), got {count}"
                )
        self.config = config
        self.block_size = block_size
        self.num_blocks = blocks
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_groups = config.layer_groups
        shape = lambda g: (blocks[g], block_size, config.num_kv_heads, config.head_dim)  # noqa: E731
        self.k = [torch.zeros(shape(g), dtype=dtype, device=self.device) for g in self.layer_groups]
        self.v = [torch.zeros(shape(g), dtype=dtype, device=self.device) for g in self.layer_groups]

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, num_kv_heads, head_dim] at slots [T] of the layer's pool."""
        kv_heads, head_dim = self.config.num_kv_heads, self.config.head_dim
        self.k[layer].view(-1, kv_heads, head_dim)[slot_mapping] = k.to(self.dtype)
        self.v[layer].view(-1, kv_heads, head_dim)[slot_mapping] = v.to(self.dtype)

    def group_of(self, layer: int) -> str:
        return self.layer_groups[layer]

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
