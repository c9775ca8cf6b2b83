"""Log-probabilities without a model: the numpy log-softmax and top-N over a 262k row, and the scheduler's
bookkeeping of prompt rows (chunked prefill, no prefix reuse, max_tokens 0)."""

from __future__ import annotations

import numpy as np

from regional.engine import GenerationRequest, Logprobs, SamplingParams
from regional.kv_slots import SlotMemory
from regional.logprobs import LOGPROB_FLOOR, position_logprobs, top_tokens
from regional.sampler import TokenSampler
from regional.scheduler import SCORED_ROWS_PER_STEP, Scheduler, Sequence, StepPlan

VOCAB = 262_144  # Gemma 3's


def reference_logprobs(row: np.ndarray) -> np.ndarray:
    wide = row.astype(np.float64)
    return wide - (wide.max() + np.log(np.exp(wide - wide.max()).sum()))


def test_logprobs_are_the_log_softmax_of_the_raw_row_and_the_top_n_are_sorted():
    row = np.random.default_rng(1).normal(0, 4, VOCAB).astype(np.float32)
    reference = reference_logprobs(row)
    scored = position_logprobs(row, token=12345, top_n=20)
    assert abs(scored.logprob - reference[12345]) < 1e-6
    best = np.argsort(-reference)[:20]
    assert [t for t, _ in scored.top] == best.tolist()
    assert np.allclose([lp for _, lp in scored.top], reference[best], atol=1e-6)
    assert sum(np.exp(lp) for _, lp in scored.top) <= 1.0
    assert position_logprobs(row, 7, 0).top == []


def test_the_block_scan_finds_what_a_full_sort_finds():
    rng = np.random.default_rng(2)
    for size in (VOCAB, VOCAB + 100, 5000, 300, 16):  # whole blocks, a tail, few blocks, under one block
        for trial in range(6):
            row = rng.normal(0, 4, size).astype(np.float32)
            if trial % 2:
                row = np.round(row)  # many ties, also across blocks
            for n in (1, 5, 20):
                top = top_tokens(row, n)
                assert np.array_equal(row[top], np.sort(row)[::-1][:n]) and len(set(top.tolist())) == min(
                    n, size
                )


def test_top_ties_go_to_the_lower_id_as_argmax_does_and_a_minus_inf_logit_has_a_floor():
    row = np.zeros(16, dtype=np.float32)
    row[[9, 3, 12]] = 5.0
    assert top_tokens(row, 3).tolist() == [3, 9, 12] and int(np.argmax(row)) == 3
    row[4] = -np.inf
    assert position_logprobs(row, 4, 1).logprob == LOGPROB_FLOOR


def scheduler(batch_tokens: int, max_sequences: int = 2) -> Scheduler:
    memory = SlotMemory(max_sequences, 1024)
    return Scheduler(memory, max_sequences, batch_tokens, batch_tokens, lambda token: token == 0)


def sequence(prompt: list[int], max_tokens: int, prompt_logprobs: int | None) -> Sequence:
    request = GenerationRequest("r", prompt, max_tokens, SamplingParams(), prompt_logprobs=prompt_logprobs)
    return Sequence(request, arrived_at=0.0, sampler=TokenSampler(request.sampling))


def scores_for(plan: StepPlan) -> list[list[Logprobs]]:
    """What the engine would compute: here, each row's position as its 'logprob'."""
    return [
        [Logprobs(0, -float(plan.positions[row + i]), []) for i in range(rows)]
        for _, row, rows in plan.prompt_rows
    ]


def test_every_prompt_position_but_the_last_is_scored_once_across_prefill_chunks():
    sched = scheduler(batch_tokens=4)
    s = sequence(list(range(100, 110)), max_tokens=1, prompt_logprobs=2)  # 10 tokens: chunks of 4, 4, 2
    sched.add(s)
    marked = []
    while s.finish_reason is None:
        plan = sched.schedule(0.0)
        marked += [p for p, want in zip(plan.positions, plan.want_logits, strict=True) if want]
        sched.postprocess(plan, [7] * len(plan.samples), 0.0, scores_for(plan))
    # Positions 0..8 predict prompt tokens 1..9; position 9's logits pick (and score) the first output.
    assert marked == list(range(10))
    assert [-lp.logprob for lp in s.prompt_logprobs] == list(range(9))
    assert s.output == [7]


