"""Continuous batching: who runs this step, with which tokens, and who has finished after it.

Pure bookkeeping, no model calls, so it can be tested on its own. One engine step is three verbs:

    plan = scheduler.schedule(now)                      # admissions, evictions, the batch
    ...the engine applies the plan's memory changes, runs the model on plan.batch, samples...
    finished = scheduler.postprocess(plan, sampled, now)

When the KV memory has no room for a step's tokens, the newest sequence is preempted (its KV freed, it
recomputes later); the plan carries the sequences that can never fit (``StepPlan.finished``).

Fair by share key (the edge's opaque per-key id, ``GenerationRequest.share_key``): waiting sequences are
admitted from the key holding the fewest KV tokens first, and prompts are prefilled a round at a time across
keys, so one key's long prompts cannot make another key's short chat wait behind all of them. A step cannot
be cut short once it runs, so while keys share the node (within ``SHARED_WINDOW_S``) every step is kept to
``prefill_chunk`` prompt tokens, and to what the node runs in its ``shared_step_ms`` (fitted step times,
:mod:`regional.step_cost`): what a newcomer waits for before its own step begins.

Failure paths are verbs of their own: :meth:`Scheduler.abort` (one request leaves),
:meth:`Scheduler.evict_idle_caches` (the model's memory is full: free what only caches hold, then retry),
:meth:`Scheduler.fail_running` (a failed step: the model's memory is unknown, so every running sequence
fails and every cache is dropped).

Where the KV cells live is a :class:`KvMemory`'s decision (llama.cpp slots with prefix reuse in
:mod:`regional.kv_slots`, paged blocks in :mod:`regional.kv_paged`); the scheduler decides the order, the
batch, the preemptions and the finish.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import abc, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from regional.engine import EngineFinish, GenerationRequest, Logprobs
from regional.prompt_scores import PromptScores
from regional.sampler import TokenSampler
from regional.step_cost import StepCost

# The most prompt rows whose logits one step computes for prompt log-probabilities, all sequences together:
# each is a whole vocabulary row (1 MiB for Gemma) through the output layer and scored in numpy, so many
# scorers at once cannot make everyone's step slow; fewer while keys share the node.
SCORED_ROWS_PER_STEP = 64
SHARED_SCORED_ROWS_PER_STEP = 16
# Keys with a sequence waiting or running within this many seconds share the node (short steps, above).
SHARED_WINDOW_S = 5.0
# The fewest prompt tokens a shared step gives the prompts in it, however slow steps are: they must advance.
MIN_SHARED_CHUNK = 8


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    arrived_at: float
    sampler: TokenSampler
    events: asyncio.Queue | None = None
    slot: int = -1  # the KV memory's id for this sequence (a llama.cpp sequence id)
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


@dataclass(frozen=True, slots=True)
class Admission:
    """A sequence joins the batch in ``slot``, reusing the first ``prefix_len`` KV cells of ``source``.

    First the idle caches of the ``evicted`` slots are cleared (to make room for it). Then, when
    ``source == slot``, the slot's own idle cache is trimmed to the prefix; otherwise the slot is cleared
    and then shares the source's cells.
    """

    sequence: Sequence
    slot: int
    source: int
    prefix_len: int
    evicted: tuple[int, ...] = ()


class KvMemory(Protocol):
    """Where the sequences' KV cells live, and which cached prefix a newcomer reuses.

    It only keeps books; what the model's memory must do comes back as values that the plan carries.
    """

    total_tokens: int

    def used_tokens(self) -> int: ...

    def allocate(self, seq: Sequence) -> Admission | None:
        """Place ``seq`` (its ``slot``) with the longest cached prefix it can reuse, dropping idle caches
        if that makes room; None, with nothing changed, when it must wait."""
        ...

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Room for the KV of ``seq``'s next ``num_tokens`` tokens (from ``num_computed`` on) this step."""
        ...

    def append(self, seq: Sequence, num_tokens: int) -> None:
        """Take that room: the step writes those tokens' KV."""
        ...

    def release(self, seq: Sequence, now: float) -> None:
        """``seq`` left (or was preempted); what it computed stays cached for a later prompt that starts
        the same way."""
        ...

    def evict_idle(self) -> list[int]:
        """Drop every idle cache; returns the slots whose cells must be cleared."""
        ...

    def reset(self) -> None:
        """The model's memory was wiped: every slot is free and empty."""
        ...


