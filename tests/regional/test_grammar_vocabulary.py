"""When the grammar engine's view of the vocabulary is built (``engine.grammar_vocabulary``): with the
model, before the node is ready, so that a node's first structured request does not wait 1.7 s for it
(measured: 1,452 ms to its first token against 36 ms for the next) and no request is stalled by it (its
last second holds the GIL), or by that first request."""

from __future__ import annotations

import msgspec
import pytest

from regional.config import EngineConfig
from regional.engine import GenerationRequest
from regional.engine_select import make_engine
from regional.grammar import GrammarSpec, check
from regional.model_store import resolve_model_path
from regional.step_engine import StepEngine

pytestmark = pytest.mark.slow

ENGINE = {"max_sequences": 2, "kv_cache_tokens": 1024, "context_window": 512, "load": "lazy"}


def engine_with(**settings: object) -> StepEngine:
    config = msgspec.convert({**ENGINE, **settings}, EngineConfig)
    return make_engine("gemma-3-270m", str(resolve_model_path("")), config)


async def structured_answer(engine: StepEngine) -> str:
    prompt = await engine.tokenize("Answer yes or no.")
    request = GenerationRequest("s", prompt, max_tokens=4, grammar=check(GrammarSpec("regex", "yes|no")))
    return "".join([e.text async for e in engine.generate(request)])


async def test_by_default_it_is_built_before_the_engine_is_ready():
    engine = engine_with()
    await engine.start()
    try:
        await engine.ready()
        assert engine._grammar_vocab.built  # nothing left to build (and stall requests) once serving
        assert await structured_answer(engine) in ("yes", "no")
    finally:
        await engine.close()


async def test_first_use_leaves_it_to_the_first_structured_request():
    engine = engine_with(grammar_vocabulary="first_use")
    await engine.start()
    try:
        await engine.ready()
        assert not engine._grammar_vocab.built
        assert await structured_answer(engine) in ("yes", "no")
        assert engine._grammar_vocab.built
    finally:
        await engine.close()


async def test_an_engine_unloaded_as_soon_as_it_is_ready_frees_its_model_and_loads_again():
    for _ in range(2):  # loaded, unloaded at once (the vocabulary reads the model's), loaded again
        engine = engine_with()
        await engine.start()
        await engine.ready()
        await engine.close()  # a build still reading the freed model would crash the process
        assert engine._grammar_vocab is None
