"""Continuous batching over llama.cpp sequence slots: who runs this step, and with which tokens.

Pure bookkeeping, no model calls, so it can be tested on its own. The engine applies what it decides:
each step it asks :meth:`Scheduler.admit` which waiting requests join (and which cached prefix each
reuses), then :meth:`Scheduler.plan_step` for the tokens of one ``llama_decode``.

Every running sequence owns one slot (a llama.cpp sequence id). A slot keeps its KV cells after its
sequence finishes, so a later prompt with the same beginning (a shared system prompt) starts from there;
prefixes of running sequences are shared too, by reference, in the unified KV pool.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from dataclasses import dataclass, field

from regional.engine import GenerationRequest
from regional.sampler import TokenSampler


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    arrived_at: float
    sampler: TokenSampler
    events: asyncio.Queue | None = None
    slot: int = -1
    num_computed: int = 0  # tokens whose KV cells exist (prompt first, then fed-back outputs)
    num_cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    output: list[int] = field(default_factory=list)
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
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def reserved_tokens(self) -> int:
        """KV cells this sequence may come to need: its whole prompt and its whole completion budget."""
        return len(self.prompt) + self.request.max_tokens

    def computed_tokens(self) -> list[int]:
        return (self.prompt + self.output)[: self.num_computed]


@dataclass(eq=False)
class Slot:
    index: int
    owner: Sequence | None = None
    cached: list[int] = field(default_factory=list)  # tokens in KV while the slot is idle
    released_at: float = 0.0

    def tokens(self) -> list[int]:
        return self.owner.computed_tokens() if self.owner is not None else self.cached


@dataclass(frozen=True, slots=True)
class Admission:
    """A sequence joins the batch in ``slot``, reusing the first ``prefix_len`` KV cells of ``source``.

    ``source == slot`` means the slot's own idle cache is trimmed to the prefix; otherwise the slot is
    cleared and then shares the source's cells.
    """

    sequence: Sequence
    slot: int
    source: int
    prefix_len: int


@dataclass(slots=True)
class StepPlan:
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    want_logits: list[bool] = field(default_factory=list)
    # (sequence, batch index of its logits row): sequences that sample a token after this step
    samples: list[tuple[Sequence, int]] = field(default_factory=list)
    # (sequence, tokens it adds to its KV this step)
    advances: list[tuple[Sequence, int]] = field(default_factory=list)

    def add(self, seq: Sequence, tokens: list[int], sample: bool) -> None:
        start = seq.num_computed
        for offset, token in enumerate(tokens):
            self.tokens.append(token)
            self.positions.append(start + offset)
            self.seq_ids.append(seq.slot)
            self.want_logits.append(False)
        if sample:
            self.want_logits[-1] = True
            self.samples.append((seq, len(self.tokens) - 1))
        self.advances.append((seq, len(tokens)))


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(self, max_sequences: int, kv_tokens: int, batch_tokens: int, prefill_chunk: int) -> None:
        self.kv_tokens = kv_tokens
        self.batch_tokens = batch_tokens
        self.prefill_chunk = prefill_chunk
        self.slots = [Slot(i) for i in range(max_sequences)]
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Idle slots whose cache was dropped to make room; the engine clears their cells.
        self.evicted: list[int] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def kv_tokens_used(self) -> int:
        idle = sum(len(s.cached) for s in self.slots if s.owner is None)
        return idle + sum(seq.reserved_tokens for seq in self.running)

    def admit(self, now: float) -> list[Admission]:
        """Move waiting sequences into free slots, first come first served, while KV room lasts."""
        admitted: list[Admission] = []
        while self.waiting:
            seq = self.waiting[0]
            admission = self._place(seq)
            if admission is None:
                break
            self.waiting.popleft()
            slot = self.slots[admission.slot]
            slot.owner, slot.cached = seq, []
            seq.slot = admission.slot
            seq.num_computed = seq.num_cached_tokens = admission.prefix_len
            seq.admitted_at = now
            self.running.append(seq)
            admitted.append(admission)
        return admitted

    def _place(self, seq: Sequence) -> Admission | None:
        free = [s for s in self.slots if s.owner is None]
        if not free:
            return None
        # The last prompt token is always computed again: its logits pick the first output token.
        limit = len(seq.prompt) - 1
        source, prefix = max(
            ((s, min(limit, common_prefix_len(s.tokens(), seq.prompt))) for s in self.slots),
            key=lambda sp: (sp[1], sp[0].owner is None),
        )
        # Reuse the source's own slot when it is idle; otherwise the free slot whose cache matters least.
        if source.owner is None and prefix > 0:
            slot = source
        else:
            slot = min(
                free, key=lambda s: (common_prefix_len(s.cached, seq.prompt), len(s.cached), s.released_at)
            )
        keep = {slot.index, source.index} if prefix else {slot.index}
        if not self._make_room(seq.reserved_tokens, keep=keep, target=slot):
            return None
        return Admission(seq, slot.index, source.index, prefix)

    def _make_room(self, need: int, keep: set[int], target: Slot) -> bool:
        # The target's idle cache is replaced by the new sequence, so it does not count against the room.
        used = self.kv_tokens_used() - len(target.cached)
        idle = sorted(
            (s for s in self.slots if s.owner is None and s.cached and s.index not in keep),
            key=lambda s: s.released_at,
        )
        while used + need > self.kv_tokens and idle:
            victim = idle.pop(0)
            used -= len(victim.cached)
            victim.cached = []
            self.evicted.append(victim.index)
        return used + need <= self.kv_tokens

    def plan_step(self) -> StepPlan:
        """One llama_decode: one token for every decoding sequence, then prompt chunks in the room left.

        While anyone is decoding, prompts advance by at most ``prefill_chunk`` tokens a step, so a long
        prompt costs the others a slightly longer step, never a frozen stream.
        """
        plan = StepPlan()
        prefilling = []
        for seq in self.running:
            if seq.is_prefilling:
                prefilling.append(seq)
            else:
                plan.add(seq, [seq.output[-1]], sample=True)
        room = self.batch_tokens - len(plan.tokens)
        if plan.tokens:
            room = min(room, self.prefill_chunk)
        for seq in prefilling:
            if room <= 0:
                break
            chunk = seq.prompt[seq.num_computed : seq.num_computed + room]
            plan.add(seq, chunk, sample=seq.num_computed + len(chunk) == len(seq.prompt))
            room -= len(chunk)
        return plan

    def finish(self, seq: Sequence, now: float) -> None:
        """Retire a sequence; its slot keeps the computed tokens' cells for prefix reuse."""
        if seq in self.running:
            self.running.remove(seq)
            slot = self.slots[seq.slot]
            slot.owner = None
            slot.cached = seq.computed_tokens()
            slot.released_at = now
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def drop_idle_caches(self) -> list[int]:
        """Forget every idle slot's cached prefix; returns the slots whose cells must be cleared."""
        dropped = [s.index for s in self.slots if s.owner is None and s.cached]
        for index in dropped:
            self.slots[index].cached = []
        return dropped

    def forget_all(self) -> None:
        """After a failed step the KV contents are unknown: drop every cache."""
        for slot in self.slots:
            slot.cached = []