@dataclass(slots=True)
class StepPlan:
    """Everything one step needs: memory changes first, then one model call over the batch."""

    admissions: list[Admission] = field(default_factory=list)
    # The batch: one row per token.
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    want_logits: list[bool] = field(default_factory=list)
    # (sequence, batch row of its logits): the sequences that sample a token after this step
    samples: list[tuple[Sequence, int]] = field(default_factory=list)
    # (sequence, tokens it adds to its KV this step)
    advances: list[tuple[Sequence, int]] = field(default_factory=list)
    # Sequences finished while planning: the KV memory cannot hold them even alone (never in the batch)
    finished: list[Sequence] = field(default_factory=list)
    # (sequence, first batch row, rows): prompt rows whose logits score the next prompt token, for the
    # sequences that asked for prompt log-probabilities (rows scored before a recompute are not again)
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)

    @property
    def evictions(self) -> list[int]:
        """Slots whose idle caches were dropped this step: their cells must be cleared."""
        return [slot for a in self.admissions for slot in a.evicted]

    def add(self, seq: Sequence, tokens: list[int], sample: bool) -> None:
        start, first_row = seq.num_computed, len(self.tokens)
        for offset, token in enumerate(tokens):
            self.tokens.append(token)
            self.positions.append(start + offset)
            self.seq_ids.append(seq.slot)
            self.want_logits.append(False)
        if seq.request.prompt_logprobs is not None:
            # Positions begin..end-1 predict prompt tokens begin+1..end; the last prompt position predicts
            # the first output token, which the sample scores.
            begin = max(start, len(seq.prompt_logprobs))
            end = min(start + len(tokens), len(seq.prompt) - 1)
            if begin < end:
                rows = range(first_row + begin - start, first_row + end - start)
                for row in rows:
                    self.want_logits[row] = True
                self.prompt_rows.append((seq, rows.start, len(rows)))
        if sample:
            self.want_logits[-1] = True
            self.samples.append((seq, len(self.tokens) - 1))
        self.advances.append((seq, len(tokens)))


