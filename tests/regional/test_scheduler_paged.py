"""The scheduler over paged KV blocks: preemption when blocks run out, admission that waits for blocks,
long prompts beside running streams, sequences that can never fit. (The contract shared with
llama.cpp's slots runs over both memories in tests/regional/test_scheduler.py.)

A stand-in model checks each step: every row feeds the sequence's true token at its position, its "KV"
(the context it was computed from) goes to the slot the block table gives, every sampled row can read
its whole context back from the slots, and the sampled token names its own position, so a stream that
repeats or skips a token after a preemption shows.
"""

from __future__ import annotations

import random

import pytest

from gpu.kv_blocks import GroupSpec, KvBlockManager
from regional.engine import GenerationRequest, Logprobs, SamplingParams
from regional.kv_paged import PagedMemory
from regional.sampler import TokenSampler
from regional.scheduler import Scheduler, Sequence, StepPlan

END = 0


def seq(number: int, prompt: list[int], max_tokens: int, prompt_logprobs: int | None = None) -> Sequence:
    request = GenerationRequest(str(number), prompt, max_tokens, prompt_logprobs=prompt_logprobs)
    return Sequence(request, arrived_at=0.0, sampler=TokenSampler(SamplingParams()))


def token_at(s: Sequence, position: int) -> int:
    """What the stand-in model samples for position ``position`` of ``s``: never the end token."""
    return 1000 * (int(s.request_id) + 1) + position


def expected_output(s: Sequence) -> list[int]:
    return [token_at(s, len(s.prompt) + k) for k in range(s.request.max_tokens)]


class StandInModel:
    def __init__(
        self, num_blocks: int, block_size: int, max_sequences: int = 8, batch_tokens: int = 64, chunk: int = 8
    ) -> None:
        self.blocks = KvBlockManager([GroupSpec("global", num_blocks + 1)], block_size)
        self.sched = Scheduler(
            PagedMemory(self.blocks), max_sequences, batch_tokens, chunk, lambda token: token == END
        )
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the context its key was computed from

    def step(self, now: float = 0.0) -> tuple[StepPlan, list[Sequence]]:
        plan = self.sched.schedule(now)
        self.check_blocks()
        by_slot = {s.slot: s for s, _ in plan.advances}
        for row, (token, position, slot_id) in enumerate(
            zip(plan.tokens, plan.positions, plan.seq_ids, strict=True)
        ):
            s = by_slot[slot_id]
            context = s.prompt + s.output
            assert token == context[position], f"row {row} feeds a wrong token"
            [slot] = s.blocks.slots("global", position, 1)
            self.kv[slot] = tuple(context[: position + 1])
        sampled = []
        for s, row in plan.samples:
            position, context = plan.positions[row], s.prompt + s.output
            assert position == len(context) - 1, "a sample that does not extend the stream"
            for p, slot in enumerate(s.blocks.slots("global", 0, position + 1)):
                assert self.kv.get(slot) == tuple(context[: p + 1]), f"position {p}'s KV is missing or stale"
            sampled.append(token_at(s, position + 1))
        scores = [[Logprobs(0, -1.0, [])] * rows for _s, _row, rows in plan.prompt_rows]
        finished = self.sched.postprocess(plan, sampled, now, scores)
        self.check_blocks()
        return plan, finished

    def check_blocks(self) -> None:
        """The pools agree with the running sequences' tables: whoever left gave every block back."""
        self.blocks.check_invariants([s.blocks for s in self.sched.running])
        assert all(s.blocks is None for s in self.sched.waiting)

    def run(self, max_steps: int = 10_000) -> list[StepPlan]:
        plans = []
        while self.sched.has_work:
            plans.append(self.step()[0])
            assert len(plans) < max_steps, "the scheduler does not make progress"
        return plans


def test_preemption_frees_blocks_and_the_stream_resumes_without_a_repeat_or_a_gap():
    model = StandInModel(num_blocks=16, block_size=2, chunk=4)  # 32 tokens; each sequence grows to 18
    seqs = [seq(i, [10 + i] * 6, max_tokens=12) for i in range(4)]
    for s in seqs:
        model.sched.add(s)
    plans = model.run()
    assert model.sched.num_preemptions > 0
    for s in seqs:
        assert s.output == expected_output(s) and s.finish_reason == "length"
    assert sum(s.num_preemptions for s in seqs) == model.sched.num_preemptions
    assert seqs[0].num_preemptions == 0  # the oldest always keeps its blocks
    # A preempted sequence comes back first and finds its own finished blocks still cached.
    returns = [a for p in plans for a in p.admissions if a.sequence.num_preemptions]
    assert returns and any(a.prefix_len > 0 for a in returns)
    assert all(s.num_cached_tokens == 0 for s in seqs)  # its own work is not reported as a cache hit
    assert model.blocks.usage().blocks_used == {"global": 0}


def test_a_long_prompt_never_starves_running_streams_even_when_blocks_run_out():
    model = StandInModel(num_blocks=20, block_size=4, chunk=4)  # 80 tokens
    streams = [seq(i, [5 + i] * 4, max_tokens=30) for i in range(2)]  # up to 34 tokens, 9 blocks each
    for s in streams:
        model.sched.add(s)
    for _ in range(20):
        model.step()  # 24 tokens each: 12 blocks held, 8 free
    long = seq(9, list(range(100, 128)), max_tokens=1)  # 7 blocks: admitted, then short of room
    model.sched.add(long)
    while model.sched.has_work:
        decoding = [s for s in model.sched.running if not s.is_prefilling]
        plan, _ = model.step()
        sampled = [s for s, _ in plan.samples]
        assert all(s in sampled for s in decoding if s is not long), "a running stream missed its token"
    assert model.sched.num_preemptions >= 1 and long.num_preemptions >= 1
    assert all(s.num_preemptions == 0 and s.output == expected_output(s) for s in streams)
    assert long.output == expected_output(long)


