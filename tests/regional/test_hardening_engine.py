"""A failure inside the engine fails only what it touched; an engine that cannot go on says so and exits
(issue 7, item 1). Real model throughout: the faults are injected by wrapping its methods."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest

from harness.procs import ManagedProcess, free_port
from nearshore.protocol.sse import iter_data
from regional.config import EngineConfig
from regional.engine import EngineFailed, GenerationRequest, SamplingParams
from regional.llama_engine import LlamaCppEngine
from regional.llama_model import LlamaError
from regional.model_store import resolve_model_path
from regional.sampler import TokenSampler
from tests.conftest import MODEL, Node, write_region_config
from tests.region_faults import POISON

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)
TIMEOUT = aiohttp.ClientTimeout(total=60)  # a frozen node fails the test instead of hanging it


async def started(**engine: object) -> LlamaCppEngine:
    config = EngineConfig(kv_cache_tokens=2048, context_window=512, **engine)  # type: ignore[arg-type]
    node = LlamaCppEngine(MODEL, str(resolve_model_path("")), config)
    await node.start()
    await node.ready()
    return node


async def outcome(engine: LlamaCppEngine, request_id: str, prompt: list[int], max_tokens: int = 12):
    """("length"/"stop", token ids) when it completes, ("error", message) or ("failed", reason)."""
    tokens: list[int] = []
    try:
        async for event in engine.generate(GenerationRequest(request_id, prompt, max_tokens, GREEDY)):
            if event.finish_reason == "error":
                return "error", event.error
            tokens.append(event.token_id)
            if event.finish_reason is not None:
                return event.finish_reason, tokens
    except EngineFailed as exc:
        return "failed", exc.reason
    raise AssertionError("the stream ended without a finish")


async def until(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


class FailingSampler(TokenSampler):
    def sample(self, logits, mask=None) -> int:
        raise RuntimeError("injected sampling fault")


async def test_a_failed_decode_fails_its_batch_and_the_waiting_request_is_served():
    engine = await started(max_sequences=1)
    try:
        prompt_a = await engine.tokenize("Tell me about the city of Lagos.")
        prompt_b = await engine.tokenize("Tell me about the city of Nairobi.")
        baseline_b = await outcome(engine, "b0", prompt_b)
        assert baseline_b[0] == "length"

        a = engine.generate(GenerationRequest("a", prompt_a, 200, GREEDY))
        await anext(a)  # A runs, alone (one sequence at a time)
        b = asyncio.create_task(outcome(engine, "b", prompt_b))
        await until(lambda: engine.stats().waiting == 1)  # B waits behind A
        model = engine._model
        assert model is not None
        real_decode, calls = model.decode, []

        def decode_failing_once(*args):
            calls.append(1)
            if len(calls) == 1:
                raise LlamaError("injected decode fault")
            return real_decode(*args)

        model.decode = decode_failing_once  # type: ignore[method-assign]
        rest = [event async for event in a]
        assert rest[-1].finish_reason == "error" and "injected decode fault" in (rest[-1].error or "")
        assert await b == baseline_b  # served after the failure, from a clean KV memory, token for token
        stats = engine.stats()
        assert stats.state == "ready" and stats.failure == ""
    finally:
        await engine.close()


async def test_a_failed_sampling_fails_that_sequence_alone():
    engine = await started(max_sequences=4)
    try:
        prompt_a = await engine.tokenize("Name three rivers.")
        prompt_b = await engine.tokenize("Name three mountains.")
        a = engine.generate(GenerationRequest("a", prompt_a, 200, GREEDY))
        b = engine.generate(GenerationRequest("b", prompt_b, 30, GREEDY))
        await anext(a)
        await anext(b)  # both run, in the same batch
        engine._by_id["a"].sampler = FailingSampler(GREEDY)
        rest_a = [event async for event in a]
        rest_b = [event async for event in b]
        assert rest_a[-1].finish_reason == "error" and "injected sampling fault" in (rest_a[-1].error or "")
        assert rest_b[-1].finish_reason == "length" and len(rest_b) == 29  # B's stream never noticed
        assert engine._failed_steps == 0 and engine.stats().state == "ready"
    finally:
        await engine.close()


async def test_failed_steps_in_a_row_fail_the_engine_for_good():
    engine = await started(max_sequences=1, max_failed_steps=2)
    reasons: list[str] = []
    engine.on_fatal = reasons.append
    try:
        prompt = await engine.tokenize("Hello")
        assert engine._model is not None

        def broken_decode(*_args):
            raise LlamaError("injected decode fault")

        engine._model.decode = broken_decode  # type: ignore[method-assign]
        a, b, c = await asyncio.gather(*(outcome(engine, rid, prompt) for rid in "abc"))
        assert a[0] == "error"  # the first failed step fails its batch only
        assert b[0] == "failed" and c[0] == "failed"  # the second gives up: running and waiting alike
        await until(lambda: bool(reasons))
        assert reasons == [b[1]] and "2 engine steps failed in a row" in b[1]
        stats = engine.stats()
        assert stats.state == "failed" and stats.failure == b[1]
        with pytest.raises(EngineFailed):
            await engine.ready()  # no reload: the process is meant to exit
        assert (await outcome(engine, "d", prompt))[0] == "failed"
    finally:
        await engine.close()


async def test_a_worker_that_dies_fails_the_engine_loudly():
    engine = await started()
    reasons: list[str] = []
    engine.on_fatal = reasons.append
    try:
        prompt = await engine.tokenize("Hello")

        def broken_add(_seq) -> None:
            raise RuntimeError("injected scheduler fault")

        engine._scheduler.add = broken_add  # type: ignore[method-assign]  # outside any step
        result = await asyncio.wait_for(outcome(engine, "a", prompt), 10)
        assert result[0] == "failed" and "worker died" in result[1]
        await until(lambda: bool(reasons))
        assert engine.stats().state == "failed"
    finally:
        await engine.close()


# --- over HTTP --------------------------------------------------------------------------------------


async def chat(node: Node, payload: dict) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
        s.post(node.url + "/v1/chat/completions", json=payload) as r,
    ):
        body = await r.json()
        return r.status, body["choices"][0]["message"]["content"] if r.status == 200 else json.dumps(body)


async def chat_streamed(node: Node, payload: dict) -> tuple[int, str]:
    text = ""
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
        s.post(node.url + "/v1/chat/completions", json={**payload, "stream": True}) as r,
    ):
        async for data in iter_data(r.content):
            if data != b"[DONE]":
                for choice in json.loads(data).get("choices", []):
                    text += choice["delta"].get("content") or ""
        return r.status, text


async def test_negative_and_huge_seeds_are_served_and_reproducible(region: Node):
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a line about the sea."}],
        "max_tokens": 12,
        "temperature": 0.9,
    }
    status, first = await chat(region, {**payload, "seed": -1})
    assert status == 200 and first, first
    assert await chat(region, {**payload, "seed": -1}) == (200, first)  # same seed, same text
    assert await chat(region, {**payload, "seed": 2**64 - 1}) == (200, first)  # seed mod 2**64
    status, streamed = await chat_streamed(region, {**payload, "seed": -(2**63)})
    assert status == 200 and streamed
    status, _ = await chat(region, {**payload, "seed": 10**30})
    assert status == 200
    status, other = await chat(region, {**payload, "temperature": 0})  # the node goes on serving
    assert status == 200 and other


async def test_a_failed_engine_answers_503_and_the_process_exits_non_zero(tmp_path):
    port = free_port()
    config = write_region_config(
        tmp_path / "region.toml",
        port,
        {
            "engine": {
                "kv_cache_tokens": 2048,
                "context_window": 512,
                "max_failed_steps": 1,
                "failed_exit_delay_s": 3.0,
            }
        },
    )
    argv = [sys.executable, "-m", "tests.region_faults", "--config", str(config)]
    process = ManagedProcess("faulty-region", argv, tmp_path / "region.log").start()
    node = Node(f"http://127.0.0.1:{port}", process)
    try:
        process.wait_http(node.url + "/health/ready", timeout_s=120)
        hello = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert (await chat(node, hello))[0] == 200
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            poison = {"model": MODEL, "prompt": f"Say{POISON}", "max_tokens": 4}
            async with s.post(node.url + "/v1/completions", json=poison) as r:
                error = (await r.json())["error"]
                assert r.status == 503 and error["code"] == "engine_failed", error
            async with s.get(node.url + "/health/ready") as r:
                ready = await r.json()
                assert r.status == 503 and "injected fault" in ready["reason"] and ready["model"] == "failed"
            async with s.get(node.url + "/health") as r:
                assert r.status == 503 and (await r.json())["status"] == "failed"
            async with s.post(node.url + "/v1/chat/completions", json=hello) as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "engine_failed"
        assert process.proc is not None
        assert process.proc.wait(timeout=30) == 70, process.log_tail()
        assert "engine failed" in process.log_tail(50)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the failed node did not exit:\n{process.log_tail()}") from None
    finally:
        process.stop()
