"""The scheduler on its own, no model: schedule -> (the model would run here) -> postprocess cycles.

Admission, prefix reuse, chunked prefill, KV room and evictions carried in the plan, finishing, abort
and the failure verbs. The contract both engines share runs over both memories (``make``): llama.cpp's
slots and the GPU engine's paged blocks (one-token blocks, so prefixes match token by token as slots
do). Paged-only behaviour, preemption above all, is in tests/regional/test_scheduler_paged.py.
"""

from __future__ import annotations

import functools

import pytest

from gpu.kv_blocks import GroupSpec, KvBlockManager
from regional.engine import GenerationRequest, SamplingParams
from regional.kv_paged import PagedMemory
from regional.kv_slots import SlotMemory
from regional.sampler import TokenSampler
from regional.scheduler import Admission, KvMemory, Scheduler, Sequence, StepPlan

END = 0  # the end-of-generation token of these tests


def seq(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(
        GenerationRequest(rid, prompt, max_tokens), arrived_at=0.0, sampler=TokenSampler(SamplingParams())
    )


def scheduler(
    max_sequences: int,
    kv_tokens: int,
    batch_tokens: int = 64,
    prefill_chunk: int = 64,
    memory: str = "slots",
    block_size: int = 1,
) -> Scheduler:
    if memory == "slots":
        kv: KvMemory = SlotMemory(max_sequences, kv_tokens)
    else:
        blocks = KvBlockManager([GroupSpec("global", kv_tokens // block_size + 1)], block_size)
        kv = PagedMemory(blocks)
    return Scheduler(kv, max_sequences, batch_tokens, prefill_chunk, lambda token: token == END)


@pytest.fixture(params=["slots", "paged"])
def make(request: pytest.FixtureRequest) -> functools.partial[Scheduler]:
    """The scheduler over each memory, for the contract they share."""
    return functools.partial(scheduler, memory=request.param)


def step(sched: Scheduler, token: int = 99, now: float = 0.0) -> tuple[StepPlan, list[Sequence]]:
    """One engine step with every sampling sequence drawing ``token``."""
    plan = sched.schedule(now)
    finished = sched.postprocess(plan, [token] * len(plan.samples), now)
    return plan, finished


def run_to_end(sched: Scheduler, s: Sequence, now: float) -> None:
    sched.add(s)
    while s.finish_reason is None:
        step(sched, now=now)


def slots(sched: Scheduler) -> SlotMemory:
    assert isinstance(sched.memory, SlotMemory)
    return sched.memory


def test_new_requests_join_a_running_batch_between_steps(make):
    sched = make(max_sequences=4, kv_tokens=1000, prefill_chunk=8)
    a = seq("a", [1, 2, 3])
    sched.add(a)
    plan, _ = step(sched)  # a: prefill, first token
    assert [x.sequence for x in plan.admissions] == [a] and a.output == [99]
    b = seq("b", [5, 6, 7, 8])
    sched.add(b)
    plan, _ = step(sched)
    assert [x.sequence for x in plan.admissions] == [b]
    assert plan.seq_ids.count(a.slot) == 1  # a decodes one token...
    assert plan.seq_ids.count(b.slot) == 4  # ...while b prefills in the same batch
    assert a.slot != b.slot
    assert [s for s, _ in plan.samples] == [a, b]
    assert a.output == [99, 99] and b.output == [99]


def test_postprocess_alone_advances_the_sequences(make):
    sched = make(max_sequences=1, kv_tokens=1000)
    a = seq("a", [1, 2, 3], max_tokens=10)
    sched.add(a)
    plan = sched.schedule(0)
    assert a.num_computed == 0 and a.output == []  # planned, not yet run
    sched.postprocess(plan, [7], 0)
    assert a.num_computed == 3 and a.output == [7]
    plan = sched.schedule(0)
    assert plan.tokens == [7] and plan.positions == [3]  # the sampled token is fed back at its position
    sched.postprocess(plan, [8], 0)
    assert a.num_computed == 4 and a.output == [7, 8]


def test_long_prompt_is_prefilled_in_chunks_while_others_decode(make):
    sched = make(max_sequences=4, kv_tokens=10_000, batch_tokens=512, prefill_chunk=16)
    short = seq("s", [1, 2], max_tokens=100)
    sched.add(short)
    step(sched)
    long = seq("l", list(range(100, 150)), max_tokens=4)
    sched.add(long)
    sizes = []
    while long.is_prefilling:
        plan, _ = step(sched)
        assert short in [s for s, _ in plan.samples]  # the short stream gets a token every step
        sizes.append(plan.seq_ids.count(long.slot))
        assert (long in [s for s, _ in plan.samples]) == (
            not long.is_prefilling
        )  # samples after its last chunk
    assert sizes == [16, 16, 16, 2]
    assert long.output == [99]


def test_without_decoders_a_prompt_uses_the_whole_batch(make):
    sched = make(max_sequences=2, kv_tokens=10_000, batch_tokens=64, prefill_chunk=8)
    s = seq("x", list(range(100)))
    sched.add(s)
    plan, _ = step(sched)
    assert len(plan.tokens) == 64 and plan.samples == []
    plan, _ = step(sched)
    assert len(plan.tokens) == 36 and plan.want_logits == [False] * 35 + [True]


def test_finish_on_max_tokens_keeps_the_computed_tokens_cached(make):
    sched = make(max_sequences=2, kv_tokens=1000)
    a = seq("a", [1, 2, 3], max_tokens=3)
    sched.add(a)
    finished = [step(sched, token=t)[1] for t in (11, 12, 13)]
    assert finished == [[], [], [a]]
    assert a.finish_reason == "length" and a.output == [11, 12, 13]
    assert sched.running == [] and not sched.has_work
    # Its computed tokens stay cached: the prompt and the outputs fed back (not the last one).
    if isinstance(sched.memory, SlotMemory):
        assert slots(sched).slots[a.slot].cached == [1, 2, 3, 11, 12]
    sched.add(seq("b", [1, 2, 3, 11, 12, 13, 14]))
    assert sched.schedule(1).admissions[0].prefix_len == 5


def test_finish_on_an_end_token(make):
    sched = make(max_sequences=2, kv_tokens=1000)
    a, b = seq("a", [1, 2], max_tokens=50), seq("b", [3, 4], max_tokens=50)
    sched.add(a)
    sched.add(b)
    step(sched)
    plan = sched.schedule(1)
    finished = sched.postprocess(plan, [END, 5], 1)  # a draws the end token, b goes on
    assert finished == [a] and a.finish_reason == "stop" and a.output == [99, END]
    assert b.finish_reason is None and sched.running == [b]


def test_a_failed_sampling_finishes_that_sequence_alone(make):
    sched = make(max_sequences=2, kv_tokens=1000)
    a, b = seq("a", [1, 2], max_tokens=50), seq("b", [3, 4], max_tokens=50)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule(0)
    assert sched.postprocess(plan, [None, 6], 0) == [a]
    assert a.finish_reason == "error" and a.output == []
    assert sched.running == [b] and b.output == [6]


def test_finished_slot_keeps_its_prefix_for_the_next_prompt(make):
    sched = make(max_sequences=2, kv_tokens=1000)
    system = list(range(1, 21))
    first = seq("1", [*system, 50, 51], max_tokens=1)
    run_to_end(sched, first, now=1.0)
    second = seq("2", [*system, 60])
    sched.add(second)
    plan = sched.schedule(2)
    [admission] = plan.admissions
    if isinstance(sched.memory, SlotMemory):
        assert admission.source == admission.slot == first.slot  # trims its own cache in place
    assert admission.prefix_len == 20
    assert second.num_computed == 20 and second.num_cached_tokens == 20
    assert plan.tokens == [60] and plan.positions == [20]


def test_running_sequence_shares_its_prefix_with_a_newcomer(make):
    sched = make(max_sequences=3, kv_tokens=1000)
    system = list(range(1, 11))
    a = seq("a", [*system, 7])
    sched.add(a)
    step(sched)
    b = seq("b", [*system, 8, 9])
    sched.add(b)
    plan, _ = step(sched)
    [admission] = plan.admissions
    if isinstance(sched.memory, SlotMemory):
        assert admission.source == a.slot and admission.slot != a.slot
    assert admission.prefix_len == 10
    assert b.num_cached_tokens == 10 and plan.seq_ids.count(b.slot) == 2


def test_whole_prompt_cached_still_recomputes_last_token(make):
    sched = make(max_sequences=1, kv_tokens=1000)
    run_to_end(sched, seq("a", [1, 2, 3], max_tokens=1), now=1.0)
    sched.add(seq("b", [1, 2, 3]))
    plan = sched.schedule(1)
    assert plan.admissions[0].prefix_len == 2
    assert plan.tokens == [3]


def test_admission_waits_for_a_free_slot_and_for_kv_room():
    sched = scheduler(max_sequences=2, kv_tokens=100)
    for i in range(3):
        sched.add(seq(str(i), [i + 1] * 10, max_tokens=30))  # 40 cells each
    plan = sched.schedule(0)
    assert len(plan.admissions) == 2 and len(sched.waiting) == 1  # slots full
    sched.abort(sched.running[0], 1.0)
    assert len(sched.schedule(1).admissions) == 1  # the freed slot's idle cache is replaced
    roomy = scheduler(max_sequences=4, kv_tokens=100)
    for i in range(3):
        roomy.add(seq(str(i), [i + 1] * 10, max_tokens=30))
    assert len(roomy.schedule(0).admissions) == 2 and len(roomy.waiting) == 1  # 3 x 40 cells > 100


def test_evictions_ride_in_the_plan_oldest_first():
    sched = scheduler(max_sequences=3, kv_tokens=100)
    old, new = seq("old", [1] * 30, 1), seq("new", [2] * 30, 1)
    run_to_end(sched, old, now=1.0)
    run_to_end(sched, new, now=2.0)
    memory = slots(sched)
    assert len(memory.slots[old.slot].cached) == 30 and len(memory.slots[new.slot].cached) == 30
    big = seq("big", [3] * 30, max_tokens=20)  # 50 cells, in the third slot (empty)
    sched.add(big)
    plan = sched.schedule(3)
    [admission] = plan.admissions
    # 60 idle cells + 50 > 100: the oldest cache goes, and the plan says which cells to clear.
    assert admission.evicted == (old.slot,) and plan.evictions == [old.slot]
    assert admission.slot not in (old.slot, new.slot)
    assert memory.slots[old.slot].cached == [] and len(memory.slots[new.slot].cached) == 30
    assert memory.used_tokens() == 80
    assert sched.schedule(4).evictions == []  # told once


def test_nothing_is_evicted_for_a_sequence_that_still_does_not_fit():
    sched = scheduler(max_sequences=3, kv_tokens=100)
    idle = seq("idle", [1] * 30, 1)
    run_to_end(sched, idle, now=1.0)
    running = seq("running", [2] * 10, max_tokens=40)  # holds 50 cells
    sched.add(running)
    step(sched)
    huge = seq("huge", [3] * 30, max_tokens=30)  # 60: even without the idle cache, 50 + 60 > 100
    sched.add(huge)
    plan = sched.schedule(2)
    assert plan.admissions == [] and plan.evictions == [] and list(sched.waiting) == [huge]
    assert len(slots(sched).slots[idle.slot].cached) == 30  # kept: dropping it would have bought nothing


def test_abort_a_running_sequence_keeps_its_prefix_and_a_waiting_one_leaves(make):
    sched = make(max_sequences=1, kv_tokens=1000)
    a, b = seq("a", [1, 2, 3], max_tokens=10), seq("b", [1, 2, 9])
    sched.add(a)
    sched.add(b)
    step(sched)
    step(sched)
    sched.abort(a, 1.0)
    assert a.finish_reason == "abort" and sched.running == []
    if isinstance(sched.memory, SlotMemory):
        assert slots(sched).slots[a.slot].cached == [1, 2, 3, 99]
    plan = sched.schedule(2)  # b takes the slot and reuses the prefix a left
    assert plan.admissions[0].prefix_len == 2 and sched.running == [b]
    c = seq("c", [4])
    sched.add(c)
    sched.abort(c, 2.0)
    assert not sched.waiting and c.finish_reason == "abort"


def test_a_failed_step_fails_the_running_and_drops_every_cache():
    sched = scheduler(max_sequences=3, kv_tokens=20)
    run_to_end(sched, seq("done", [1, 2, 3], max_tokens=1), now=1.0)  # leaves [1, 2, 3] cached
    a, b = seq("a", [4, 5]), seq("b", [6])  # 6 and 5 cells
    waiting = seq("w", [1, 2, 3, 8], max_tokens=10)  # 14 cells: no room beside a and b
    for s in (a, b, waiting):
        sched.add(s)
    assert len(sched.schedule(2).admissions) == 2  # the model would fail on this plan
    assert sched.fail_running() == [a, b]
    assert a.finish_reason == b.finish_reason == "error"
    assert sched.running == [] and list(sched.waiting) == [waiting]
    memory = slots(sched)
    assert all(s.owner is None and s.cached == [] for s in memory.slots) and memory.used_tokens() == 0
    assert sched.schedule(3).admissions[0].prefix_len == 0  # nothing is reused from a wiped memory


def test_evicting_idle_caches_frees_their_cells_but_not_running_ones():
    sched = scheduler(max_sequences=3, kv_tokens=1000)
    done, running = seq("done", [1, 2, 3, 4], max_tokens=1), seq("running", [5, 6, 7])
    run_to_end(sched, done, now=1.0)
    sched.add(running)
    step(sched)
    assert sched.evict_idle_caches() == [done.slot]
    memory = slots(sched)
    assert memory.slots[done.slot].cached == [] and memory.slots[running.slot].owner is running
    assert sched.evict_idle_caches() == []


def test_drain_hands_back_everyone(make):
    sched = make(max_sequences=1, kv_tokens=1000)
    a, b = seq("a", [1]), seq("b", [2])
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.drain() == [b, a] and not sched.has_work


class TokenCountMemory:
    """Another memory manager: room counted in tokens, no prefix reuse (as a block manager might start)."""

    def __init__(self, total_tokens: int) -> None:
        self.total_tokens = total_tokens
        self.held: dict[int, int] = {}
        self.next_id = 0

    def used_tokens(self) -> int:
        return sum(self.held.values())

    def allocate(self, seq: Sequence) -> Admission | None:
        if self.used_tokens() + seq.reserved_tokens > self.total_tokens:
            return None
        seq.slot, self.next_id = self.next_id, self.next_id + 1
        self.held[seq.slot] = seq.reserved_tokens
        return Admission(seq, seq.slot, seq.slot, 0)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return True  # reserved at admission

    def append(self, seq: Sequence, num_tokens: int) -> None:
        pass

    def release(self, seq: Sequence, now: float) -> None:
        del self.held[seq.slot]

    def evict_idle(self) -> list[int]:
        return []

    def reset(self) -> None:
        self.held.clear()


def test_the_scheduler_runs_over_another_memory_manager():
    memory: KvMemory = TokenCountMemory(total_tokens=12)
    sched = Scheduler(memory, 8, batch_tokens=64, prefill_chunk=64, is_end_of_generation=lambda t: t == END)
    a, b = seq("a", [1, 2, 3], max_tokens=7), seq("b", [4, 5], max_tokens=5)  # 10 + 7 cells > 12
    sched.add(a)
    sched.add(b)
    plan, _ = step(sched)
    assert [x.sequence for x in plan.admissions] == [a] and list(sched.waiting) == [b]  # b waits for room
    plan, finished = step(sched, token=END)
    assert finished == [a] and a.finish_reason == "stop" and a.num_computed == 4
    plan, _ = step(sched)
    assert [x.sequence for x in plan.admissions] == [b] and memory.used_tokens() == 7
