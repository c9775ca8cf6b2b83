"""Sampling over a 262k-entry row without sorting it: greedy, top-k, top-p, penalties, seeds."""

import numpy as np

from regional.engine import SamplingParams
from regional.sampler import TokenSampler, nucleus

VOCAB = 4096  # the sampler is size-agnostic; the engine's rows have 262,144 entries


def row(peaks: dict[int, float]) -> np.ndarray:
    logits = np.full(VOCAB, -10.0, dtype=np.float32)
    for token, value in peaks.items():
        logits[token] = value
    return logits


def test_greedy_is_argmax_and_ignores_seed():
    logits = row({7: 5.0, 9: 4.0})
    assert TokenSampler(SamplingParams(temperature=0.0)).sample(logits) == 7
    assert TokenSampler(SamplingParams(temperature=1.0, top_k=1)).sample(logits) == 7


def test_frequency_penalty_moves_greedy_off_a_repeated_token():
    sampler = TokenSampler(SamplingParams(temperature=0.0, frequency_penalty=2.0))
    logits = row({7: 5.0, 9: 4.0})
    assert [sampler.sample(logits) for _ in range(3)] == [7, 9, 7]  # 7: 5-2=3 < 4, then 9: 4-2=2 < 3
    assert logits[7] == 5.0  # the engine's row is never written


def test_presence_penalty_applies_once_per_seen_token():
    sampler = TokenSampler(SamplingParams(temperature=0.0, presence_penalty=1.5))
    logits = row({1: 3.0, 2: 2.0})
    assert [sampler.sample(logits) for _ in range(3)] == [1, 2, 1]


def test_top_k_never_leaves_the_k_best():
    logits = row({10: 3.0, 11: 2.9, 12: 2.8, 13: 2.7})
    sampler = TokenSampler(SamplingParams(temperature=2.0, top_k=2, seed=1))
    assert {sampler.sample(logits) for _ in range(200)} <= {10, 11}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.zeros(VOCAB)
    probs[[5, 6, 7]] = [0.5, 0.3, 0.2]
    assert sorted(nucleus(probs, 0.7).tolist()) == [5, 6]
    assert sorted(nucleus(probs, 0.5).tolist()) == [5]
    assert sorted(nucleus(probs, 1.0).tolist()) == [5, 6, 7]


def test_top_p_sampling_stays_in_nucleus():
    logits = row({1: 5.0, 2: 4.0, 3: 0.0})
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_p=0.5, seed=3))
    assert {sampler.sample(logits) for _ in range(100)} == {1}


def test_seed_makes_draws_repeatable_and_distribution_is_right():
    logits = row({1: 1.0, 2: 0.0})
    params = SamplingParams(temperature=1.0, top_k=2, seed=42)
    a = [TokenSampler(params).sample(logits) for _ in range(1)]
    first = TokenSampler(params)
    second = TokenSampler(params)
    draws_a = [first.sample(logits) for _ in range(2000)]
    draws_b = [second.sample(logits) for _ in range(2000)]
    assert draws_a == draws_b and a[0] == draws_a[0]
    share = draws_a.count(1) / len(draws_a)
    assert abs(share - np.e / (np.e + 1)) < 0.04  # softmax(1, 0)


def test_any_integer_is_a_seed_taken_modulo_2_64():
    logits = row({1: 1.0, 2: 0.9, 3: 0.8, 4: 0.7})

    def draws(seed: int) -> list[int]:
        sampler = TokenSampler(SamplingParams(temperature=1.0, seed=seed))
        return [sampler.sample(logits) for _ in range(64)]

    assert draws(-1) == draws(-1) == draws(2**64 - 1)  # the documented rule: seed mod 2**64
    assert draws(-(2**63)) == draws(2**63) and draws(2**70 + 5) == draws(5)
    assert draws(-1) != draws(1)
