"""Continuous batching: who runs this step, with which tokens, and who has finished after it.

Pure bookkeeping, no model calls, so it can be tested on its own. One engine step is three calls:

    plan = scheduler.schedule(now)                      # admissions, evictions, preemptions, the batch
    ...the engine applies the plan's memory changes, runs the model on the batch, samples...
    finished = scheduler.postprocess(plan, sampled, now)

The requests' state is on their :class:`~regional.sequence.Sequence`; the plan is a
:class:`~regional.step_plan.StepPlan`; where the KV cells live is a :class:`~regional.kv_memory.KvMemory`'s
decision (llama.cpp slots with prefix reuse in :mod:`regional.kv_slots`, paged blocks in
:mod:`regional.kv_paged`). The scheduler decides the order, the batch, the preemptions and the finish.

Room is the scheduler's business throughout. When the KV memory has no room for a step's tokens
(``can_append``), the newest sequence is preempted (its KV freed, it recomputes later) and the room asked
again; when the model itself had no room for a batch the books let through (llama.cpp's pool: idle caches
hold cells, free ones are split), the step reports it (``postprocess(..., model_full=True)``) and the next
plan drops the idle caches, or preempts, and retries. The plan carries the sequences that can never fit
(``StepPlan.finished``).

Fair by share key (the edge's opaque per-key id, ``GenerationRequest.share_key``): waiting sequences are
admitted from the key holding the fewest KV tokens first, and prompts are prefilled a round at a time across
keys, so one key's long prompts cannot make another key's short chat wait behind all of them. A step cannot
be cut short once it runs, so while keys share the node (within ``SHARED_WINDOW_S``) every step is kept to
``prefill_chunk`` prompt tokens, and to what the node runs in its ``shared_step_ms`` (fitted step times,
:mod:`regional.step_cost`): what a newcomer waits for before its own step begins.

Failure paths are verbs of their own: :meth:`Scheduler.abort` (one request leaves),
:meth:`Scheduler.evict_idle_caches` (free what only caches hold), :meth:`Scheduler.fail_running` (a failed
step: the model's memory is unknown, so every running sequence fails and every cache is dropped).
"""

from __future__ import annotations

from collections import abc, deque
from collections.abc import Callable

from regional.engine import Logprobs
from regional.kv_memory import Admission, KvMemory
from regional.prompt_scores import PromptScores
from regional.sequence import Sequence
from regional.step_cost import StepCost
from regional.step_plan import StepPlan

# The step's types, importable from the scheduler that makes them (the tests and bench/gpu do).
__all__ = [
    "MIN_SHARED_CHUNK",
    "SCORED_ROWS_PER_STEP",
    "SHARED_SCORED_ROWS_PER_STEP",
    "SHARED_WINDOW_S",
    "Admission",
    "KvMemory",
    "Scheduler",
    "Sequence",
    "StepPlan",
]

