"""The scheduler shares a node across keys (the edge's opaque share key): admission from the key holding the
fewest KV tokens, prompts prefilled in rounds across keys, prompt scoring capped per step for everyone."""

from __future__ import annotations

from regional.engine import GenerationRequest, Logprobs, SamplingParams
from regional.sampler import TokenSampler
from regional.scheduler import SCORED_ROWS_PER_STEP, SHARED_SCORED_ROWS_PER_STEP, SHARED_WINDOW_S, Sequence
from tests.regional.test_scheduler import scheduler, step


def seq(rid: str, prompt: list[int], max_tokens: int = 4, key: str = "", scored: bool = False) -> Sequence:
    request = GenerationRequest(
        rid, prompt, max_tokens, prompt_logprobs=20 if scored else None, share_key=key
    )
    return Sequence(request, arrived_at=0.0, sampler=TokenSampler(SamplingParams()))


def long_prompt(i: int, n: int = 100) -> list[int]:
    return [1000 * (i + 1) + t for t in range(n)]


def test_a_short_chat_from_another_key_is_admitted_before_a_keys_queued_long_prompts():
    # Room for two of A's long prompts (104 cells each) and a short chat, not for a third long prompt.
    sched = scheduler(max_sequences=8, kv_tokens=230, batch_tokens=512)
    flood = [seq(f"a{i}", long_prompt(i), key="A") for i in range(4)]
    for s in flood:
        sched.add(s)
    chat = seq("b", [7, 8, 9], key="B")
    sched.add(chat)  # last in line
    plan, _ = step(sched)
    admitted = [a.sequence for a in plan.admissions]
    assert admitted == [flood[0], chat, flood[1]]  # A first (it came first), then B: it held nothing
    assert chat.output == [99]  # its prompt ran in the first step, beside A's
    assert list(sched.waiting) == flood[2:]


def test_one_key_alone_is_served_first_come_first_served():
    sched = scheduler(max_sequences=8, kv_tokens=230, batch_tokens=512)
    mine = [seq(f"a{i}", long_prompt(i), key="A") for i in range(3)] + [seq("a-chat", [7, 8, 9], key="A")]
    for s in mine:
        sched.add(s)
    plan, _ = step(sched)
    assert [a.sequence for a in plan.admissions] == mine[:2]  # the third does not fit; the chat waits behind


def test_prompts_are_prefilled_a_round_at_a_time_across_keys():
    # Two of A's long prompts are prefilling when B's chat joins: B's prompt goes in the next step, its
    # first token with it, though A's prompts were admitted before it; that step carries no part of A's
    # (the token comes as on an idle node). Then A's first prompt takes the step beside B's decode, and its
    # second waits for the next round.
    sched = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=64, prefill_chunk=64)
    a1, a2 = seq("a1", long_prompt(1, 300), key="A"), seq("a2", long_prompt(2, 300), key="A")
    sched.add(a1)
    sched.add(a2)
    step(sched)
    computed = a1.num_computed
    chat = seq("b", [7, 8, 9], key="B")
    sched.add(chat)
    plan, _ = step(sched)
    assert chat in [s for s, _ in plan.samples] and chat.output == [99]
    assert plan.seq_ids == [chat.slot] * 3 and a1.num_computed == computed
    plan, _ = step(sched)
    assert plan.seq_ids[0] == chat.slot and plan.seq_ids.count(a1.slot) == 63
    assert a2.num_computed == 0


def test_prompt_scoring_is_capped_per_step_for_all_sequences_together():
    # Four echo + logprobs completions at once score at most SCORED_ROWS_PER_STEP prompt rows a step between
    # them (each row is a whole vocabulary of logits), so the others' steps stay short.
    sched = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=512, prefill_chunk=512)
    scorers = [seq(f"e{i}", long_prompt(i, 200), max_tokens=0, key=f"K{i}", scored=True) for i in range(4)]
    for s in scorers:
        sched.add(s)
    chat = seq("b", [7, 8, 9], key="B")
    sched.add(chat)
    steps = 0
    while any(s.finish_reason is None for s in scorers):
        plan = sched.schedule(0.0)
        assert sum(rows for _, _, rows in plan.prompt_rows) <= SCORED_ROWS_PER_STEP
        scores = [[Logprobs(99, -1.0, [])] * rows for _, _, rows in plan.prompt_rows]
        sched.postprocess(plan, [99] * len(plan.samples), 0.0, scores)
        steps += 1
        if steps == 1:
            assert chat.output == [99]  # the chat's prompt ran in the first step, beside them
    assert steps >= 4 * 199 // SCORED_ROWS_PER_STEP
    assert all(len(s.prompt_logprobs) == 199 for s in scorers)  # every prompt row scored once


def test_a_preempted_sequence_still_comes_back_first():
    sched = scheduler(max_sequences=4, kv_tokens=1000, memory="paged")
    a = seq("a", long_prompt(1, 20), key="A")
    sched.add(a)
    step(sched)
    b = seq("b", [7, 8, 9], key="B")
    sched.add(b)
    sched._preempt(a, 0.0)  # as _make_room would, for room
    assert sched._next() is a


def test_while_keys_share_the_node_every_step_is_kept_short():
    # A step cannot be cut once it runs: what a newcomer waits for is the step in progress. Alone, A's long
    # prompt takes the whole batch; once B has been here (within SHARED_WINDOW_S), a prefill_chunk.
    sched = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=256, prefill_chunk=32)
    a = seq("a", long_prompt(1, 2000), key="A")
    sched.add(a)
    plan, _ = step(sched, now=0.0)
    assert len(plan.tokens) == 256
    b = seq("b", [7, 8, 9], max_tokens=1, key="B")
    sched.add(b)
    plan, _ = step(sched, now=1.0)
    assert len(plan.tokens) == 3 and b.finish_reason == "length"  # B's first token: B's prompt alone
    plan, _ = step(sched, now=1.5)
    assert len(plan.tokens) == 32  # a chunk
    plan, _ = step(sched, now=2.0)
    assert len(plan.tokens) == 32  # B has left, but may come back
    plan, _ = step(sched, now=1.0 + SHARED_WINDOW_S + 0.1)
    assert len(plan.tokens) == 256  # alone again


def test_a_step_that_ends_a_prompt_is_short_even_for_one_key():
    sched = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=256, prefill_chunk=32)
    short, long = seq("s", [7, 8, 9]), seq("l", long_prompt(1, 2000))
    sched.add(short)
    sched.add(long)
    plan, _ = step(sched)
    assert short.output == [99] and len(plan.tokens) == 32  # its first token does not wait for 253 more


def test_while_keys_share_the_node_prompt_scoring_takes_fewer_rows_a_step():
    sched = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=512, prefill_chunk=512)
    scorer = seq("e", long_prompt(1, 200), max_tokens=0, key="A", scored=True)
    sched.add(scorer)
    assert sum(rows for _, _, rows in sched.schedule(0.0).prompt_rows) == SCORED_ROWS_PER_STEP
    other = scheduler(max_sequences=8, kv_tokens=10_000, batch_tokens=512, prefill_chunk=512)
    other.add(seq("e", long_prompt(1, 200), max_tokens=0, key="A", scored=True))
    other.add(seq("b", [7, 8, 9], key="B"))
    step(other)  # B's first token, its prompt alone
    assert sum(rows for _, _, rows in other.schedule(0.0).prompt_rows) == SHARED_SCORED_ROWS_PER_STEP
