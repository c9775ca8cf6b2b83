"""Constrained decoding in both engines (issue 21): a grammar's mask inside the step, per sequence, mixed in
one batch with sequences that are not constrained, each equal to itself alone; the grammar's end is a
"stop", max_tokens inside it a "length"; a grammar that allows nothing is refused before it is queued."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from regional.config import EngineConfig
from regional.engine import GenerationRequest, SamplingParams, TokenEvent
from regional.grammar import GrammarError, GrammarSpec, check
from regional.llama_engine import LlamaCppEngine
from regional.model_store import resolve_model_path
from regional.step_engine import StepEngine
from tests.conftest import MODEL

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Lagos", "Accra", "Dakar"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def engines() -> list[str]:
    kinds = ["llama.cpp"]
    try:
        import torch  # noqa: F401

        kinds.append("gpu")
    except ImportError:
        pass
    return kinds


async def started(kind: str, **settings: object) -> StepEngine:
    config = EngineConfig(**{"max_sequences": 4, "kv_cache_tokens": 2048, "context_window": 512, **settings})  # type: ignore[arg-type]
    path = str(resolve_model_path(""))
    if kind == "gpu":
        from regional.torch_engine import TorchEngine

        engine: StepEngine = TorchEngine(MODEL, path, config)
    else:
        engine = LlamaCppEngine(MODEL, path, config)
    await engine.start()
    await engine.ready()
    return engine


async def run(
    engine: StepEngine, rid: str, prompt: list[int], max_tokens: int, **extra: object
) -> list[TokenEvent]:
    request = GenerationRequest(rid, prompt, max_tokens, **{"sampling": GREEDY, **extra})  # type: ignore[arg-type]
    return [event async for event in engine.generate(request)]


def text_of(events: list[TokenEvent]) -> str:
    return "".join(e.text for e in events)


@pytest.fixture(params=engines(), scope="module")
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


async def test_a_schema_constrained_answer_parses_validates_and_stops(kind: str):
    engine = await started(kind)
    try:
        prompt = await engine.tokenize("Describe a person as JSON:")
        grammar = check(GrammarSpec.json_schema(PERSON))
        for sampling in (GREEDY, SEEDED):
            events = await run(engine, f"p-{sampling.seed}", prompt, 120, sampling=sampling, grammar=grammar)
            assert events[-1].finish_reason == "stop", text_of(events)
            document = json.loads(text_of(events))
            jsonschema.validate(document, PERSON)
        # Its budget spent inside the JSON: "length", and the text is the JSON's beginning.
        short = await run(engine, "short", prompt, 3, grammar=grammar)
        assert short[-1].finish_reason == "length" and text_of(short).startswith("{")
    finally:
        await engine.close()


async def test_constrained_and_free_sequences_in_one_batch_each_equal_themselves_alone(kind: str):
    # Greedy: llama.cpp's logits move by rounding with what shares a batch, which a sampled draw can feel;
    # a mask applied to the wrong row, or not at all, changes the tokens outright. The sampling step's own
    # rows are checked exactly in tests/regional/test_grammar.py.
    engine = await started(kind)
    try:
        free_prompt = await engine.tokenize("The market in Lagos opens at")
        json_prompt = await engine.tokenize("A JSON object about Accra:")
        grammar = check(GrammarSpec("json_object"))
        alone_free = await run(engine, "free-alone", free_prompt, 24)
        alone_json = await run(engine, "json-alone", json_prompt, 40, grammar=grammar)
        together = await asyncio.gather(
            run(engine, "free-together", free_prompt, 24),
            run(engine, "json-together", json_prompt, 40, grammar=grammar),
            run(engine, "json-again", json_prompt, 40, grammar=grammar),
        )
        if kind == "gpu":  # its rows are computed alike whatever shares the batch
            assert [e.token_id for e in together[0]] == [e.token_id for e in alone_free]
            assert [e.token_id for e in together[1]] == [e.token_id for e in together[2]]
            assert [e.token_id for e in together[1]] == [e.token_id for e in alone_json]
        else:  # llama.cpp's rows may round apart at a near tie (even two alike, admitted in other steps):
            # the JSON still holds in every constrained row, and the free row stays free
            assert all(text_of(events).startswith("{") for events in together[1:])
            assert not text_of(together[0]).startswith("{")
        assert text_of(alone_json).startswith("{") and not text_of(alone_free).startswith("{")
        if alone_json[-1].finish_reason == "stop":
            assert isinstance(json.loads(text_of(alone_json)), dict)
    finally:
        await engine.close()


async def test_a_grammar_that_allows_nothing_is_refused_before_it_is_queued():
    engine = await started("llama.cpp")
    try:
        loop = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
        with pytest.raises(GrammarError, match="allows no output at all"):
            await engine.constraint(check(GrammarSpec.json_schema(loop)))
        assert engine.stats().waiting == 0 and engine.stats().running == 0
        prompt = await engine.tokenize("Hello")
        assert (await run(engine, "after", prompt, 2))[-1].finish_reason == "length"  # still serving
    finally:
        await engine.close()
