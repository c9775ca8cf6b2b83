"""The fitted step times that keep a shared node's steps short, and the scheduler keeping to them."""

from __future__ import annotations

import random

import pytest

from regional.scheduler import MIN_SHARED_CHUNK
from regional.step_cost import MIN_STEPS, REFIT_EVERY, StepCost
from tests.regional.test_scheduler import scheduler, step
from tests.regional.test_scheduler_fair import long_prompt, seq


def cpu_like(cost: StepCost, steps: int = 64, noise_ms: float = 2.0) -> None:
    """Steps as this CPU runs them: 28 ms whatever they hold, 1.5 ms a token, 3.5 ms more a scored row."""
    rng = random.Random(7)
    for _ in range(steps):
        tokens = rng.choice([1, 2, 8, 16, 32, 64, 128])
        rows = rng.choice([0, 0, min(tokens, 4)])
        cost.observe(tokens, rows, (28 + 1.5 * tokens + 3.5 * rows + rng.uniform(-noise_ms, noise_ms)) / 1000)


def test_the_fit_recovers_a_nodes_fixed_and_per_token_costs():
    cost = StepCost(target_ms=50)
    cpu_like(cost)
    assert cost.fit is not None
    fixed, per_token, per_row = cost.fit
    assert abs(fixed - 28) < 2 and abs(per_token - 1.5) < 0.1 and abs(per_row - 3.5) < 1.0
    # 50 ms less 28 fixed and two decodes: ~12 prompt tokens, ~4 of them scored.
    tokens, rows = cost.prompt_budget(decode_tokens=2, floor=8, ceiling=128)
    assert 11 <= tokens <= 13 and 3 <= rows <= 5


def test_a_prompt_tokens_prefill_cost_is_its_own_plus_its_share_of_each_steps_fixed_part():
    cost = StepCost(target_ms=50)
    assert cost.prefill_ms_per_token(128) == 0.0  # not fitted: unknown (the edge's configured speed holds)
    cpu_like(cost)
    fixed, per_token, _ = cost.fit or (0.0, 0.0, 0.0)
    assert cost.prefill_ms_per_token(128) == per_token + fixed / 128  # ~1.5 + 28 / 128
    assert 1.6 < cost.prefill_ms_per_token(128) < 1.8 < cost.prefill_ms_per_token(32)
    sched = scheduler(max_sequences=8, kv_tokens=20_000, batch_tokens=256, prefill_chunk=64)
    assert sched.prefill_ms_per_token() == 0.0
    sched.step_cost = cost
    assert sched.prefill_ms_per_token() == cost.prefill_ms_per_token(64)


def test_two_warm_up_steps_give_a_first_estimate_until_the_fit():
    warm = StepCost(target_ms=50)
    assert warm.two_point() is None
    warm.observe(3, 0, 0.090)  # the cold first prefill
    warm.observe(1, 0, 0.030)  # a decode: 30 ms
    assert warm.two_point() is None  # no step of more than one row yet
    warm.observe(64, 0, 0.1245)  # 64 prompt tokens: 94.5 ms more than one row, 1.5 ms a token
    fixed, per_token = warm.two_point() or (0.0, 0.0)
    assert per_token == pytest.approx(1.5) and fixed == pytest.approx(28.5)
    cost = StepCost(target_ms=50, prior=(fixed, per_token))
    assert cost.prefill_ms_per_token(128) == pytest.approx(1.5 + 28.5 / 128)
    assert cost.prompt_budget(0, 8, 128) == (128, 128)  # two steps are no fit for the budget
    cpu_like(cost, noise_ms=0.0)  # once fitted, the fit (28 ms, 1.5 ms a token) is what it reports
    assert cost.prefill_ms_per_token(128) == pytest.approx(1.5 + 28 / 128, rel=1e-3)
    noise = StepCost(target_ms=50)
    noise.observe(1, 0, 0.030)
    noise.observe(64, 0, 0.029)  # faster than one row: no cost, no estimate
    assert noise.two_point() is None


def test_no_budget_until_the_fit_means_something():
    cost = StepCost(target_ms=50)
    assert cost.prompt_budget(0, 8, 128) == (128, 128)  # nothing measured: the configured chunk
    for _ in range(MIN_STEPS + REFIT_EVERY):  # many steps, all one size: no slope to fit
        cost.observe(1, 0, 0.030)
    assert cost.fit is None and cost.prompt_budget(0, 8, 128) == (128, 128)
    off = StepCost(target_ms=0)  # shared_step_ms = 0: prefill_chunk alone bounds the step
    cpu_like(off)
    assert off.prompt_budget(0, 8, 128) == (128, 128)


def test_a_fast_node_keeps_its_configured_chunk_and_a_slow_one_its_floor():
    fast = StepCost(target_ms=50)
    for i in range(64):  # a GPU: 5 ms a step, 10 us a token
        tokens = 1 + (i % 8) * 64
        fast.observe(tokens, 0, (5 + 0.01 * tokens) / 1000)
    assert fast.prompt_budget(16, 8, 128)[0] == 128
    slow = StepCost(target_ms=50)
    for i in range(64):  # 60 ms before a single token: over the target already
        tokens = 1 + (i % 8) * 16
        slow.observe(tokens, 0, (60 + 2 * tokens) / 1000)
    assert slow.prompt_budget(0, MIN_SHARED_CHUNK, 128)[0] == MIN_SHARED_CHUNK  # prompts still advance


def test_while_keys_share_the_node_a_fitted_scheduler_keeps_steps_to_the_target():
    sched = scheduler(max_sequences=8, kv_tokens=20_000, batch_tokens=256, prefill_chunk=128)
    sched.step_cost = StepCost(target_ms=50)
    cpu_like(sched.step_cost)
    a = seq("a", long_prompt(1, 4000), key="A")
    sched.add(a)
    plan, _ = step(sched, now=0.0)
    assert len(plan.tokens) == 256  # alone: the whole batch
    b = seq("b", [7, 8, 9], max_tokens=3, key="B")
    sched.add(b)
    plan, _ = step(sched, now=0.1)
    assert plan.seq_ids == [b.slot] * 3  # B's first token: its prompt alone
    plan, _ = step(sched, now=0.2)
    # B's decode and ~13 of A's prompt tokens: about 50 ms on this node, not prefill_chunk's ~220 ms.
    assert plan.seq_ids[0] == b.slot and 11 <= plan.seq_ids.count(a.slot) <= 14