class Scheduler:
    def __init__(
        self,
        memory: KvMemory,
        max_sequences: int,
        batch_tokens: int,
        prefill_chunk: int,
        is_end_of_generation: Callable[[int], bool],
        step_cost: StepCost | None = None,
    ) -> None:
        self.memory = memory
        # Fitted step times: while keys share the node, a step's prompt tokens are what fits its target.
        self.step_cost = step_cost
        self.max_sequences = max_sequences
        self.batch_tokens = batch_tokens
        self.prefill_chunk = prefill_chunk
        self.is_end_of_generation = is_end_of_generation
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # sequences whose KV was freed for room (stats)
        self._seen: dict[str, float] = {}  # share key -> when it last had a sequence here
        self.prompt_scores = PromptScores()  # scored prompts' log-probabilities, for prompts alike

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def free_sequences(self) -> int:
        return self.max_sequences - len(self.running)

    def add(self, seq: Sequence) -> None:
        top_n = seq.request.prompt_logprobs
        if top_n is not None and not seq.prompt_logprobs:
            # A prompt scored before (or one starting the same way): its scores, then its KV, are reused.
            seq.prompt_logprobs = self.prompt_scores.lookup(seq.prompt, top_n)
        self.waiting.append(seq)

    def schedule(self, now: float) -> StepPlan:
        """Admit waiting sequences while there is room, then build one batch over everyone running."""
        plan = StepPlan()
        self._admit(plan, now)
        self._batch(plan, now, self._shared(now))
        return plan

    def _shared(self, now: float) -> bool:
        """Whether more than one share key had a sequence here within SHARED_WINDOW_S."""
        seen = self._seen
        for seq in self.running:
            seen[seq.share_key] = now
        for seq in self.waiting:
            seen[seq.share_key] = now
        if len(seen) < 2:
            return False
        horizon = now - SHARED_WINDOW_S
        for key in [k for k, at in seen.items() if at < horizon]:
            del seen[key]
        return len(seen) > 1

    def _admit(self, plan: StepPlan, now: float) -> None:
        """Admit while a sequence and its KV room are free, fairly across share keys (:meth:`_next`).

        The next one that does not fit waits for room: no other overtakes it, so none is starved. One that
        does not fit even with nobody running never will: it finishes with "error" rather than blocking the
        queue."""
        while self.waiting and len(self.running) < self.max_sequences:
            seq = self._next()
            admission = self.memory.allocate(seq)
            if admission is None:
                if self.running:
                    break
                self.waiting.remove(seq)
                seq.finish_reason = "length" if seq.output else "error"
                plan.finished.append(seq)
                continue
            self.waiting.remove(seq)
            seq.num_computed = admission.prefix_len
            if not seq.num_preemptions:  # what a recompute finds cached is its own work, not a hit
                seq.num_cached_tokens = admission.prefix_len
            seq.admitted_at = now
            self.running.append(seq)
            plan.admissions.append(admission)

    def _next(self) -> Sequence:
        """Who is admitted next: a preempted sequence (it waits at the front) comes back first; otherwise
        the oldest waiting one of the share key that holds the fewest KV tokens in the batch (round-robin by
        tokens: a key with nothing running goes before one with four long prompts, oldest key first)."""
        head = self.waiting[0]
        if head.num_preemptions or len(self.waiting) == 1:
            return head
        held: dict[str, int] = {}
        for seq in self.running:
            held[seq.share_key] = held.get(seq.share_key, 0) + seq.reserved_tokens
        # min() keeps the first of equals: the oldest waiting sequence of the least-holding key.
        return min(self.waiting, key=lambda seq: held.get(seq.share_key, 0))

    def _batch(self, plan: StepPlan, now: float, shared: bool = False) -> None:
        """One token for every decoding sequence, then prompt chunks in the room left.

        While anyone is decoding, prompts advance by at most ``prefill_chunk`` tokens a step, so a long
        prompt costs the others a slightly longer step, never a frozen stream; so too in a step that ends a
        prompt (its first token is due) and while keys share the node (``shared``). Prompts take the room
        in rounds across share keys (:func:`_prefill_order`): each key's first prompt, shortest first, then
        each key's second, and so on. Each sequence's tokens need KV room first (:meth:`_make_room`).
        """
        prefilling = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted for an older sequence's room
                continue
            if seq.is_prefilling:
                prefilling.append(seq)
            elif self._make_room(plan, seq, 1, now):
                plan.add(seq, [seq.output[-1]], sample=True)
        room = self.batch_tokens - len(plan.tokens)
        short = bool(plan.tokens) or shared  # someone waits on this step: keep it short
        if short:
            room = min(room, self.prefill_chunk)
        scored_room = SHARED_SCORED_ROWS_PER_STEP if shared else SCORED_ROWS_PER_STEP
        if shared and self.step_cost is not None:
            # What the in-progress step makes a newcomer wait: about step_cost's target, measured.
            tokens, rows = self.step_cost.prompt_budget(len(plan.tokens), MIN_SHARED_CHUNK, room)
            room, scored_room = tokens, min(scored_room, rows)
        first_due = False  # a prompt in this step gives its first token
        for seq in _prefill_order(prefilling):
            if room <= 0:
                break
            if seq not in self.running:
                continue
            # Positions whose scores it already has (a recompute, scores reused) cost no scored rows.
            scored = seq.request.prompt_logprobs is not None and seq.num_computed < len(seq.prompt)
            known = max(len(seq.prompt_logprobs) - seq.num_computed, 0) if scored else 0
            if scored and scored_room <= 0 and not known:
                continue
            chunk = seq.uncomputed(min(room, known + scored_room) if scored else room)
            if shared and first_due and seq.num_computed + len(chunk) < seq.num_tokens:
                # While keys share the node, a step that answers someone's first token carries no part
                # of another prompt: only whole ones (other newcomers), so that token comes as soon as
                # it would on an idle node. A long prompt loses one short step per newcomer.
                continue
            if self._make_room(plan, seq, len(chunk), now):
                first_token = seq.num_computed + len(chunk) == seq.num_tokens
                plan.add(seq, chunk, sample=first_token)
                room -= len(chunk)
                if scored:
                    scored_room -= max(len(chunk) - known, 0)
                first_due = first_due or first_token
                if first_token and not short:  # the rest of the step waits for that token too
                    short, room = True, min(room, self.prefill_chunk - len(chunk))

    def _make_room(self, plan: StepPlan, seq: Sequence, num_tokens: int, now: float) -> bool:
        """Take KV room for ``seq``'s next ``num_tokens``, preempting while there is none; False when
        ``seq`` itself had to go.

        The victim is the most recently admitted sequence not already in this step's batch, so a prompt
        chunk never takes a decoding stream's blocks (decodes are batched first). A sequence that is alone
        and still does not fit never will: it finishes ("length" once it has output, else "error").
        """
        while not self.memory.can_append(seq, num_tokens):
            batched = {s for s, _ in plan.advances}
            victim = next(s for s in reversed(self.running) if s not in batched)
            if victim is seq and len(self.running) == 1:
                seq.finish_reason = "length" if seq.output else "error"
                self._retire(seq, now)
                plan.finished.append(seq)
                return False
            self._preempt(victim, now)
            if victim is seq:
                return False
        self.memory.append(seq, num_tokens)
        return True

    def _preempt(self, seq: Sequence, now: float) -> None:
        """Free ``seq``'s KV and put it first in line: it recomputes prompt and outputs, then samples on,
        its stream neither repeating nor skipping a token."""
        self.running.remove(seq)
        self.memory.release(seq, now)
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(
        self,
        plan: StepPlan,
        sampled: abc.Sequence[int | None],
        now: float,
        prompt_scores: abc.Sequence[list[Logprobs]] = (),
    ) -> list[Sequence]:
        """The model ran ``plan``: advance its sequences, append the sampled tokens, retire the finished.

        ``sampled`` follows ``plan.samples``; None is a sampling that failed, which finishes that sequence
        alone with "error". ``prompt_scores`` follows ``plan.prompt_rows``. A sequence with ``max_tokens``
        0 only scores its prompt: its sample is dropped and it finishes with "length". Returns the
        sequences that finished, each with its ``finish_reason``.
        """
        for seq, num_tokens in plan.advances:
            seq.num_computed += num_tokens
        for (seq, _row, _rows), scores in zip(plan.prompt_rows, prompt_scores, strict=True):
            seq.prompt_logprobs.extend(scores)
        finished = []
        for (seq, _row), token in zip(plan.samples, sampled, strict=True):
            if token is None:
                seq.finish_reason = "error"
            elif seq.request.max_tokens == 0:
                seq.finish_reason = "length"
            else:
                seq.output.append(token)
                if self.is_end_of_generation(token):
                    seq.finish_reason = "stop"
                elif len(seq.output) >= seq.request.max_tokens:
                    seq.finish_reason = "length"
            if seq.finish_reason is not None:
                self._retire(seq, now)
                finished.append(seq)
        return finished

    def _retire(self, seq: Sequence, now: float) -> None:
        self.running.remove(seq)
        self.memory.release(seq, now)  # its slot keeps the computed tokens' cells for prefix reuse
        top_n = seq.request.prompt_logprobs
        if top_n is not None and seq.finish_reason in ("stop", "length"):
            self.prompt_scores.store(seq.prompt, top_n, seq.prompt_logprobs)

    def abort(self, seq: Sequence, now: float) -> None:
        """The request left; between steps, so no plan holds it."""
        seq.finish_reason = "abort"
        if seq in self.running:
            self._retire(seq, now)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def evict_idle_caches(self) -> list[int]:
        """The model's memory is full: forget every idle cache; returns the slots whose cells to clear."""
        return self.memory.evict_idle()

    def fail_running(self) -> list[Sequence]:
        """A step failed and left the model's memory unknown: every running sequence fails, every cache
        is dropped (the engine wipes the model's memory). Waiting sequences stay."""
        failed, self.running = self.running, []
        for seq in failed:
            seq.finish_reason = "error"
        self.memory.reset()
        return failed

    def drain(self) -> list[Sequence]:
        """Every waiting and running sequence, removed: the engine is going away."""
        everyone = [*self.waiting, *self.running]
        self.waiting.clear()
        self.running = []
        return everyone


def _prefill_order(prefilling: list[Sequence]) -> list[Sequence]:
    """Prompts in rounds across share keys: every key's first (in batch order), then every key's second;
    within a round the fewest tokens left to prefill first (a short chat's prompt takes one step)."""
    rank: dict[str, int] = {}
    keyed = []
    for i, seq in enumerate(prefilling):
        n = rank.get(seq.share_key, 0)
        rank[seq.share_key] = n + 1
        keyed.append((n, seq.num_tokens - seq.num_computed, i, seq))
    if len(rank) < 2:
        return prefilling  # one key: the batch order, as before
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]
