"""A request in the region and all its per-request state, in one place: the :class:`Sequence`.

What it asked for (``request``), how far it is (prompt tokens computed, outputs, scores, finish), where its
KV lives (``slot``; ``blocks``, its block table, in the paged memory), its sampling state (``sampler``
for the llama.cpp engine, ``sampling_row`` for the torch engine's batched sampler) and its grammar
(``constraint``, when its output is constrained). Nothing else in the
node holds state of its own for a request: the KV memory keeps only pools and reference counts, the engine
only an index of the live sequences by request id (for aborts), so a sequence that finishes, is aborted or
is preempted is freed through the sequence alone (:meth:`regional.kv_memory.KvMemory.release`).

A preemption frees the KV only: the sampling and grammar state stay, so a recomputed sequence draws on
where it left off (the same tokens as if it had never been preempted).
"""

from __future__ import annotations

import asyncio
import codecs
from dataclasses import dataclass, field

from gpu.kv_blocks import BlockTable
from gpu.sampling_rows import SamplingRow
from regional.engine import EngineFinish, GenerationRequest, Logprobs
from regional.grammar import Constraint, LazyConstraint
from regional.sampler import TokenSampler


@dataclass(eq=False)
class Sequence:
    """One request in the region, and everything the node keeps for it (see the module's docstring)."""

    request: GenerationRequest
    arrived_at: float
    sampler: TokenSampler  # the llama.cpp engine's: its random stream and output counts (numpy, per row)
    events: asyncio.Queue | None = None
    # The torch engine's row of its batched sampler (the request's params, its seed, output counts): made at
    # its first draw.
    sampling_row: SamplingRow | None = None
    # What its grammar allows next (response_format, a tool call), advanced by each token drawn; its state
    # moves with the outputs alone, so preemptions and prefix reuse leave it right.
    constraint: Constraint | LazyConstraint | None = None
    grammar_s: float = 0.0  # building ``constraint`` before it was queued (its first event says it)
    slot: int = -1  # the KV memory's id for this sequence (a llama.cpp sequence id)
    blocks: BlockTable | None = None  # its KV blocks, while the paged memory holds them
    num_computed: int = 0  # tokens whose KV cells exist (prompt first, then fed-back outputs)
    num_cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    num_preemptions: int = 0  # times its KV was freed for room; it then recomputes prompt and outputs
    output: list[int] = field(default_factory=list)
    # With prompt_logprobs: entry i scores prompt token i + 1 (the logits at position i predict it).
    prompt_logprobs: list[Logprobs] = field(default_factory=list)
    finish_reason: EngineFinish | None = None
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    text_decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_tokens

    @property
    def share_key(self) -> str:
        return self.request.share_key

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def is_prefilling(self) -> bool:
        # A preempted sequence prefills its outputs too: all but the last, which it feeds as a decode.
        return self.num_computed < max(len(self.prompt), self.num_tokens - 1)

    def uncomputed(self, limit: int) -> list[int]:
        """Up to ``limit`` of the tokens whose KV is still to compute (prompt first, then outputs)."""
        end = min(self.num_tokens, self.num_computed + limit)
        if end <= len(self.prompt):
            return self.prompt[self.num_computed : end]
        return (self.prompt + self.output)[self.num_computed : end]

    @property
    def reusable_prefix(self) -> int:
        """The most prompt tokens a prefix cache may supply: all but the last (its logits pick the first
        output token); when the prompt is scored, only those whose scores it already has (every other
        position's logits are needed)."""
        if self.request.prompt_logprobs is not None:
            return min(len(self.prompt_logprobs), len(self.prompt) - 1)
        return len(self.prompt) - 1

    @property
    def reserved_tokens(self) -> int:
        """KV cells this sequence may come to need: its whole prompt and its whole completion budget."""
        return len(self.prompt) + self.request.max_tokens

    def computed_tokens(self) -> list[int]:
        return (self.prompt + self.output)[: self.num_computed]
