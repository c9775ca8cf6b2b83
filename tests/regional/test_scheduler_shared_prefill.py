"""Prompts that start the same way are computed once: a newcomer whose prompt a running sequence is still
prefilling waits for that prefix and then reuses it (a request's n choices, a long shared system prompt).

Over both memories (llama.cpp's slots, the paged blocks), and through the paged stand-in model, which
checks that every sampled row reads the right KV back.
"""

from __future__ import annotations

import functools

import pytest

from regional.scheduler import MIN_SHARED_PREFILL, Scheduler, Sequence
from tests.regional.test_scheduler import scheduler, seq, step
from tests.regional.test_scheduler_paged import StandInModel, expected_output
from tests.regional.test_scheduler_paged import seq as numbered_seq

PROMPT = list(range(1, 101))  # 100 tokens, no end token among them


@pytest.fixture(params=["slots", "paged"])
def make(request: pytest.FixtureRequest) -> functools.partial[Scheduler]:
    return functools.partial(scheduler, memory=request.param)


def run(sched: Scheduler, max_steps: int = 500) -> list[list[tuple[int, Sequence]]]:
    """Steps until nothing is left; per step, the (prompt tokens, sequence) each prefilling row computed."""
    steps = []
    while sched.has_work:
        plan = sched.schedule(0.0)
        steps.append([(n, s) for s, n in plan.advances if s.num_computed < len(s.prompt) and not s.output])
        sched.postprocess(plan, [99] * len(plan.samples), 0.0)
        assert len(steps) < max_steps, "no progress"
    return steps


def test_a_requests_choices_compute_their_prompt_once(make):
    sched = make(max_sequences=8, kv_tokens=2048, batch_tokens=64, prefill_chunk=32)
    choices = [seq(f"choice-{i}", PROMPT, max_tokens=3) for i in range(4)]
    for s in choices:
        sched.add(s)
    first, _ = step(sched)
    assert [a.sequence for a in first.admissions] == choices[:1]  # the others wait for its prompt
    steps = run(sched)
    # The first computed the prompt; each other only what the cache cannot give (its last token).
    computed = sum(n for round_ in steps for n, _ in round_) + sum(n for _, n in first.advances)
    assert computed == len(PROMPT) + 3
    assert [s.num_cached_tokens for s in choices] == [0] + [len(PROMPT) - 1] * 3
    assert all(s.finish_reason == "length" and len(s.output) == 3 for s in choices)


def test_prompts_that_share_less_than_the_threshold_start_together(make):
    sched = make(max_sequences=8, kv_tokens=2048, batch_tokens=256, prefill_chunk=256)
    common = PROMPT[: MIN_SHARED_PREFILL - 1]
    a, b = seq("a", [*common, 500, 501, 502]), seq("b", [*common, 600, 601, 602])
    sched.add(a)
    sched.add(b)
    plan, _ = step(sched)
    assert {x.sequence for x in plan.admissions} == {a, b}


def test_others_are_admitted_past_a_sequence_that_waits_for_a_prefix(make):
    sched = make(max_sequences=8, kv_tokens=2048, batch_tokens=64, prefill_chunk=32)
    first, sibling, other = seq("1", PROMPT), seq("2", PROMPT), seq("3", [200 + t for t in PROMPT])
    for s in (first, sibling, other):
        sched.add(s)
    plan, _ = step(sched)
    assert [a.sequence for a in plan.admissions] == [first, other]
    assert list(sched.waiting) == [sibling]


def test_a_sequence_waits_for_the_shared_part_only(make):
    """A newcomer sharing the first 40 tokens of a long prompt comes in once those 40 are computed, not
    once the whole prompt is."""
    sched = make(max_sequences=8, kv_tokens=2048, batch_tokens=16, prefill_chunk=16)
    long_one = seq("long", PROMPT + list(range(1000, 1300)))
    sched.add(long_one)
    newcomer = seq("new", [*PROMPT[:40], 7000, 7001])
    sched.add(newcomer)
    admitted_at = None
    for number in range(1, 6):
        plan, _ = step(sched)
        if newcomer in [a.sequence for a in plan.admissions]:
            admitted_at = number
            break
    assert admitted_at == 4  # after steps computing tokens 0-15, 16-31, 32-47
    assert newcomer.num_cached_tokens == 40 and long_one.is_prefilling


def test_a_preempted_sequence_does_not_wait_for_a_prefix():
    sched = scheduler(max_sequences=8, kv_tokens=2048, batch_tokens=64, prefill_chunk=32, memory="paged")
    first, again = seq("1", PROMPT), seq("2", PROMPT)
    sched.add(first)
    step(sched)
    again.num_preemptions = 1  # as if it had run and lost its blocks
    sched.waiting.appendleft(again)
    plan, _ = step(sched)
    assert again in [a.sequence for a in plan.admissions]


def test_shared_prefixes_read_the_right_kv_through_the_paged_stand_in():
    """Eight prompts on one 40-token system prompt, in blocks of 4, with preemptions: every sampled row
    reads its whole context back (the stand-in checks), and each stream is whole."""
    model = StandInModel(num_blocks=20, block_size=4, max_sequences=6, batch_tokens=32, chunk=8)
    system = [3 + t for t in range(40)]
    seqs = [numbered_seq(i, [*system, 100 + i, 200 + i], max_tokens=10) for i in range(8)]
    for s in seqs:
        model.sched.add(s)
    model.run()
    for s in seqs:
        assert s.output == expected_output(s)
    assert model.sched.num_preemptions > 0
    assert [s.num_cached_tokens for s in seqs] == [0] + [40] * 7
