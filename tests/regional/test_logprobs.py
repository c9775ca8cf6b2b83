"""Log-probabilities over the real model and real HTTP (issue 11): chat's ``logprobs``/``top_logprobs``,
completions' ``logprobs`` with ``echo`` (the prompt scored, ``max_tokens`` 0 allowed), streamed and not;
vLLM's ``min_p`` and ``repetition_penalty``; bad values refused with OpenAI-shaped 400s."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator

import aiohttp
import openai
import pytest

from nearshore.protocol.headers import CACHE
from nearshore.protocol.sse import iter_data
from regional.config import EngineConfig
from regional.engine import GenerationRequest, SamplingParams, TokenEvent
from regional.llama_engine import LlamaCppEngine
from regional.model_store import resolve_model_path
from tests.conftest import MODEL, Node
from tests.edge_fixtures import Edge, start_edge
from tests.regional.test_api import post, stream

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three rivers of West Africa."}]
PROMPT = "The capital of France is Paris. The capital of Germany is"
# The same tokens scored twice by llama.cpp differ by up to a few thousandths of a nat: its unified KV cache
# puts a request's cells wherever other requests' cached prefixes left room, and the attention's sums run
# over that layout (measured: 0.007 between two identical requests on a node that had served others).
TOLERANCE = 2e-2


def chat_body(**fields: object) -> dict:
    return {"model": MODEL, "messages": QUESTION, "max_tokens": 10, "temperature": 0, **fields}


def completion_body(**fields: object) -> dict:
    return {"model": MODEL, "prompt": PROMPT, "temperature": 0, **fields}


async def idle(node: Node) -> None:
    """Wait until the shared node runs nothing: another test's leftover stream in the batch would change
    llama.cpp's batch shape and so the last digits of every logprob."""
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            async with s.get(node.url + "/health") as r:
                health = await r.json()
            if health["running"] == 0 and health["waiting"] == 0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the node never went idle")


def assert_sorted_distribution(logprobs: list[float]) -> None:
    assert logprobs == sorted(logprobs, reverse=True)
    assert all(lp <= 0 for lp in logprobs)
    assert sum(math.exp(lp) for lp in logprobs) <= 1 + 1e-6


async def test_chat_logprobs_have_openais_shape_and_the_greedy_token_is_the_top_one(region: Node):
    status, _, body = await post(
        region.url + "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=5)
    )
    assert status == 200, body
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    generated = body["usage"]["completion_tokens"] - (choice["finish_reason"] == "stop")
    assert len(content) == generated > 0  # one entry per answer token (not the end-of-turn token)
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(entry["bytes"]).decode(errors="replace") == entry["token"] or entry["token"].startswith(
            "bytes:"
        )
        top = entry["top_logprobs"]
        assert len(top) == 5 and all(set(t) == {"token", "logprob", "bytes"} for t in top)
        assert_sorted_distribution([t["logprob"] for t in top])
        # Temperature 0: the chosen token is the likeliest, and its logprob is the top one's.
        assert top[0]["token"] == entry["token"] and abs(top[0]["logprob"] - entry["logprob"]) < 1e-9
    # The entries spell the answer, byte for byte.
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == choice["message"]["content"]


async def test_chat_logprobs_without_alternatives_and_not_asked(region: Node):
    status, _, body = await post(region.url + "/v1/chat/completions", chat_body(logprobs=True, max_tokens=3))
    assert status == 200, body
    assert all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"])
    status, _, plain = await post(region.url + "/v1/chat/completions", chat_body(max_tokens=3))
    assert status == 200 and plain["choices"][0]["logprobs"] is None


async def test_streamed_chat_logprobs_equal_the_unstreamed_ones(region: Node):
    payload = chat_body(logprobs=True, top_logprobs=3)
    await idle(region)
    _, _, whole = await post(region.url + "/v1/chat/completions", payload)
    await idle(region)
    chunks, _, _ = await stream(region.url + "/v1/chat/completions", payload)
    streamed = [
        entry
        for c in chunks
        if c.get("choices") and c["choices"][0]["logprobs"] is not None
        for entry in c["choices"][0]["logprobs"]["content"]
    ]
    expected = whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in streamed] == [e["token"] for e in expected]
    for got, want in zip(streamed, expected, strict=True):
        assert abs(got["logprob"] - want["logprob"]) < TOLERANCE
        assert [t["token"] for t in got["top_logprobs"]] == [t["token"] for t in want["top_logprobs"]]


