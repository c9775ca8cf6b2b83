"""The torch engine (engine.kind = "gpu") behind a real regional node, on the CPU: the same OpenAI API as
the llama.cpp engine, teacher-forced agreement with it through that API, prefix caching, abort, batching
without cross-talk, and its metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.conftest import MODEL, SHARED_ENGINE, TORCH_ENGINE, Node, start_region
from tests.regional.test_api import post, stream

pytestmark = pytest.mark.slow

TEXT = (
    "The harbour of Lagos is one of the busiest in West Africa. Ships arrive from Europe, Asia and the "
    "Americas, and the city's markets sell what they carry. In the evening the traffic on the bridges "
    "slows to a crawl, and people on their way home listen to the radio, talk on the phone or sleep."
)


def user(content: str) -> dict:
    return {"role": "user", "content": content}


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


def metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + "{") or x.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


async def test_preempted_streams_recover_and_finish_whole(tmp_path: Path):
    """A pool of 16 blocks (256 tokens) for three 100-token answers at once: the newest is preempted,
    recomputes and goes on; every answer is whole and equals its answer alone."""
    node = start_region(tmp_path, engine={**TORCH_ENGINE, "kv_cache_tokens": 256, "context_window": 256})
    try:
        url = node.url + "/v1/completions"
        prompts = [f"List the numbers from {n} upwards:" for n in (1, 20, 300)]

        def body(prompt: str) -> dict:
            return {"model": MODEL, "prompt": prompt, "max_tokens": 100, "temperature": 0}

        together = await asyncio.gather(*(post(url, body(p)) for p in prompts))
        metrics = await get_text(node.url + "/metrics")
        assert metric(metrics, "nearshore:num_preemptions_total") >= 1
        for prompt, (status, _, answer) in zip(prompts, together, strict=True):
            assert status == 200, answer
            assert answer["usage"]["completion_tokens"] == 100
            _, _, solo = await post(url, body(prompt))
            assert answer["choices"][0]["text"] == solo["choices"][0]["text"]
    finally:
        node.process.stop()


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()


async def test_the_node_says_which_engine_runs(torch_region: Node, region: Node):
    assert (await get_json(torch_region.url + "/health"))["engine"] == "gpu (cpu, float32)"
    assert (await get_json(region.url + "/health"))["engine"] == "llama.cpp"


async def scored_prompt(node: Node) -> list[tuple[str, float, str]]:
    """(token, logprob, top-1 token) at every prompt position, through echo + logprobs + max_tokens 0."""
    status, _, body = await post(
        node.url + "/v1/completions",
        {"model": MODEL, "prompt": TEXT, "echo": True, "logprobs": 1, "max_tokens": 0},
    )
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    return [
        (token, logprob, max(top, key=top.get))
        for token, logprob, top in zip(
            lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True
        )
    ]


async def test_teacher_forced_the_engines_agree_through_the_api(tmp_path: Path):
    """Each engine on a node of its own that nothing else asks: what shares a batch changes llama.cpp's
    numbers (on the shared nodes, an earlier test's stream still decoding, or a request of one arriving
    after the nodes were seen idle, gave 61 of 65 top-1 agreements; the engines alone give 63)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "llama").mkdir()
    torch_node = start_region(tmp_path / "torch", engine=TORCH_ENGINE)
    try:
        llama_node = start_region(tmp_path / "llama", engine=SHARED_ENGINE)
        try:
            scores = await asyncio.gather(scored_prompt(torch_node), scored_prompt(llama_node))
        finally:
            llama_node.process.stop()
    finally:
        torch_node.process.stop()
    torch_scores, llama_scores = scores
    assert [t for t, _, _ in torch_scores] == [t for t, _, _ in llama_scores]  # one tokenizer
    agree = sum(a[2] == b[2] for a, b in zip(torch_scores, llama_scores, strict=True))
    assert agree / len(torch_scores) >= 0.95, (agree, len(torch_scores))
    gaps = sorted(abs(a[1] - b[1]) for a, b in zip(torch_scores, llama_scores, strict=True))
    assert gaps[len(gaps) // 2] < 0.1, gaps[len(gaps) // 2]  # the median token's logprob within 0.1 nats


async def test_a_repeated_prompt_reuses_its_cached_blocks(torch_region: Node):
    payload = {
        "model": MODEL,
        "messages": [{"role": "system", "content": TEXT}, {"role": "user", "content": "Summarise."}],
        "max_tokens": 3,
        "temperature": 0,
    }
    _, _, first = await post(torch_region.url + "/v1/chat/completions", payload)
    _, _, second = await post(torch_region.url + "/v1/chat/completions", payload)
    prompt = first["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt - 16 and cached < prompt  # every full block but the last token's
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    metrics = await get_text(torch_region.url + "/metrics")
    assert metric(metrics, "nearshore:prefix_cache_hits_total") >= cached


async def test_streams_in_one_batch_equal_each_alone(torch_region: Node):
    questions = ["Name a river in Nigeria.", "What is two plus two?", "Say hello in French."]

    def body(q: str) -> dict:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": q}],
            "max_tokens": 8,
            "temperature": 0,
        }

    alone = [(await post(torch_region.url + "/v1/chat/completions", body(q)))[2] for q in questions]
    together = await asyncio.gather(
        *(post(torch_region.url + "/v1/chat/completions", body(q)) for q in questions)
    )
    for solo, (_, _, batched) in zip(alone, together, strict=True):
        assert batched["choices"][0]["message"]["content"] == solo["choices"][0]["message"]["content"]


async def test_a_seeded_sample_is_reproducible(torch_region: Node):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story about a fox."}],
        "max_tokens": 10,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 1234,
    }
    answers = await asyncio.gather(*(post(torch_region.url + "/v1/chat/completions", body) for _ in range(2)))
    texts = {a[2]["choices"][0]["message"]["content"] for a in answers}
    assert len(texts) == 1


