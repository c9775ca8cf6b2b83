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
    first = kv.allocate(long)
    kv.append(first, long)  # already computed: this step decodes one token for it
    kv.append(first, [77])
    second = kv.allocate([*long[:8], 50, 51])  # shares 8 tokens, computes 2
    assert second.num_tokens == 8
    kv.append(second, [50, 51])
    tables = {0: first, 1: second}
    rows = chunks_from_rows([77, 50, 51], [13, 8, 9], [0, 1, 1], [True, False, True], tables)
    assert rows == [SeqChunk(first, [77], 13, [True]), SeqChunk(second, [50, 51], 8, [False, True])]
    inputs = build_step_inputs(rows, kv.groups)

    assert inputs.tokens.tolist() == [77, 50, 51] and inputs.tokens.dtype == torch.int64
    assert inputs.positions.tolist() == [13, 8, 9] and inputs.positions.dtype == torch.int64
    assert inputs.query_start.tolist() == [0, 1, 3] and inputs.query_start.dtype == torch.int32
    assert inputs.seq_lens.tolist() == [14, 10] and inputs.seq_lens.dtype == torch.int32
    assert inputs.logit_rows.tolist() == [0, 2] and inputs.logit_rows.dtype == torch.int64
    assert (inputs.max_query_len, inputs.max_seq_len, inputs.num_rows, inputs.num_seqs) == (2, 14, 3, 2)
    for group in ("global", "sliding"):
        tables = inputs.block_tables[group]
        assert tables.dtype == torch.int32 and tables.shape == (2, 4)  # padded to the longest table
        assert tables[0].tolist() == first.table(group)
        assert tables[1].tolist() == [*second.table(group), NULL_BLOCK]
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
    kv = blocks()
    tables = {0: kv.allocate([1, 2]), 1: kv.allocate([3])}
    with pytest.raises(ValueError, match="not consecutive"):
        chunks_from_rows([1, 2], [0, 2], [0, 0], [False, True], tables)
    with pytest.raises(ValueError, match="not together"):
        chunks_from_rows([1, 2, 3], [0, 0, 1], [0, 1, 0], [True, True, True], tables)


def test_a_chunk_without_its_kv_room_is_refused():
    kv = blocks()
    table = kv.allocate([1, 2, 3])
    with pytest.raises(ValueError, match="KV room"):  # append not called
        build_step_inputs([SeqChunk(table, [1, 2, 3], 0, [False, False, True])], kv.groups)


def test_an_empty_step():
    inputs = build_step_inputs([], blocks().groups)
    assert inputs.num_rows == 0 and inputs.query_start.tolist() == [0]
    assert inputs.block_tables["global"].shape == (0, 0)