async def test_completion_echo_with_max_tokens_0_scores_the_prompt_alone(region: Node):
    status, _, body = await post(
        region.url + "/v1/completions", completion_body(echo=True, logprobs=2, max_tokens=0)
    )
    assert status == 200, body
    choice, usage = body["choices"][0], body["usage"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert usage["completion_tokens"] == 0
    lp = choice["logprobs"]
    tokens = lp["tokens"]
    assert len(tokens) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert len(tokens) == usage["prompt_tokens"]
    # The first prompt token (BOS) has nothing before it to predict it.
    assert tokens[0] == "<bos>" and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(tokens[1:]) == PROMPT
    for token, logprob, top in zip(tokens[1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
        assert logprob <= 0 and top[token] == logprob  # the chosen token is always in the dict
        assert 2 <= len(top) <= 3
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    # " Germany" after "The capital of" in a text about capitals is far likelier than chance (1/262144).
    assert lp["token_logprobs"][tokens.index(" Germany")] > math.log(1e-3)


async def test_completion_logprobs_cover_prompt_then_output_and_the_greedy_token_is_the_top_one(region: Node):
    payload = completion_body(echo=True, logprobs=3, max_tokens=4)
    status, _, body = await post(region.url + "/v1/completions", payload)
    assert status == 200, body
    choice, usage = body["choices"][0], body["usage"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "".join(lp["tokens"][1:]) == choice["text"]
    generated = range(usage["prompt_tokens"], len(lp["tokens"]))
    for i in generated:
        top = lp["top_logprobs"][i]
        assert max(top, key=top.get) == lp["tokens"][i]  # greedy: the chosen token is the top one
    assert " Berlin" in [lp["tokens"][i] for i in generated]
    # Without echo the same request scores only the output.
    _, _, plain = await post(region.url + "/v1/completions", completion_body(logprobs=3, max_tokens=4))
    plain_lp = plain["choices"][0]["logprobs"]
    assert plain_lp["tokens"] == [lp["tokens"][i] for i in generated]
    assert plain_lp["text_offset"][0] == 0
    for i, logprob in zip(generated, plain_lp["token_logprobs"], strict=True):
        assert abs(logprob - lp["token_logprobs"][i]) < TOLERANCE


async def test_streamed_completion_logprobs_equal_the_unstreamed_ones(region: Node):
    payload = completion_body(echo=True, logprobs=1, max_tokens=4)
    await idle(region)
    _, _, whole = await post(region.url + "/v1/completions", payload)
    await idle(region)
    chunks, _, _ = await stream(region.url + "/v1/completions", payload)
    parts = [c["choices"][0]["logprobs"] for c in chunks if c.get("choices") and c["choices"][0]["logprobs"]]
    expected = whole["choices"][0]["logprobs"]
    assert [t for p in parts for t in p["tokens"]] == expected["tokens"]
    assert [o for p in parts for o in p["text_offset"]] == expected["text_offset"]
    streamed = [v for p in parts for v in p["token_logprobs"]]
    assert streamed[0] is None and expected["token_logprobs"][0] is None
    for got, want in zip(streamed[1:], expected["token_logprobs"][1:], strict=True):
        assert abs(got - want) < TOLERANCE
    # The prompt's scores come with the echoed prompt, in the first chunk.
    assert (
        chunks[0]["choices"][0]["text"] == PROMPT
        and chunks[0]["choices"][0]["logprobs"]["tokens"][0] == "<bos>"
    )


async def test_the_official_client_parses_both_shapes(region: Node):
    client = openai.AsyncOpenAI(base_url=region.url + "/v1", api_key="unused", max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
        )
        first = chat.choices[0].logprobs.content[0]
        assert first.logprob <= 0 and first.top_logprobs[0].token == first.token
        assert bytes(first.bytes).decode() == first.token
        completion = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0
        )
        scored = completion.choices[0].logprobs
        assert scored.token_logprobs[0] is None and all(v <= 0 for v in scored.token_logprobs[1:])
        assert scored.top_logprobs[1][scored.tokens[1]] == scored.token_logprobs[1]
    finally:
        await client.close()


async def test_min_p_and_repetition_penalty_reach_the_sampler(region: Node):
    url = region.url + "/v1/completions"
    repetitive = "one two one two one two one two"
    _, _, greedy = await post(url, {"model": MODEL, "prompt": repetitive, "max_tokens": 6, "temperature": 0})
    # min_p 1 keeps only the likeliest token: a draw at temperature 1 is the greedy answer.
    status, _, narrow = await post(
        url,
        {"model": MODEL, "prompt": repetitive, "max_tokens": 6, "temperature": 1.0, "min_p": 1.0, "seed": 3},
    )
    assert status == 200, narrow
    assert narrow["choices"][0]["text"] == greedy["choices"][0]["text"]
    # A strong repetition penalty moves greedy decoding off the tokens it has seen.
    status, _, penalised = await post(
        url,
        {"model": MODEL, "prompt": repetitive, "max_tokens": 6, "temperature": 0, "repetition_penalty": 2.0},
    )
    assert status == 200, penalised
    assert greedy["choices"][0]["text"].split()[:1] == ["one"]
    assert "one" not in penalised["choices"][0]["text"].split()


BAD = [
    ("/v1/chat/completions", chat_body(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/chat/completions", chat_body(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("/v1/chat/completions", chat_body(top_logprobs=2), "top_logprobs"),  # without logprobs=true
    ("/v1/chat/completions", chat_body(logprobs=False, top_logprobs=2), "top_logprobs"),
    ("/v1/chat/completions", chat_body(logprobs=3), "logprobs"),  # chat's logprobs is a boolean
    ("/v1/chat/completions", chat_body(max_tokens=0), "max_tokens"),
    ("/v1/completions", completion_body(logprobs=-1), "logprobs"),
    ("/v1/completions", completion_body(logprobs=21), "logprobs"),
    ("/v1/completions", completion_body(logprobs=True), "logprobs"),
    ("/v1/completions", completion_body(max_tokens=0), "max_tokens"),  # without echo
    ("/v1/completions", completion_body(max_tokens=-1, echo=True), "max_tokens"),
    ("/v1/completions", completion_body(min_p=1.5), "min_p"),
    ("/v1/chat/completions", chat_body(min_p=-0.1), "min_p"),
    ("/v1/completions", completion_body(repetition_penalty=0), "repetition_penalty"),
    ("/v1/chat/completions", chat_body(repetition_penalty=-1.0), "repetition_penalty"),
]


@pytest.mark.parametrize(("path", "payload", "param"), BAD, ids=[f"{p}:{param}" for p, _, param in BAD])
async def test_bad_values_get_openai_shaped_400s_and_the_node_keeps_serving(
    region: Node, path: str, payload: dict, param: str
):
    status, _, body = await post(region.url + path, payload)
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    status, _, body = await post(region.url + path, {**payload, **GOOD[path]})
    assert status == 200, body


GOOD = {
    "/v1/chat/completions": {
        "logprobs": True,
        "top_logprobs": 1,
        "max_tokens": 1,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
    },
    "/v1/completions": {
        "logprobs": 1,
        "echo": True,
        "max_tokens": 1,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
    },
}


# --- the engine: chunked prefill, a mixed batch ------------------------------------------------------


async def test_prompt_scores_are_the_same_in_chunks_and_beside_a_running_stream():
    """Scored in 16-token chunks while another sequence decodes in the same batches, a prompt gets the
    log-probabilities it gets alone in one chunk."""
    engines = []
    try:
        for batch_tokens in (512, 16):
            config = EngineConfig(batch_tokens=batch_tokens, prefill_chunk=16, kv_cache_tokens=2048)
            engine = LlamaCppEngine(MODEL, str(resolve_model_path("")), config)
            await engine.start()
            await engine.ready()
            engines.append(engine)
        whole, chunked = engines
        prompt = await whole.tokenize(" ".join([PROMPT] * 4))  # about 50 tokens: 4 chunks of 16
        greedy = SamplingParams(temperature=0.0)

        async def scored(engine: LlamaCppEngine, rid: str) -> list[TokenEvent]:
            request = GenerationRequest(rid, prompt, 2, greedy, logprobs=3, prompt_logprobs=3)
            return [e async for e in engine.generate(request)]

        alone = await scored(whole, "alone")
        other = GenerationRequest("other", await chunked.tokenize("Lagos is"), 40, greedy)
        events = chunked.generate(other)
        await anext(events)  # decoding before the scored prompt arrives, and during its prefill
        mixed = await scored(chunked, "mixed")
        await events.aclose()
        want, got = alone[0].prompt_logprobs, mixed[0].prompt_logprobs
        assert want is not None and got is not None and len(got) == len(want) == len(prompt)
        assert [p.token_id for p in got] == prompt and got[0].logprob is None
        for a, b in zip(want[1:], got[1:], strict=True):
            assert abs(a.logprob - b.logprob) < 0.02  # another batch shape: float32 sums in another order
            assert [t for t, _ in a.top[:1]] == [t for t, _ in b.top[:1]]
        assert [e.token_id for e in mixed] == [e.token_id for e in alone]
    finally:
        for engine in engines:
            await engine.close()


async def test_a_prompt_scored_again_reuses_its_scores_and_its_cached_prefix(region: Node):
    """Echo + logprobs of a prompt scored before: the same log-probabilities, its KV from the prefix cache
    (usage says so), only the last position computed again."""
    prompt = "Lagos, Abuja and Kano are cities of Nigeria; Accra and Kumasi are cities of Ghana."
    body = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 3, "max_tokens": 0}
    await idle(region)
    _, _, first = await post(region.url + "/v1/completions", body)
    _, _, again = await post(region.url + "/v1/completions", body)
    _, _, fewer = await post(region.url + "/v1/completions", {**body, "logprobs": 1})
    tokens = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == tokens - 1
    a, b, c = (x["choices"][0]["logprobs"] for x in (first, again, fewer))
    assert a["tokens"] == b["tokens"] == c["tokens"]
    assert a["token_logprobs"] == b["token_logprobs"] == c["token_logprobs"]
    assert a["top_logprobs"] == b["top_logprobs"]
    for wide, narrow in zip(a["top_logprobs"][1:], c["top_logprobs"][1:], strict=True):
        best = max(wide, key=wide.get)
        assert best in narrow and narrow[best] == wide[best]


# --- through the edge ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, region: Node) -> Iterator[Edge]:
    e = start_edge(tmp_path_factory.mktemp("edge-logprobs"), [("london", region.url)])
    yield e
    e.stop()


async def via_edge(edge: Edge, key: str, path: str, payload: dict) -> tuple[int, dict, dict]:
    """The edge's answer; a streamed one as its chunks, under ``"chunks"``."""
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(edge.url + path, json=payload, headers=headers) as r,
    ):
        if not payload.get("stream") or r.status != 200:
            return r.status, r.headers.copy(), await r.json(content_type=None)
        chunks = [json.loads(d) async for d in iter_data(r.content) if d != b"[DONE]"]
        return r.status, r.headers.copy(), {"chunks": chunks}


async def test_the_edge_passes_log_probabilities_through(edge: Edge, region: Node):
    key = edge.new_key()
    # Chat, the most alternatives OpenAI allows: the edge's answer is the region's.
    chat = chat_body(logprobs=True, top_logprobs=20, max_tokens=16)
    status, _, through = await via_edge(edge, key, "/v1/chat/completions", chat)
    assert status == 200, through
    _, _, direct = await post(region.url + "/v1/chat/completions", chat)
    tokens = [e["token"] for e in through["choices"][0]["logprobs"]["content"]]
    assert tokens == [e["token"] for e in direct["choices"][0]["logprobs"]["content"]]
    assert len(through["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    status, _, streamed = await via_edge(edge, key, "/v1/chat/completions", {**chat, "stream": True})
    assert status == 200, streamed
    assert [
        e["token"]
        for c in streamed["chunks"]
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ] == tokens
    # An evaluation harness's request: a long prompt scored, nothing generated; its log-probabilities
    # are many times the bytes of its text.
    long_prompt = " ".join(["The rivers of West Africa are the Niger, the Volta and the Gambia."] * 20)
    scoring = completion_body(prompt=long_prompt, echo=True, logprobs=20)
    # lm-evaluation-harness asks with max_tokens 1; max_tokens 0 is the legacy API's way.
    for max_tokens, streamed_too in [(0, False), (1, False), (1, True)]:
        ask = {**scoring, "max_tokens": max_tokens, "stream": streamed_too}
        status, _, body = await via_edge(edge, key, "/v1/completions", ask)
        assert status == 200, body
        # The prompt's scores come in one event (172 kB here), however the region's writes reach the edge.
        assert all("choices" in c for c in body.get("chunks", [])), body["chunks"][-1]
        choices = (
            [c["choices"][0] for c in body["chunks"] if c["choices"]] if streamed_too else body["choices"]
        )
        scored = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
        assert "".join(scored[1:]).startswith(long_prompt) and choices[-1]["finish_reason"] == "length"


async def test_the_edge_cache_never_answers_a_request_for_log_probabilities(edge: Edge):
    key = edge.new_key()
    # Temperature 0 and a finish by stop sequence: an answer the edge would otherwise cache.
    chat = chat_body(logprobs=True, top_logprobs=1, max_tokens=40, stop=["."])
    for _ in range(4):
        status, headers, body = await via_edge(edge, key, "/v1/chat/completions", chat)
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] == "stop"
        assert headers.get(CACHE) != "HIT" and body["choices"][0]["logprobs"]["content"]
        await asyncio.sleep(0.5)  # the edge stores an answer after sending it
