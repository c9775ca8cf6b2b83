"""The torch engine's step on a tiny random model, through its own calls: the scheduler's plan, then
``_run_model`` returning the logits that ``_sample`` takes (the engine keeps none of them), each sequence
sampling with the row it carries; preempted or batched, a stream is the stream it is alone (issue 20,
item 3)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from bench.gpu.crosstalk import alone_logits
from gpu.kv_cache import PagedKvCache, block_manager_for
from regional.config import EngineConfig
from regional.engine import GenerationRequest, Logprobs, SamplingParams
from regional.sampler import TokenSampler
from regional.scheduler import Sequence
from regional.torch_engine import DeviceLogits, TorchEngine
from tests.gpu.test_paged_model import BLOCK_SIZE, tiny_gemma

VOCAB = 97
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_k=20, frequency_penalty=0.3, seed=11)


def tiny_engine(num_blocks: int) -> TorchEngine:
    """A torch engine on the CPU whose model is the tiny Gemma (loaded by hand: no GGUF)."""
    config = EngineConfig(
        kind="gpu", device="cpu", block_size=BLOCK_SIZE, max_sequences=4, batch_tokens=32, prefill_chunk=5
    )
    engine = TorchEngine("tiny", "no.gguf", config)
    engine._model = tiny_gemma()
    engine._blocks = block_manager_for(engine._model.config, num_blocks, BLOCK_SIZE)
    engine._kv = PagedKvCache(engine._model.config, num_blocks, BLOCK_SIZE)
    return engine


def sequence(rid: str, prompt: list[int], sampling: SamplingParams, logprobs: int | None = None) -> Sequence:
    request = GenerationRequest(rid, prompt, 8, sampling, logprobs=logprobs)
    return Sequence(request, arrived_at=0.0, sampler=TokenSampler(sampling, prompt))


Drawn = tuple[int, torch.Tensor, int, Logprobs | None]  # position, its logits, the token, its logprobs


def decode(engine: TorchEngine, seqs: list[Sequence]) -> tuple[dict[str, list[Drawn]], int]:
    """Every stream to its end through schedule -> _run_model -> _sample -> postprocess; what each draw
    saw, and how many preemptions there were."""
    sched = engine._new_scheduler(lambda _token: False)
    for s in seqs:
        sched.add(s)
    drawn: dict[str, list[Drawn]] = {s.request_id: [] for s in seqs}
    while sched.has_work:
        plan = sched.schedule(0.0)
        assert not plan.finished
        logits = engine._run_model(plan)
        assert isinstance(logits, DeviceLogits)
        assert logits.values.shape == (sum(plan.want_logits), VOCAB)
        sampled, logprobs, failures = engine._sample(plan, logits)
        assert failures == {} and len(sampled) == len(plan.samples)
        for (s, row), token, scored in zip(plan.samples, sampled, logprobs, strict=True):
            row_logits = torch.from_numpy(logits.row(row))
            drawn[s.request_id].append((plan.positions[row], row_logits, token, scored))
        sched.postprocess(plan, sampled, 0.0)
        engine._blocks.check_invariants([s.blocks for s in sched.running])
    assert not [name for name in vars(engine) if "logit" in name]  # nothing of a step stays on the engine
    return drawn, sched.num_preemptions


PROMPTS = {"a": [5, 17, 29, 41, 53, 65, 3], "b": [11, 22, 33], "c": [40, 41, 42, 43, 44, 45]}


@pytest.fixture(scope="module")
def batched() -> tuple[TorchEngine, dict[str, Sequence], dict[str, list[Drawn]], int]:
    # 8 usable blocks of 4 (32 tokens) for three streams of 11 to 15 tokens: the newest, b, is preempted.
    engine = tiny_engine(num_blocks=9)
    seqs = {
        "a": sequence("a", PROMPTS["a"], GREEDY),
        "c": sequence("c", PROMPTS["c"], GREEDY),
        "b": sequence("b", PROMPTS["b"], SEEDED, logprobs=2),
    }
    drawn, preemptions = decode(engine, list(seqs.values()))
    return engine, seqs, drawn, preemptions


def test_the_logits_run_model_returns_are_the_streams_own_and_greedy_takes_their_argmax(batched):
    engine, seqs, drawn, preemptions = batched
    assert preemptions == 1
    for rid in ("a", "c"):
        s = seqs[rid]
        assert len(s.output) == 8 and [token for *_, token, _ in drawn[rid]][-8:] == s.output
        reference = alone_logits(engine._model, s.prompt + s.output[:-1], BLOCK_SIZE)
        for position, row, token, scored in drawn[rid]:
            torch.testing.assert_close(row, reference[position], rtol=1e-4, atol=1e-4)
            assert token == int(row.argmax()) and scored is None


def test_a_seeded_stream_draws_from_the_row_it_carries_the_same_batched_preempted_or_alone(batched):
    _, seqs, drawn, _ = batched
    s = seqs["b"]
    alone = sequence("b", PROMPTS["b"], SEEDED, logprobs=2)
    decode(tiny_engine(num_blocks=9), [alone])
    assert s.num_preemptions == 1 and alone.num_preemptions == 0
    assert s.output == alone.output and len(set(s.output)) > 1
    row = s.sampling_row
    assert row is not None and row.seed == 11 and row.index == 7  # the last draw was output token 7
    assert row.output_counts == Counter(s.output)
    for _position, logits, token, scored in drawn["b"]:
        logp = torch.log_softmax(logits.double(), dim=-1)
        assert scored is not None and scored.token_id == token
        assert scored.logprob == pytest.approx(float(logp[token]), abs=1e-4)
        assert [t for t, _ in scored.top] == logp.topk(2).indices.tolist()