def test_a_scored_prompt_computes_a_bounded_number_of_logit_rows_a_step():
    sched = scheduler(batch_tokens=512)
    s = sequence(list(range(1, 301)), max_tokens=1, prompt_logprobs=0)
    plain = sequence(list(range(1, 301)), max_tokens=1, prompt_logprobs=None)
    sched.add(s)
    sched.add(plain)
    rows_per_step = []
    while s.finish_reason is None:
        plan = sched.schedule(0.0)
        rows_per_step.append(sum(plan.want_logits))
        sched.postprocess(plan, [7] * len(plan.samples), 0.0, scores_for(plan))
    assert max(rows_per_step) <= SCORED_ROWS_PER_STEP + 1  # + the other sequence's sampled row
    assert len(s.prompt_logprobs) == 299  # and still every position scored once
    assert plain.num_computed >= 300  # the unscored prompt was not held to the bound


def run_one(sched: Scheduler, s: Sequence) -> list[list[bool]]:
    """Run ``s`` to its end; each step's want_logits."""
    sched.add(s)
    wanted = []
    while s.finish_reason is None:
        plan = sched.schedule(0.0)
        wanted.append(plan.want_logits)
        sched.postprocess(plan, [7] * len(plan.samples), 0.0, scores_for(plan))
    return wanted


def test_a_scored_prompt_reuses_a_cached_prefix_only_with_its_scores():
    sched = scheduler(batch_tokens=64, max_sequences=1)
    prompt = list(range(100, 120))
    run_one(sched, sequence(prompt, max_tokens=1, prompt_logprobs=None))
    again = sequence(prompt, max_tokens=1, prompt_logprobs=None)
    scored = sequence(prompt, max_tokens=1, prompt_logprobs=2)
    for s in (again, scored):
        run_one(sched, s)
    assert again.num_cached_tokens == len(prompt) - 1  # the plain one reuses all but the last token
    # Nobody had scored it: its KV is cached but every position's logits are needed.
    assert scored.num_cached_tokens == 0 and len(scored.prompt_logprobs) == len(prompt) - 1
    # Scored once, it is not again: the same scores, the KV reused, one row of logits (the last position's).
    twice = sequence(prompt, max_tokens=1, prompt_logprobs=2)
    wanted = run_one(sched, twice)
    assert twice.num_cached_tokens == len(prompt) - 1 and sum(map(sum, wanted)) == 1
    assert twice.prompt_logprobs == scored.prompt_logprobs
    # A prompt that starts the same way scores only where it differs; fewer alternatives are served too.
    longer = sequence([*prompt[:12], 7, 8, 9, 10], max_tokens=1, prompt_logprobs=1)
    wanted = run_one(sched, longer)
    assert longer.num_cached_tokens == 11 and sum(map(sum, wanted)) == len(longer.prompt) - 11
    assert [-lp.logprob for lp in longer.prompt_logprobs] == list(range(15))
    # More alternatives than were kept: scored again in full.
    wider = sequence(prompt, max_tokens=1, prompt_logprobs=5)
    run_one(sched, wider)
    assert wider.num_cached_tokens == 0


def test_max_tokens_0_scores_the_prompt_and_generates_nothing():
    sched = scheduler(batch_tokens=64)
    s = sequence([5, 6, 7], max_tokens=0, prompt_logprobs=0)
    sched.add(s)
    plan = sched.schedule(0.0)
    finished = sched.postprocess(plan, [9] * len(plan.samples), 0.0, scores_for(plan))
    assert finished == [s] and s.finish_reason == "length" and s.output == []
    assert len(s.prompt_logprobs) == 2 and not sched.has_work
