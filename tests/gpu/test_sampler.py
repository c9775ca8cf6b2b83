"""The batched sampler (gpu/sampler.py) on the CPU: what each parameter does, draws that follow the
distribution, seeds that reproduce in any batch, and log-probabilities of the raw logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpu.sampler import SamplingRow, draw, sample, uniform
from nearshore.sampling import SamplingParams


def logits_of(probs: list[float], vocab: int = 0) -> torch.Tensor:
    row = torch.full((max(vocab, len(probs)),), -1e9)
    row[: len(probs)] = torch.log(torch.tensor(probs))
    return row


def row(seed: int = 0, index: int = 0, **params) -> SamplingRow:
    """A row of the request's ``params`` at draw ``index`` of the stream ``seed``."""
    return SamplingRow(SamplingParams(**params), seed=seed, index=index)


def test_uniform_is_a_function_of_seed_and_index_and_looks_uniform():
    assert uniform(7, 3) == uniform(7, 3)
    assert uniform(7, 3) != uniform(7, 4) and uniform(7, 3) != uniform(8, 3)
    values = np.array([uniform(42, i) for i in range(20_000)])
    assert values.min() >= 0 and values.max() < 1
    counts, _ = np.histogram(values, bins=10, range=(0, 1))
    assert counts.min() > 1800 and counts.max() < 2200  # within ~5 sigma of 2000 a bin


def test_greedy_rows_take_the_argmax_and_drawn_rows_follow_the_distribution():
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = logits_of(probs, vocab=16)
    rows = [row(temperature=1.0, seed=1, index=i) for i in range(6000)]
    batch = logits.repeat(len(rows), 1)
    tokens = draw(batch, rows).tolist()
    freq = np.bincount(tokens, minlength=16)[:4] / len(tokens)
    assert np.all(np.abs(freq - probs) < 0.025), freq
    assert sample(logits[None], [row(temperature=0.0)]).tokens == [0]
    assert sample(logits[None], [row(temperature=0.7, top_k=1)]).tokens == [0]


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.7), {0, 1}),  # 0.5 alone is short of 0.7; 0.5 + 0.3 covers it
        (SamplingParams(top_p=0.5), {0}),
        (SamplingParams(min_p=0.5), {0, 1}),  # 0.3 >= 0.25; 0.15 is not
        (SamplingParams(min_p=0.2), {0, 1, 2}),
    ],
)
def test_filters_keep_only_their_tokens(params: SamplingParams, allowed: set[int]):
    logits = logits_of([0.5, 0.3, 0.15, 0.05], vocab=8)
    rows = [SamplingRow(params, seed=3, index=i) for i in range(800)]
    tokens = set(draw(logits.repeat(len(rows), 1), rows).tolist())
    assert tokens == allowed


def test_temperature_sharpens_and_flattens():
    logits = logits_of([0.6, 0.4])
    cold = [row(temperature=0.25, seed=9, index=i) for i in range(3000)]
    hot = [row(temperature=4.0, seed=9, index=i) for i in range(3000)]
    share_cold = np.mean(draw(logits.repeat(3000, 1), cold).numpy() == 0)
    share_hot = np.mean(draw(logits.repeat(3000, 1), hot).numpy() == 0)
    expected_cold = 0.6**4 / (0.6**4 + 0.4**4)
    expected_hot = 0.6**0.25 / (0.6**0.25 + 0.4**0.25)
    assert abs(share_cold - expected_cold) < 0.03 and abs(share_hot - expected_hot) < 0.03


def test_a_seeded_row_draws_the_same_tokens_in_any_batch():
    torch.manual_seed(0)
    vocab = 512
    mine = torch.randn(vocab) * 3
    params = [row(temperature=0.9, top_p=0.95, seed=1234, index=i) for i in range(20)]
    alone = [sample(mine[None], [p]).tokens[0] for p in params]
    crowd = []
    for i, p in enumerate(params):  # at a different row each time, among other requests
        others = torch.randn(i % 5 + 1, vocab)
        at = min(i % 3, len(others))
        batch = torch.cat([others[:at], mine[None], others[at:]])
        rows = [row(temperature=1.0, seed=j, index=i) for j in range(len(batch))]
        rows[at] = p
        crowd.append(sample(batch, rows).tokens[at])
    assert alone == crowd
    assert len(set(alone)) > 1  # and it is a draw, not an argmax


def test_a_masked_row_draws_the_same_whether_its_batch_is_sorted_whole_or_only_its_allowed_head():
    # Only the tokens of nonzero probability are sorted (under a grammar, few of a large vocabulary); beside
    # an unmasked row the whole vocabulary is. The masked row's draws must not tell the two apart.
    torch.manual_seed(1)
    vocab = 4096
    masked = torch.full((vocab,), float("-inf"))
    masked[torch.randperm(vocab)[:37]] = torch.randn(37) * 2
    unmasked = torch.randn(vocab)
    for params in (SamplingParams(temperature=0.8), SamplingParams(top_p=0.9), SamplingParams(top_k=5)):
        for i in range(200):
            mine = SamplingRow(params, seed=11, index=i)
            alone = draw(masked[None], [mine])
            beside = draw(torch.stack([masked, unmasked]), [mine, row(seed=5, index=i)])
            assert alone.item() == beside[0].item()
            assert masked[alone.item()] > float("-inf")


def test_a_draw_at_the_top_of_the_uniforms_range_never_takes_a_forbidden_token(monkeypatch):
    # u just below 1 is 1.0 in float32: the target is the whole mass, past the last allowed token. The
    # draw falls back to the last token of nonzero probability, never to one the mask forbids.
    monkeypatch.setattr("gpu.sampler.uniform", lambda seed, index: 1.0 - 2.0**-53)
    logits = logits_of([0.5, 0.3, 0.2], vocab=64)
    logits[3:] = float("-inf")
    tokens = draw(logits.repeat(4, 1), [row(temperature=t) for t in (0.5, 1.0, 1.5, 3.0)])
    assert set(tokens.tolist()) <= {0, 1, 2}


def test_penalties_follow_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    penalised = SamplingRow(
        SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        seed=0,
        output_counts={0: 2},
        prompt_tokens=[1],
        logprobs=4,
    )
    from gpu.sampler import _penalised

    out = _penalised(logits, [penalised])[0].tolist()
    # token 0: 2.0 / 2 (repetition) - (2 * 0.5 + 0.25); token 1: -1.0 * 2 (prompt, negative); others as is
    assert out == pytest.approx([1.0 - 1.25, -2.0, 0.5, 0.0])
    result = sample(logits, [penalised])
    assert result.tokens == [2]  # the penalties moved the argmax from 0 to 2
    chosen, top = result.logprobs[0]
    raw = torch.log_softmax(logits[0], -1).tolist()
    assert chosen == pytest.approx(raw[2])  # log-probabilities are the raw model's, before penalties
    assert [t for t, _ in top] == [0, 2, 3, 1] and top[0][1] == pytest.approx(raw[0])
    assert math.fsum(math.exp(v) for _, v in top) == pytest.approx(1.0, abs=1e-5)


def test_rows_without_logprobs_get_none_and_zero_gives_only_the_chosen():
    logits = torch.randn(3, 50)
    greedy = SamplingParams(temperature=0.0)
    rows = [SamplingRow(greedy, seed=0), SamplingRow(greedy, seed=0, logprobs=0), SamplingRow(greedy, seed=0)]
    result = sample(logits, rows)
    assert result.logprobs[0] is None and result.logprobs[2] is None
    chosen, top = result.logprobs[1]
    assert top == [] and chosen == pytest.approx(torch.log_softmax(logits[1], -1).max().item())
