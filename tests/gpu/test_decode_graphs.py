"""Decode steps through the fixed buffers of gpu/decode_graphs.py, on the CPU (capture off): padded to the
captured batch size, a step gives the logits of the plain forward, and padding never writes a sequence's
blocks."""

from __future__ import annotations

import torch

from gpu.decode_graphs import DecodeGraphs
from gpu.kv_cache import PagedKvCache
from gpu.step_inputs import SeqChunk, build_step_inputs
from tests.gpu.test_paged_model import BLOCK_SIZE, block_manager, tiny_gemma


def test_a_padded_decode_step_gives_the_plain_forwards_logits():
    model = tiny_gemma(seed=3)
    blocks = block_manager(model, num_blocks=40)
    kv = PagedKvCache(model.config, 40, BLOCK_SIZE)
    prompts = {0: [3, 14, 15, 92, 65, 35, 89, 79], 1: [2, 71, 82, 81, 82, 84, 59, 4, 52, 35, 36], 2: [1, 41]}
    tables = {}
    for seq, prompt in prompts.items():  # prefill each, eagerly
        tables[seq] = table = blocks.allocate(prompt, max_cached=0)
        blocks.append(table, prompt)
        prefill = SeqChunk(table, prompt, 0, [False] * len(prompt))
        model.forward(build_step_inputs([prefill], blocks.groups), kv)
    graphs = DecodeGraphs(
        model,
        kv,
        sizes=[1, 2, 4, 8],
        max_blocks={g: 8 for g in model.config.groups},
        max_seq_len=32,
        capture=False,
    )
    for step in range(4):  # one new token each, three sequences padded to four rows
        chunks = []
        for seq, prompt in prompts.items():
            token = (7 * step + seq) % 97
            blocks.append(tables[seq], [token])
            chunks.append(SeqChunk(tables[seq], [token], len(prompt) + step, [True]))
        inputs = build_step_inputs(chunks, blocks.groups)
        assert graphs.size_for(inputs) == 4
        before = [t.clone() for t in kv.k]
        padded = graphs.run(inputs, 4)
        # the padded rows wrote only to the null block
        for layer, (old, new) in enumerate(zip(before, kv.k, strict=True)):
            changed = (old != new).flatten(1).any(dim=1).nonzero().flatten().tolist()
            owned = {b for table in tables.values() for b in table.table(kv.group_of(layer))}
            assert set(changed) <= owned | {0}, (layer, changed)
        plain = model.forward(inputs, kv)  # writes the same keys again: the same logits
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)


def test_steps_a_graph_cannot_take_run_eagerly():
    model = tiny_gemma()
    blocks = block_manager(model, num_blocks=40)
    kv = PagedKvCache(model.config, 40, BLOCK_SIZE)
    graphs = DecodeGraphs(
        model, kv, sizes=[1, 2], max_blocks={g: 2 for g in model.config.groups}, max_seq_len=8, capture=False
    )
    prompt = list(range(1, 10))
    table = blocks.allocate(prompt, max_cached=0)
    blocks.append(table, prompt)
    prefill = build_step_inputs([SeqChunk(table, prompt, 0, [False] * 8 + [True])], blocks.groups)
    assert graphs.size_for(prefill) is None  # a prompt chunk
    blocks.append(table, [5])
    decode = build_step_inputs([SeqChunk(table, [5], 9, [True])], blocks.groups)
    assert graphs.size_for(decode) is None  # past the captured context (and table width)
