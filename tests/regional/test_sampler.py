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


def test_min_p_keeps_only_tokens_at_least_min_p_times_the_likeliest():
    # Probabilities relative to token 1's: e^0 = 1, e^-1 = 0.37, e^-2 = 0.14, and about e^-15 for the rest.
    logits = row({1: 5.0, 2: 4.0, 3: 3.0})
    sampler = TokenSampler(SamplingParams(temperature=1.0, min_p=0.3, seed=5))
    draws = [sampler.sample(logits) for _ in range(400)]
    assert set(draws) == {1, 2}  # 3 (0.14 < 0.3 of the likeliest) and the tail never appear
    share = draws.count(1) / len(draws)
    assert abs(share - 1 / (1 + np.e**-1)) < 0.06  # renormalised over the kept two
    wide = TokenSampler(SamplingParams(temperature=1.0, min_p=0.1, seed=5))
    assert {wide.sample(logits) for _ in range(400)} == {1, 2, 3}


def test_min_p_is_relative_to_the_tempered_distribution():
    logits = row({1: 5.0, 2: 4.0})
    # At temperature 0.25 token 2 is e^-4 = 0.018 of token 1: under min_p 0.05.
    sampler = TokenSampler(SamplingParams(temperature=0.25, min_p=0.05, seed=9))
    assert {sampler.sample(logits) for _ in range(300)} == {1}


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    sampler = TokenSampler(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt_tokens=[1, 3, 1])
    logits = row({1: 6.0, 2: 4.0, 3: -1.0, 4: -1.5})
    adjusted = sampler._repetition_penalised(logits)
    assert adjusted[1] == 3.0 and adjusted[2] == 4.0  # seen in the prompt: halved; unseen: as it was
    assert adjusted[3] == -2.0 and adjusted[4] == -1.5  # a negative seen logit doubles, more unlikely
    assert logits[1] == 6.0  # the engine's row is never written


def test_repetition_penalty_counts_prompt_and_output_tokens():
    logits = row({1: 6.0, 2: 4.0, 3: 3.5})
    # Token 1 is in the prompt: 6 / 2 = 3 < 4, so greedy starts at 2; once 2 is seen (2), 3 leads
    # (3.5); once all are seen, 1 leads again (3 > 2 > 1.75): a seen token is penalised once, not per count.
    sampler = TokenSampler(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt_tokens=[1])
    assert [sampler.sample(logits) for _ in range(4)] == [2, 3, 1, 1]
    plain = TokenSampler(SamplingParams(temperature=0.0), prompt_tokens=[1])
    assert [plain.sample(logits) for _ in range(3)] == [1, 1, 1]
