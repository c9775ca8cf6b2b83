"""One model step's inputs as tensors: the batch's rows, where their KV goes, which keys each row reads.

Built on the CPU from the scheduler's plain lists and the sequences' block tables, then moved to the
model's device once per step (:meth:`StepInputs.to`). Rows are grouped by sequence, in order: sequence i
owns rows ``query_start[i]:query_start[i + 1]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from gpu.kv_blocks import NULL_BLOCK, BlockTable


@dataclass(frozen=True, slots=True)
class StepInputs:
    tokens: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    query_start: torch.Tensor  # int32 [S + 1], cumulative rows per sequence
    seq_lens: torch.Tensor  # int32 [S], context length after this step (keys < seq_lens[i] are valid)
    block_tables: dict[str, torch.Tensor]  # per group: int32 [S, max_blocks], padded with the null block
    slot_mapping: dict[str, torch.Tensor]  # per group: int64 [T], where each row's k/v is written
    logit_rows: torch.Tensor  # int64 [N], rows whose logits the step returns, ascending
    # Known on the host, so kernels' launch sizes never wait on the device.
    max_query_len: int
    max_seq_len: int

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def to(self, device: torch.device | str) -> StepInputs:
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=True)
            elif isinstance(value, dict):
                value = {k: t.to(device, non_blocking=True) for k, t in value.items()}
            moved[f.name] = value
        return StepInputs(**moved)


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One sequence's rows this step: ``tokens`` at positions ``start``, ``start + 1``, ...; the rows
    of ``want_logits`` (True) return logits. ``table`` is the sequence's blocks, with room for them."""

    table: BlockTable
    tokens: Sequence[int]
    start: int
    want_logits: Sequence[bool]


def chunks_from_rows(
    tokens: Sequence[int],
    positions: Sequence[int],
    seq_ids: Sequence[int],
    want_logits: Sequence[bool],
    tables: Mapping[int, BlockTable],
) -> list[SeqChunk]:
    """The scheduler's flat rows (one per token, a sequence's rows together) as one chunk per sequence;
    ``tables`` gives each sequence id's block table."""
    chunks: list[SeqChunk] = []
    chunk_ids: list[int] = []
    begin = 0
    for row in range(1, len(tokens) + 1):
        if row == len(tokens) or seq_ids[row] != seq_ids[begin]:
            start = positions[begin]
            if list(positions[begin:row]) != list(range(start, start + row - begin)):
                raise ValueError(f"sequence {seq_ids[begin]}: its rows' positions are not consecutive")
            chunks.append(SeqChunk(tables[seq_ids[begin]], tokens[begin:row], start, want_logits[begin:row]))
            chunk_ids.append(seq_ids[begin])
            begin = row
    if len(set(chunk_ids)) != len(chunk_ids):
        raise ValueError("a sequence's rows are not together")
    return chunks


def build_step_inputs(chunks: Sequence[SeqChunk], groups: Iterable[str]) -> StepInputs:
    """Tensors (on the CPU) for ``chunks``, whose KV room :meth:`gpu.kv_blocks.KvBlockManager.append`
    already gave, with a block table and slots for each of the attention ``groups``."""
    tokens: list[int] = []
    positions: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    logit_rows: list[int] = []
    for chunk in chunks:
        count = len(chunk.tokens)
        logit_rows.extend(len(tokens) + i for i, want in enumerate(chunk.want_logits) if want)
        tokens.extend(chunk.tokens)
        positions.extend(range(chunk.start, chunk.start + count))
        query_start.append(len(tokens))
        seq_lens.append(chunk.start + count)
        if chunk.table.num_tokens != chunk.start + count:
            raise ValueError(f"chunk at {chunk.start}: its KV room does not end at this step's last row")
    block_tables = {}
    slot_mapping = {}
    for group in groups:
        tables = [c.table.table(group) for c in chunks]
        width = max((len(t) for t in tables), default=0)
        block_tables[group] = torch.tensor(
            [t + [NULL_BLOCK] * (width - len(t)) for t in tables], dtype=torch.int32
        ).reshape(len(chunks), width)
        slots = [s for c in chunks for s in c.table.slots(group, c.start, len(c.tokens))]
        slot_mapping[group] = torch.tensor(slots, dtype=torch.int64)
    return StepInputs(
        tokens=torch.tensor(tokens, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        query_start=torch.tensor(query_start, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        logit_rows=torch.tensor(logit_rows, dtype=torch.int64),
        max_query_len=max((len(c.tokens) for c in chunks), default=0),
        max_seq_len=max(seq_lens, default=0),
    )
