"""A step's input tensors from the scheduler's rows and the block manager's tables (arch brief layout)."""

from __future__ import annotations

import pytest
import torch

from gpu.kv_blocks import NULL_BLOCK, GroupSpec, KvBlockManager
from gpu.step_inputs import SeqChunk, build_step_inputs, chunks_from_rows


def blocks() -> KvBlockManager:
    return KvBlockManager([GroupSpec("global", 32), GroupSpec("sliding", 32, window=4)], block_size=4)


def test_a_mixed_step_decode_prefill_and_prefix_hit():
    kv = blocks()
    long = list(range(1, 14))  # 13 tokens
    kv.allocate(0, long)
    kv.append(0, long)  # already computed: this step decodes one token for it
    kv.append(0, [77])
    hit = kv.allocate(1, [*long[:8], 50, 51])  # shares 8 tokens, computes 2
    assert hit == 8
    kv.append(1, [50, 51])
    rows = chunks_from_rows([77, 50, 51], [13, 8, 9], [0, 1, 1], [True, False, True])
    assert rows == [SeqChunk(0, [77], 13, [True]), SeqChunk(1, [50, 51], 8, [False, True])]
    inputs = build_step_inputs(rows, kv)

    assert inputs.tokens.tolist() == [77, 50, 51] and inputs.tokens.dtype == torch.int64
    assert inputs.positions.tolist() == [13, 8, 9] and inputs.positions.dtype == torch.int64
    assert inputs.query_start.tolist() == [0, 1, 3] and inputs.query_start.dtype == torch.int32
    assert inputs.seq_lens.tolist() == [14, 10] and inputs.seq_lens.dtype == torch.int32
    assert inputs.logit_rows.tolist() == [0, 2] and inputs.logit_rows.dtype == torch.int64
    assert (inputs.max_query_len, inputs.max_seq_len, inputs.num_rows, inputs.num_seqs) == (2, 14, 3, 2)
    for group in ("global", "sliding"):
        tables = inputs.block_tables[group]
        assert tables.dtype == torch.int32 and tables.shape == (2, 4)  # padded to the longest table
        assert tables[0].tolist() == kv.block_table(0, group)
        assert tables[1].tolist() == [*kv.block_table(1, group), NULL_BLOCK]
        expected = [
            tables[s, p // 4].item() * 4 + p % 4 for s, p in ((0, 13), (1, 8), (1, 9))
        ]  # the arch brief's slot formula
        assert inputs.slot_mapping[group].tolist() == expected
        assert inputs.slot_mapping[group].dtype == torch.int64
    assert inputs.block_tables["global"][0, 0] == inputs.block_tables["global"][1, 0]  # the shared prefix
    assert inputs.block_tables["sliding"][0, :2].tolist() == [NULL_BLOCK, NULL_BLOCK]  # out of the window

    moved = inputs.to("meta")
    assert moved.tokens.device.type == "meta" and moved.block_tables["sliding"].device.type == "meta"
    assert moved.max_seq_len == 14


def test_rows_must_be_grouped_and_consecutive():
    with pytest.raises(ValueError, match="not consecutive"):
        chunks_from_rows([1, 2], [0, 2], [0, 0], [False, True])
    with pytest.raises(ValueError, match="not together"):
        chunks_from_rows([1, 2, 3], [0, 0, 1], [0, 1, 0], [True, True, True])


def test_a_chunk_without_its_kv_room_is_refused():
    kv = blocks()
    kv.allocate(0, [1, 2, 3])
    with pytest.raises(ValueError, match="KV room"):
        build_step_inputs([SeqChunk(0, [1, 2, 3], 0, [False, False, True])], kv)  # append not called


def test_an_empty_step():
    inputs = build_step_inputs([], blocks())
    assert inputs.num_rows == 0 and inputs.query_start.tolist() == [0]
    assert inputs.block_tables["global"].shape == (0, 0)