def test_admission_waits_while_blocks_are_short():
    model = StandInModel(num_blocks=6, block_size=4)  # 24 tokens
    first = seq(0, list(range(1, 17)), max_tokens=4)  # 16 tokens: 4 blocks
    second = seq(1, list(range(50, 62)), max_tokens=2)  # 12 tokens: 3 blocks, 2 free
    model.sched.add(first)
    model.sched.add(second)
    plan, _ = model.step()
    assert [a.sequence for a in plan.admissions] == [first] and list(model.sched.waiting) == [second]
    while first.finish_reason is None:
        plan, _ = model.step()
        assert second not in [a.sequence for a in plan.admissions]
    plan, _ = model.step()
    assert [a.sequence for a in plan.admissions] == [second]
    model.run()
    assert second.output == expected_output(second) and model.sched.num_preemptions == 0


def test_a_sequence_that_can_never_fit_finishes_instead_of_waiting_forever():
    model = StandInModel(num_blocks=4, block_size=4)  # 16 tokens
    huge = seq(0, list(range(1, 20)), max_tokens=2)  # a 19-token prompt
    grows = seq(1, list(range(1, 11)), max_tokens=20)  # 10 tokens, then outgrows the memory alone
    after = seq(2, [7, 8], max_tokens=2)
    for s in (huge, grows, after):
        model.sched.add(s)
    plan, _ = model.step()
    assert plan.finished == [huge] and huge.finish_reason == "error"
    finished = []
    while grows.finish_reason is None:
        plan, _ = model.step()
        finished += plan.finished
    assert finished == [grows] and grows.finish_reason == "length"
    assert grows.output == expected_output(grows)[:7]  # positions 10..15 computed, the 7th sampled at 15
    model.run()
    assert after.output == expected_output(after)


def test_abort_frees_the_blocks_and_a_failed_step_forgets_every_cached_prefix():
    model = StandInModel(num_blocks=16, block_size=2)
    a = seq(0, [1, 2, 3, 4, 5], max_tokens=10)
    model.sched.add(a)
    model.step()
    model.step()
    assert model.blocks.usage().blocks_used["global"] == 3
    model.sched.abort(a, 1.0)
    assert (
        model.blocks.usage().blocks_used["global"] == 0 and model.blocks.usage().blocks_cached["global"] == 3
    )
    b = seq(1, [1, 2, 3, 4, 5, 6], max_tokens=3)
    model.sched.add(b)
    plan, _ = model.step()
    assert plan.admissions[0].prefix_len == 4 and b.num_cached_tokens == 4
    assert model.sched.fail_running() == [b]
    assert model.blocks.usage().blocks_cached["global"] == 0
    c = seq(2, [1, 2, 3, 4, 5, 6], max_tokens=3)
    model.sched.add(c)
    plan, _ = model.step()
    assert plan.admissions[0].prefix_len == 0


@pytest.mark.parametrize("seed", range(12))
def test_random_traffic_under_block_pressure_finishes_every_stream_exactly(seed: int):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    model = StandInModel(
        num_blocks=rng.randint(24, 48) // block_size,
        block_size=block_size,
        max_sequences=rng.randint(2, 6),
        batch_tokens=rng.randint(8, 32),
        chunk=rng.randint(1, 8),
    )
    shared = [rng.randint(1, 50) for _ in range(8)]  # prompts start alike: prefix hits and shared blocks
    seqs = []
    for i in range(rng.randint(4, 10)):
        prompt = shared[: rng.randint(0, 8)] + [rng.randint(1, 50) for _ in range(rng.randint(1, 8))]
        seqs.append(seq(i, prompt, max_tokens=rng.randint(1, 10)))
    arrivals = list(seqs)
    while arrivals or model.sched.has_work:
        if arrivals and rng.random() < 0.5:
            model.sched.add(arrivals.pop(0))
        if model.sched.has_work:
            model.step()
    capacity = model.blocks.usage().blocks_total["global"] * block_size
    for s in seqs:
        if len(s.prompt) + s.request.max_tokens - 1 <= capacity:
            assert s.finish_reason == "length" and s.output == expected_output(s)
        else:  # cut where the memory, alone, was full: what it said is still right
            assert s.output == expected_output(s)[: len(s.output)]


def test_a_scored_prompt_reuses_only_the_positions_it_already_scored():
    model = StandInModel(num_blocks=16, block_size=2)
    prompt = list(range(1, 10))
    model.sched.add(seq(0, prompt, max_tokens=1))
    model.run()
    scored = seq(1, prompt, max_tokens=2, prompt_logprobs=0)
    model.sched.add(scored)
    plan, _ = model.step()
    assert plan.admissions[0].prefix_len == 0  # every prompt position's logits are needed
    model.run()
    assert len(scored.prompt_logprobs) == len(prompt) - 1 and scored.output == expected_output(scored)
    # Back after a preemption, it reuses what it scored already, and no more.
    again = seq(2, prompt, max_tokens=2, prompt_logprobs=0)
    again.prompt_logprobs = [Logprobs(0, -1.0, [])] * 5
    assert model.sched.memory.allocate(again).prefix_len == 4  # block aligned, at most 5