async def test_the_official_client_streams_and_a_disconnect_frees_the_sequence(torch_region: Node):
    client = openai.AsyncOpenAI(base_url=torch_region.url + "/v1", api_key="unused")
    pieces = []
    stream_ = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to twenty."}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream_:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        else:
            assert chunk.usage is not None and chunk.usage.completion_tokens == 6
    assert "".join(pieces)

    chunks, _, _ = await asyncio.wait_for(_first_chunks(torch_region), 60)
    assert chunks
    for _ in range(100):  # the node notices the client left and frees its sequence
        if (await get_json(torch_region.url + "/health"))["running"] == 0:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the abandoned stream kept running")
    # and its blocks are free again (cached prefixes are free room, not usage)
    assert metric(await get_text(torch_region.url + "/metrics"), "nearshore:kv_cache_usage_perc") == 0.0
    await client.close()


async def _first_chunks(node: Node) -> tuple[list[bytes], None, None]:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long essay about the sea."}],
        "max_tokens": 400,
        "stream": True,
    }
    chunks = []
    async with aiohttp.ClientSession() as s, s.post(node.url + "/v1/chat/completions", json=payload) as r:
        async for line in r.content:
            chunks.append(line)
            if len(chunks) >= 4:
                break  # leave mid-answer
    return chunks, None, None


async def test_metrics_name_the_vllm_counters_and_the_kv_blocks(torch_region: Node):
    await stream(
        torch_region.url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )
    async with aiohttp.ClientSession() as s, s.get(torch_region.url + "/metrics") as r:
        text = await r.text()
    for name in (
        "nearshore:num_requests_running",
        "nearshore:kv_cache_usage_perc",
        "nearshore:prefix_cache_queries_total",
        "nearshore:num_preemptions_total",
        "nearshore:time_to_first_token_seconds_bucket",
        "nearshore:model_load_time_seconds",
    ):
        assert name in text, name


def test_gpu_without_torch_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    from regional.config import EngineConfig
    from regional.engine_select import make_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(ValueError, match="needs torch"):
        make_engine(MODEL, str(tmp_path / "m.gguf"), EngineConfig(kind="gpu"))
