"""Continuous batching bookkeeping: admission, prefix reuse, chunked prefill, KV room."""

from regional.engine import GenerationRequest, SamplingParams
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler, Sequence


def seq(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(
        GenerationRequest(rid, prompt, max_tokens), arrived_at=0.0, sampler=TokenSampler(SamplingParams())
    )


def run_step(sched: Scheduler, token: int = 99):
    plan = sched.plan_step()
    for s, n in plan.advances:
        s.num_computed += n
    for s, _ in plan.samples:
        s.output.append(token)
    return plan


def test_new_requests_join_a_running_batch_between_steps():
    sched = Scheduler(max_sequences=4, kv_tokens=1000, batch_tokens=64, prefill_chunk=8)
    a = seq("a", [1, 2, 3])
    sched.add(a)
    sched.admit(0)
    run_step(sched)  # a: prefill, first token
    b = seq("b", [5, 6, 7, 8])
    sched.add(b)
    assert [x.sequence for x in sched.admit(1)] == [b]
    plan = run_step(sched)
    assert plan.seq_ids.count(a.slot) == 1  # a decodes one token...
    assert plan.seq_ids.count(b.slot) == 4  # ...while b prefills in the same batch
    assert a.slot != b.slot
    assert len(plan.samples) == 2


def test_long_prompt_is_prefilled_in_chunks_while_others_decode():
    sched = Scheduler(max_sequences=4, kv_tokens=10_000, batch_tokens=512, prefill_chunk=16)
    short = seq("s", [1, 2], max_tokens=100)
    sched.add(short)
    sched.admit(0)
    run_step(sched)
    long = seq("l", list(range(100, 150)), max_tokens=4)
    sched.add(long)
    sched.admit(0)
    sizes = []
    while long.is_prefilling:
        plan = run_step(sched)
        assert short in [s for s, _ in plan.samples]  # the short stream gets a token every step
        sizes.append(plan.seq_ids.count(long.slot))
    assert sizes == [16, 16, 16, 2]


def test_without_decoders_a_prompt_uses_the_whole_batch():
    sched = Scheduler(max_sequences=2, kv_tokens=10_000, batch_tokens=64, prefill_chunk=8)
    s = seq("x", list(range(100)))
    sched.add(s)
    sched.admit(0)
    assert len(run_step(sched).tokens) == 64
    assert len(run_step(sched).tokens) == 36


def test_finished_slot_keeps_its_prefix_for_the_next_prompt():
    sched = Scheduler(max_sequences=2, kv_tokens=1000, batch_tokens=64, prefill_chunk=64)
    system = list(range(1, 21))
    first = seq("1", [*system, 50, 51])
    sched.add(first)
    sched.admit(0)
    run_step(sched)
    sched.finish(first, now=1.0)
    second = seq("2", [*system, 60])
    sched.add(second)
    [admission] = sched.admit(2)
    assert admission.source == admission.slot == first.slot  # trims its own cache in place
    assert admission.prefix_len == 20
    assert second.num_computed == 20 and second.num_cached_tokens == 20
    plan = run_step(sched)
    assert plan.tokens == [60] and plan.positions == [20]


def test_running_sequence_shares_its_prefix_with_a_newcomer():
    sched = Scheduler(max_sequences=3, kv_tokens=1000, batch_tokens=64, prefill_chunk=64)
    system = list(range(1, 11))
    a = seq("a", [*system, 7])
    sched.add(a)
    sched.admit(0)
    run_step(sched)
    b = seq("b", [*system, 8, 9])
    sched.add(b)
    [admission] = sched.admit(0)
    assert admission.source == a.slot and admission.slot != a.slot and admission.prefix_len == 10


def test_whole_prompt_cached_still_recomputes_last_token():
    sched = Scheduler(max_sequences=1, kv_tokens=1000, batch_tokens=64, prefill_chunk=64)
    a = seq("a", [1, 2, 3])
    sched.add(a)
    sched.admit(0)
    run_step(sched)
    sched.finish(a, 1.0)
    b = seq("b", [1, 2, 3])
    sched.add(b)
    [admission] = sched.admit(1)
    assert admission.prefix_len == 2
    assert run_step(sched).tokens == [3]


def test_admission_waits_for_a_free_slot_and_for_kv_room():
    sched = Scheduler(max_sequences=2, kv_tokens=100, batch_tokens=64, prefill_chunk=64)
    for i in range(3):
        sched.add(seq(str(i), [i + 1] * 10, max_tokens=30))  # 40 cells each
    assert len(sched.admit(0)) == 2 and len(sched.waiting) == 1  # slots full
    sched.finish(sched.running[0], 1.0)
    assert len(sched.admit(1)) == 1  # the finished slot's idle cache is replaced


def test_idle_caches_are_evicted_oldest_first_to_make_room():
    sched = Scheduler(max_sequences=3, kv_tokens=100, batch_tokens=64, prefill_chunk=64)
    old, new = seq("old", [1] * 30, 10), seq("new", [2] * 30, 10)
    for s, t in ((old, 1.0), (new, 2.0)):
        sched.add(s)
        sched.admit(0)
        run_step(sched)
        sched.finish(s, t)
    big = seq("big", [3] * 40, max_tokens=20)  # needs 60: 31 + 31 idle cells leave too little
    sched.add(big)
    [admission] = sched.admit(3)
    assert sched.slots[old.slot].cached == [] or admission.slot == old.slot
    assert sched.kv_tokens_used() <= 100


def test_finish_of_waiting_sequence_removes_it():
    sched = Scheduler(max_sequences=1, kv_tokens=1000, batch_tokens=64, prefill_chunk=64)
    a, b = seq("a", [1]), seq("b", [2])
    sched.add(a)
    sched.add(b)
    sched.admit(0)
    sched.finish(b, 0)
    assert not sched.waiting and sched.running == [a]


def test_dropping_idle_caches_frees_their_cells_but_not_running_ones():
    sched = Scheduler(max_sequences=3, kv_tokens=1000, batch_tokens=64, prefill_chunk=64)
    done, running = seq("done", [1, 2, 3, 4]), seq("running", [5, 6, 7])
    for s in (done, running):
        sched.add(s)
    sched.admit(0)
    run_step(sched)
    sched.finish(done, 1.0)
    assert sched.drop_idle_caches() == [done.slot]
    assert sched.slots[done.slot].cached == [] and sched.slots[running.slot].owner is running
    assert sched.drop_idle_caches() == []
