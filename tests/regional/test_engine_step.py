"""The engine applies the scheduler's plans to the real model: prefix reuse gives the tokens a cold prompt
gives, and an idle prefix cache is dropped only when that makes room for someone (issue 8, item 3)."""

from __future__ import annotations

import asyncio

import pytest

from regional.config import EngineConfig
from regional.engine import GenerationRequest, SamplingParams, TokenEvent
from regional.llama_engine import LlamaCppEngine
from regional.llama_model import KvCacheFull
from regional.model_store import resolve_model_path
from tests.conftest import MODEL

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)


async def started(**engine: object) -> LlamaCppEngine:
    config = EngineConfig(**engine)  # type: ignore[arg-type]
    node = LlamaCppEngine(MODEL, str(resolve_model_path("")), config)
    await node.start()
    await node.ready()
    return node


async def run(engine: LlamaCppEngine, rid: str, prompt: list[int], max_tokens: int) -> list[TokenEvent]:
    request = GenerationRequest(rid, prompt, max_tokens, GREEDY)
    return [event async for event in engine.generate(request)]


async def steps_pass(engine: LlamaCppEngine, count: int) -> None:
    target = engine.stats().steps + count
    for _ in range(2000):
        if engine.stats().steps >= target:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the engine stopped stepping")


async def test_a_prefix_trimmed_in_place_gives_the_tokens_of_a_cold_prompt():
    engine = await started(max_sequences=1, kv_cache_tokens=1024, context_window=512)
    try:
        system = await engine.tokenize("You are a guide to the cities of West Africa. Answer briefly.")
        first = [*system, *await engine.tokenize(" Tell me about Accra.", add_special=False)]
        second = [*system, *await engine.tokenize(" Tell me about Dakar.", add_special=False)]
        cold = await run(engine, "cold", second, 12)  # the first request: nothing cached
        assert cold[0].cached_tokens == 0 and cold[-1].finish_reason == "length"
        await run(engine, "other", first, 12)  # the one slot now holds `first` and its output
        warm = await run(engine, "warm", second, 12)
        assert warm[0].cached_tokens >= len(system)  # the slot was trimmed to the shared prefix
        assert [e.token_id for e in warm] == [e.token_id for e in cold]
        assert "".join(e.text for e in warm) == "".join(e.text for e in cold)
    finally:
        await engine.close()


async def test_an_idle_cache_stays_while_a_newcomer_waits_for_room_it_cannot_buy():
    engine = await started(max_sequences=4, kv_cache_tokens=256, context_window=256, batch_tokens=128)
    try:
        # Prompts without BOS, so that no two share a first token by accident.
        lagos = await engine.tokenize("Lagos is the largest city of Nigeria", add_special=False)
        counting = await engine.tokenize("1, 2, 3, 4, 5, 6, 7, 8,", add_special=False)
        story = await engine.tokenize("The river " + "ran past the old market and " * 30, add_special=False)
        story = story[:100]
        assert len(story) == 100 and len(lagos) + len(counting) < 40

        await run(engine, "lagos", lagos, 1)  # finishes; its slot keeps the prompt's cells
        assert engine.stats().kv_tokens_used == len(lagos)
        counter = engine.generate(GenerationRequest("count", counting, 150 - len(counting), GREEDY))
        await anext(counter)  # runs, holding 150 cells
        # 107 cells: 150 + 107 > 256 even without the idle cache, so dropping it would buy nothing.
        newcomer = asyncio.create_task(run(engine, "story", story, 7))
        await steps_pass(engine, 3)
        stats = engine.stats()
        assert stats.waiting == 1 and stats.running == 1
        assert stats.kv_tokens_used == len(lagos) + 150  # the idle cache is still there

        await counter.aclose()  # the counter leaves: now the newcomer fits beside the idle cache
        served = await newcomer
        assert served[-1].finish_reason == "length" and len(served) == 7
        more = await engine.tokenize(" and its busiest port", add_special=False)
        again = await run(engine, "lagos-again", [*lagos, *more], 2)
        assert again[0].cached_tokens == len(lagos)  # reused: it was never evicted
    finally:
        await engine.close()


async def test_a_batch_the_context_has_no_room_for_is_retried_once_the_scheduler_drops_idle_caches():
    engine = await started(max_sequences=2, kv_cache_tokens=1024, context_window=512)
    try:
        question = await engine.tokenize("Tell me about the city of Accra.")
        lagos = await engine.tokenize("Lagos is the largest city of Nigeria", add_special=False)
        cold = await run(engine, "cold", question, 12)  # its slot keeps the question and its answer
        await run(engine, "lagos", lagos, 1)  # the other slot keeps lagos
        model = engine._model
        assert model is not None
        real_decode, calls = model.decode, []

        def no_room_once(*args) -> None:
            calls.append(args[0])
            if len(calls) == 1:
                raise KvCacheFull("injected: no room for this batch")
            real_decode(*args)

        model.decode = no_room_once  # type: ignore[method-assign]
        steps = engine.stats().steps
        warm = await run(engine, "warm", question, 12)
        # The refused batch ran again, whole, in the next step: the same tokens as the cold prompt gave.
        assert calls[1] == calls[0] and len(calls) == 1 + 12  # the refused batch, then 12 steps
        assert [e.token_id for e in warm] == [e.token_id for e in cold]
        assert warm[0].cached_tokens == len(question) - 1  # its own slot's cells were not touched
        stats = engine.stats()
        assert stats.steps == steps + 12 and stats.num_preemptions == 0 and stats.failure == ""
        assert engine._failed_steps == 0
        # What made the room: the idle cache of lagos was dropped, its cells cleared.
        more = await engine.tokenize(" and its busiest port", add_special=False)
        again = await run(engine, "lagos-again", [*lagos, *more], 2)
        assert again[0].cached_tokens == 0
    finally:
        await engine.close()
