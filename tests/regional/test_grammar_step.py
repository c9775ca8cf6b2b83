"""A step's grammar work beside the model (regional/grammar_step.py, issue 21): each constrained sequence's
mask is computed once per grammar state, on the grammar thread, while the caller goes on; the sampler reads
it; a grammar that allows nothing fails its own sequence where it samples; the cost is counted."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from regional.engine import GenerationRequest, SamplingParams
from regional.grammar import Constraint, GrammarError, GrammarSpec, Vocabulary, allows, check
from regional.grammar_step import GrammarStep, checked
from regional.llama_model import LlamaModel
from regional.sampler import TokenSampler
from regional.sequence import Sequence
from regional.step_plan import StepPlan

GREEDY = SamplingParams(temperature=0.0)


class CountingMatcher:
    """A real llguidance matcher that counts its mask computations and the threads they ran on."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.computed = 0
        self.threads: set[str] = set()

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        self.computed += 1
        self.threads.add(threading.current_thread().name)
        self.inner.unsafe_compute_mask_ptr(pointer, size)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def counted(vocabulary: Vocabulary, spec: GrammarSpec) -> tuple[Constraint, CountingMatcher]:
    constraint = vocabulary.constraint(check(spec))
    assert isinstance(constraint, Constraint)
    spy = CountingMatcher(constraint._matcher)
    constraint._matcher = spy
    return constraint, spy


def sequence(name: str, constraint=None) -> Sequence:
    return Sequence(GenerationRequest(name, [2], 8, GREEDY), 0.0, TokenSampler(GREEDY), constraint=constraint)


def test_a_mask_is_computed_once_per_grammar_state(vocabulary: Vocabulary, model: LlamaModel):
    constraint, spy = counted(vocabulary, GrammarSpec("regex", "[0-9]+"))
    first = constraint.mask().copy()
    assert constraint.mask() is constraint.mask() and spy.computed == 1  # read again: not computed again
    digit = model.tokenize("7", add_special=False)[0]
    assert allows(first, digit)
    constraint.advance(digit)
    constraint.prepare()
    constraint.mask()
    assert spy.computed == 2  # the new state's, once


def test_a_steps_masks_are_computed_on_the_grammar_thread_and_read_by_the_sampler(
    vocabulary: Vocabulary, model: LlamaModel
):
    digits, digit_spy = counted(vocabulary, GrammarSpec("regex", "[0-9]+"))
    braces, brace_spy = counted(vocabulary, GrammarSpec("json_object"))
    free = sequence("free")
    plan = StepPlan(samples=[(free, 0), (sequence("digits", digits), 1), (sequence("braces", braces), 2)])
    step = GrammarStep()
    try:
        pending = step.begin(plan)
        assert pending is not None
        step.ready(pending)
        assert digit_spy.threads == brace_spy.threads and all(
            name.startswith("grammar") for name in digit_spy.threads
        )
        logits = np.random.default_rng(3).standard_normal((3, vocabulary.size)).astype(np.float32)
        tokens = [
            seq.sampler.sample(logits[row], seq.constraint and seq.constraint.mask())
            for seq, row in plan.samples
        ]
        assert digit_spy.computed == 1 and brace_spy.computed == 1  # the sampler found them ready
        assert model.token_piece(tokens[1]).isdigit() and model.token_piece(tokens[2]).startswith(b"{")
        failures: dict[Sequence, str] = {}
        step.advance(plan, list(tokens), failures)
        assert not failures and step.tokens == 2 and step.seconds > 0
        assert step.begin(StepPlan(samples=[(free, 0)])) is None  # nothing constrained: no work queued
    finally:
        step.close()


def test_a_token_the_grammar_refuses_fails_its_sequence_alone(vocabulary: Vocabulary, model: LlamaModel):
    digits = vocabulary.constraint(check(GrammarSpec("regex", "[0-9]+")))
    plan = StepPlan(samples=[(sequence("free"), 0), (sequence("digits", digits), 1)])
    letter = model.tokenize("x", add_special=False)[0]
    step = GrammarStep()
    sampled: list[int | None] = [letter, letter]  # the mask was not applied: the grammar refuses
    failures: dict[Sequence, str] = {}
    step.advance(plan, sampled, failures)
    assert sampled == [letter, None] and list(failures) == [plan.samples[1][0]]
    assert "constrained decoding failed" in failures[plan.samples[1][0]]
    assert digits.failure is not None  # the request's own failure: a 400 naming its grammar's parameter


def test_a_grammar_that_allows_nothing_raises_where_its_sequence_samples(vocabulary: Vocabulary):
    loop = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    constraint = vocabulary.constraint(check(GrammarSpec.json_schema(loop)))
    constraint.prepare()  # on the grammar thread this must not raise: the sampling thread is told
    with pytest.raises(GrammarError, match="allows no output at all"):
        constraint.mask()
    with pytest.raises(GrammarError, match="allows no output at all"):
        checked(vocabulary, check(GrammarSpec.json_schema(loop)), None)  # refused before it is queued
    assert constraint.failure is not None  # its sequence's failure is the request's own (a 400)


# An object that must hold another like it: every value's forced output runs on forever (issue 34, N9).
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


@pytest.mark.parametrize("trigger", [None, "<call>"])
def test_a_grammar_whose_forced_output_never_ends_is_refused_before_it_is_queued(
    vocabulary: Vocabulary, trigger: str | None
):
    with pytest.raises(GrammarError, match="never ends"):
        checked(vocabulary, check(GrammarSpec.json_schema(ENDLESS)), trigger)
    finite = {"type": "object", "properties": {"a": {"$ref": "#"}}}  # {} ends it
    assert checked(vocabulary, check(GrammarSpec.json_schema(finite)), trigger).tokens == 0
