"""A freshly loaded model runs one short request and one measured prompt before the node says it is ready,
and then forgets them: the node's figures count none of it and its KV memory starts empty, so a user's first
prompt finds no prefix of the warm-up; what it keeps is a first estimate of its prefill cost."""

from __future__ import annotations

import msgspec
import pytest

import regional.step_engine
from regional.config import EngineConfig
from regional.engine import GenerationRequest
from regional.engine_select import make_engine
from regional.model_store import resolve_model_path
from regional.warm_up import WARM_UP_STEPS

pytestmark = pytest.mark.slow

ENGINES = {
    "llama.cpp": {"max_sequences": 2, "kv_cache_tokens": 1024, "context_window": 512},
    "torch": {
        "kind": "gpu",
        "device": "cpu",
        "max_sequences": 2,
        "kv_cache_tokens": 1024,
        "context_window": 512,
    },
}


@pytest.mark.parametrize("kind", list(ENGINES))
async def test_the_model_runs_before_ready_and_the_node_starts_from_nothing(
    kind: str, monkeypatch: pytest.MonkeyPatch
):
    runs: list[int] = []
    real = regional.step_engine.warm_up

    def counted(*args: object) -> int:
        runs.append(real(*args))
        return runs[-1]

    monkeypatch.setattr(regional.step_engine, "warm_up", counted)
    config = msgspec.convert({"load": "lazy", **ENGINES[kind]}, EngineConfig)
    engine = make_engine("gemma-3-270m", str(resolve_model_path("")), config)
    await engine.start()
    try:
        assert runs == []  # a lazy engine loads (and warms up) on its first request, not at start
        await engine.ready()
        assert runs == [WARM_UP_STEPS]  # a prefill step, a decode step, a measured prefill step
        stats = engine.stats()
        assert (stats.state, stats.steps, stats.prefill_tokens, stats.kv_tokens_used) == ("ready", 0, 0, 0)
        assert stats.prefill_ms_per_token > 0  # reported from the warm-up, before any step is fitted
        assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.running) == (0, 0, 0)
        # A prompt that begins as the warm-up's did finds nothing of it in the KV memory.
        prompt = await engine.tokenize("Hello there, how are you?")
        events = [e async for e in engine.generate(GenerationRequest("first", prompt, max_tokens=2))]
        assert events[-1].finish_reason == "length"
        stats = engine.stats()
        assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (len(prompt), 0)
        assert stats.prefill_tokens == len(prompt)
        await engine.ready()  # loaded already: no second warm-up
        assert runs == [WARM_UP_STEPS]
        # Unloaded and loaded again (as after idle_unload_s): warmed up again, its steps not counted.
        steps = stats.steps
        await engine.close()
        await engine.ready()
        assert runs == [WARM_UP_STEPS, WARM_UP_STEPS] and engine.stats().steps == steps
    finally:
        await engine.close()
