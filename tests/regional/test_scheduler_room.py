"""Room is the scheduler's business: a request's KV and sampling state live on its Sequence and are freed
through it; when the KV memory says no (paged blocks, inside ``schedule``) or the model itself had no room
for a batch (llama.cpp's pool, told through ``postprocess``), the scheduler preempts or drops idle caches
and retries, and the engine never calls back mid-step (issue 20, item 3)."""

from __future__ import annotations

from gpu.kv_blocks import GroupSpec, KvBlockManager
from regional.engine import GenerationRequest, SamplingParams
from regional.kv_paged import PagedMemory
from regional.kv_slots import SlotMemory
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler, Sequence, StepPlan
from regional.torch_engine import sampling_row

END = 0


def seq(rid: str, prompt: list[int], max_tokens: int = 4, seed: int | None = None) -> Sequence:
    params = SamplingParams(temperature=0.8, frequency_penalty=0.5, seed=seed)
    request = GenerationRequest(rid, prompt, max_tokens, params)
    return Sequence(request, arrived_at=0.0, sampler=TokenSampler(params, prompt))


def step(sched: Scheduler, token: int = 99) -> tuple[StepPlan, list[Sequence]]:
    plan = sched.schedule(0.0)
    return plan, sched.postprocess(plan, [token] * len(plan.samples), 0.0)


def slot_scheduler(max_sequences: int, kv_tokens: int) -> tuple[Scheduler, SlotMemory]:
    memory = SlotMemory(max_sequences, kv_tokens)
    return Scheduler(memory, max_sequences, 64, 64, lambda t: t == END), memory


def paged_scheduler(num_blocks: int, block_size: int) -> tuple[Scheduler, KvBlockManager]:
    blocks = KvBlockManager([GroupSpec("global", num_blocks + 1)], block_size)
    return Scheduler(PagedMemory(blocks), 8, 64, 8, lambda t: t == END), blocks


# --- paged blocks: can_append says no inside schedule ---------------------------------------------------


def test_a_preemption_frees_the_sequences_blocks_through_it_and_keeps_its_sampling_state():
    sched, blocks = paged_scheduler(num_blocks=6, block_size=2)  # 12 tokens
    old, new = seq("old", [1, 2, 3, 4], max_tokens=8, seed=7), seq("new", [5, 6, 7, 8], max_tokens=8)
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefilled: 2 blocks each, one token out each
    rows = {s: sampling_row(s) for s in (old, new)}  # as the torch engine's first draw makes them
    new.sampler.counts[99] = 1  # and as the llama.cpp engine's sampler counts
    seed = rows[new].seed
    assert rows[new].params is new.request.sampling  # held, not copied
    while not new.num_preemptions:
        plan, _ = step(sched)
    # The preempting step: new gave its blocks back from schedule itself, before anything ran.
    assert new not in [s for s, _ in plan.advances] and new.finish_reason is None
    assert new.blocks is None and new.num_computed == 0 and list(sched.waiting) == [new]
    assert old.blocks is not None
    assert blocks.usage().blocks_used == {"global": len(old.blocks.table("global"))}
    blocks.check_invariants([old.blocks])  # no block is held by a table nobody has
    # What it sampled with stays on it: the stream goes on where it was after it recomputes.
    assert new.sampling_row is rows[new] and new.sampling_row.seed == seed
    assert new.sampler.counts == {99: 1}
    assert sampling_row(new).index == len(new.output) == 3
    while sched.has_work:
        step(sched)
    assert old.output == new.output == [99] * 8
    assert old.blocks is None and new.blocks is None and blocks.usage().blocks_used == {"global": 0}
    blocks.check_invariants([])


def test_an_abort_frees_the_blocks_from_the_sequence():
    sched, blocks = paged_scheduler(num_blocks=8, block_size=2)
    a = seq("a", [1, 2, 3, 4, 5])
    sched.add(a)
    step(sched)
    assert a.blocks is not None and blocks.usage().blocks_used == {"global": 3}
    sched.abort(a, 1.0)
    assert a.blocks is None and a.finish_reason == "abort"
    assert blocks.usage().blocks_used == {"global": 0} and blocks.promised == {"global": 0}
    blocks.check_invariants([])


# --- llama.cpp slots: the model had no room, told through postprocess -----------------------------------


def test_a_batch_the_model_had_no_room_for_is_retried_after_the_idle_caches_are_dropped():
    sched, memory = slot_scheduler(max_sequences=3, kv_tokens=100)
    done = seq("done", [1, 2, 3], max_tokens=1)
    sched.add(done)
    step(sched)  # finished: its slot keeps [1, 2, 3] as an idle cache
    a = seq("a", [4, 5, 6])
    sched.add(a)
    step(sched)
    late = seq("late", [7, 8])
    sched.add(late)  # arrives while the model is full: it waits for the retry to pass
    plan = sched.schedule(1.0)
    assert [x.sequence for x in plan.admissions] == [late]
    assert sched.postprocess(plan, [], 1.0, model_full=True) == []  # nothing ran, nobody advanced
    assert a.num_computed == 3 and a.output == [99] and late.num_computed == 0
    retry = sched.schedule(2.0)
    assert retry.cleared == [done.slot] and retry.evictions == [done.slot]
    assert memory.slots[done.slot].cached == [] and memory.used_tokens() == a.reserved_tokens + 6
    assert retry.admissions == [] and retry.tokens == plan.tokens and retry.positions == plan.positions
    assert sched.num_preemptions == 0
    sched.postprocess(retry, [99] * len(retry.samples), 2.0)
    assert a.output == [99, 99] and late.output == [99]


def test_with_no_idle_cache_to_drop_the_newest_is_preempted_and_recomputes_from_nothing():
    sched, memory = slot_scheduler(max_sequences=2, kv_tokens=100)
    a, b = seq("a", [1, 2, 3], max_tokens=5), seq("b", [4, 5], max_tokens=5)
    sched.add(a)
    sched.add(b)
    step(sched)
    plan = sched.schedule(1.0)
    sched.postprocess(plan, [], 1.0, model_full=True)
    retry = sched.schedule(2.0)
    assert b.num_preemptions == 1 and sched.num_preemptions == 1 and list(sched.waiting) == [b]
    assert retry.cleared == [b.slot] and memory.slots[b.slot].cached == []  # its cells go too
    assert retry.seq_ids == [a.slot] and retry.admissions == []
    sched.postprocess(retry, [99], 2.0)
    back = sched.schedule(3.0)
    assert [x.sequence for x in back.admissions] == [b] and back.admissions[0].prefix_len == 0
    assert back.tokens[back.seq_ids.index(b.slot) :] == [4, 5, 99]  # its prompt and output again...
    assert b in [s for s, _ in back.samples]  # ...then it samples on
    sched.postprocess(back, [99] * len(back.samples), 3.0)
    while sched.has_work:
        step(sched)
    assert a.output == b.output == [99] * 5 and a.finish_reason == b.finish_reason == "length"


def test_one_alone_the_model_has_no_room_for_finishes():
    sched, memory = slot_scheduler(max_sequences=2, kv_tokens=100)
    a = seq("a", [1, 2, 3], max_tokens=5)
    sched.add(a)
    step(sched)
    plan = sched.schedule(1.0)
    sched.postprocess(plan, [], 1.0, model_full=True)
    retry = sched.schedule(2.0)
    assert retry.finished == [a] and a.finish_reason == "length" and retry.tokens == []
    assert retry.cleared == [a.slot] and memory.used_tokens() == 0 and not sched.has_work