# The most prompt rows whose logits one step computes for prompt log-probabilities, all sequences together:
# each is a whole vocabulary row (1 MiB for Gemma) through the output layer and scored in numpy, so many
# scorers at once cannot make everyone's step slow; fewer while keys share the node.
SCORED_ROWS_PER_STEP = 64
SHARED_SCORED_ROWS_PER_STEP = 16
# Keys with a sequence waiting or running within this many seconds share the node (short steps, above).
SHARED_WINDOW_S = 5.0
# The fewest prompt tokens a shared step gives the prompts in it, however slow steps are: they must advance.
MIN_SHARED_CHUNK = 8
# A newcomer whose prompt shares at least this many first tokens with a running prompt still being computed
# waits for them (a request's n choices, prompts on one long system prompt or tool list): then the memory
# hands it that prefix instead of its computing it again beside the other (two blocks of the paged cache).
MIN_SHARED_PREFILL = 32


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
        self._model_full = False  # the model had no room for the last batch: the next plan makes room
        self._seen: dict[str, float] = {}  # share key -> when it last had a sequence here
        self.prompt_scores = PromptScores()  # scored prompts' log-probabilities, for prompts alike

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def free_sequences(self) -> int:
        return self.max_sequences - len(self.running)

    def beyond_free(self, arriving: int) -> int:
        """Sequences that would wait for a slot: the waiting ones and ``arriving`` beyond the free slots."""
        return len(self.waiting) + arriving - self.free_sequences()

    def prefill_ms_per_token(self) -> float:
        """A prompt token's prefill in ms as the steps cost, taken ``prefill_chunk`` a step (0: unknown)."""
        return self.step_cost.prefill_ms_per_token(self.prefill_chunk) if self.step_cost is not None else 0.0

    def add(self, seq: Sequence) -> None:
        top_n = seq.request.prompt_logprobs
        if top_n is not None and not seq.prompt_logprobs:
            # A prompt scored before (or one starting the same way): its scores, then its KV, are reused.
            seq.prompt_logprobs = self.prompt_scores.lookup(seq.prompt, top_n)
        self.waiting.append(seq)

    def schedule(self, now: float) -> StepPlan:
        """Admit waiting sequences while there is room, then build one batch over everyone running.

        After a batch the model had no room for, this plan is its retry: room is made first
        (:meth:`_make_room_in_model`) and nobody is admitted, so the batch does not grow back."""
        plan = StepPlan()
        if self._model_full:
            self._model_full = False
            self._make_room_in_model(plan, now)
        else:
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
        later: set[int] = set()  # ids of those waiting for a running prompt's prefix (this round)
        while len(self.waiting) > len(later) and len(self.running) < self.max_sequences:
            seq = self._next(later)
            if not seq.num_preemptions and self._prefix_on_its_way(seq):
                later.add(id(seq))
                continue
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

    def _next(self, later: abc.Set[int] = frozenset()) -> Sequence:
        """Who is admitted next, of those not put off this round (``later``): a preempted sequence (it waits
        at the front) comes back first; otherwise the oldest waiting one of the share key that holds the
        fewest KV tokens in the batch (round-robin by tokens: a key with nothing running goes before one
        with four long prompts, oldest key first)."""
        candidates = [seq for seq in self.waiting if id(seq) not in later] if later else self.waiting
        head = candidates[0]
        if head.num_preemptions or len(candidates) == 1:
            return head
        held: dict[str, int] = {}
        for seq in self.running:
            held[seq.share_key] = held.get(seq.share_key, 0) + seq.reserved_tokens
        # min() keeps the first of equals: the oldest waiting sequence of the least-holding key.
        return min(candidates, key=lambda seq: held.get(seq.share_key, 0))

    def _prefix_on_its_way(self, seq: Sequence) -> bool:
        """Whether a running sequence is still computing a prefix of ``seq``'s prompt at least
        MIN_SHARED_PREFILL long: then ``seq`` waits until that prefix is in and reuses it.

        Prefilling a request's choices side by side would compute its prompt n times; so parallel sampling
        forks a sequence once its prompt is in, and servers hold back a request that shares a prefix with
        one being filled. The wait is the other's prefill of the shared part, which ``seq`` would otherwise
        spend computing it again."""
        reusable = seq.reusable_prefix
        for other in self.running:
            # A scored prompt's prefill is rationed (SCORED_ROWS_PER_STEP): not one to wait for.
            if not other.is_prefilling or other.request.prompt_logprobs is not None:
                continue
            limit = min(reusable, len(other.prompt))
            if (
                limit < MIN_SHARED_PREFILL
                or other.prompt[:MIN_SHARED_PREFILL] != seq.prompt[:MIN_SHARED_PREFILL]
            ):
                continue
            if other.num_computed < _common_prefix_len(other.prompt, seq.prompt, limit):
                return True
        return False

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

    def _make_room_in_model(self, plan: StepPlan, now: float) -> None:
        """The model ran none of the last batch: its memory had no room that the books said it had (idle
        caches hold cells, or split the free ones). This plan retries it after dropping every idle cache
        (their cells cleared first); with none to drop, the newest running sequence is preempted and its
        cells dropped as well. One alone that still found no room never will: it finishes."""
        cleared = self.evict_idle_caches()
        if not cleared and self.running:
            victim = self.running[-1]
            if len(self.running) == 1:
                victim.finish_reason = "length" if victim.output else "error"
                self._retire(victim, now)
                plan.finished.append(victim)
            else:
                self._preempt(victim, now)
            cleared = self.evict_idle_caches()
        plan.cleared.extend(cleared)

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
        *,
        model_full: bool = False,
    ) -> list[Sequence]:
        """The model ran ``plan``: advance its sequences, append the sampled tokens, retire the finished.

        ``sampled`` follows ``plan.samples``; None is a sampling that failed, which finishes that sequence
        alone with "error". ``prompt_scores`` follows ``plan.prompt_rows``. A sequence with ``max_tokens``
        0 only scores its prompt: its sample is dropped and it finishes with "length". Returns the
        sequences that finished, each with its ``finish_reason``.

        ``model_full``: the model had no room for the batch and ran none of it; nobody advances, and the
        next plan makes the room and retries (only a memory whose ``append`` books nothing can be told
        this: llama.cpp's slots, whose books can disagree with the model's pool).
        """
        if model_full:
            self._model_full = True
            return []
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
                elif seq.constraint is not None and seq.constraint.finished:
                    # Its grammar is complete (the JSON closed): nothing may follow.
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


def _common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    """How many of the first ``limit`` tokens ``a`` and ``b`` share."""
    if a[:limit] == b[:limit]:
        return limit  # the usual case: one request's choices, or one system prompt
    return next(i for i in range(limit) if a[i] != b[i])
