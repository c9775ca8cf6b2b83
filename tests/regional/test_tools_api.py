"""Tool calls and several choices through a regional node's API (issue 21), with the official openai client:
``required`` and named choices whose arguments validate in every trial, streamed calls that reassemble into
the answer's calls, ``auto``, a history with calls and answers, ``n`` with its usage and seeds, and the bad
inputs (a clear 400 each, the node serving on)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest

from tests.conftest import MODEL, SHARED_ENGINE, Node, start_region
from tests.tool_calls_shared import TOOLS, WEATHER, client_of, user, valid_calls

pytestmark = pytest.mark.slow


@pytest.fixture(params=["llama.cpp", "gpu"])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "gpu":
        pytest.importorskip("torch")
    return request.param


@pytest.fixture
def node(engine: str, request: pytest.FixtureRequest) -> Node:
    return request.getfixturevalue("torch_region" if engine == "gpu" else "region")


def test_required_and_named_choices_always_give_valid_arguments(region: Node):
    client = client_of(region)
    # 25 required + 25 named: 50 trials, one request each (the torch engine, on the CPU here at a few
    # tokens a second, runs them as 25 seeded choices of one request each: see the test below). They are
    # asked SHARED_ENGINE["max_sequences"] at a time, so the node decodes them batched, as it would users'.

    def required(i: int) -> None:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=user("What is the weather in Lagos, and what is 100 USD in NGN?"),
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=i,
            parallel_tool_calls=i % 2 == 0,
            max_tokens=210,
        )
        choice = answer.choices[0]
        # In parallel the model may call on until max_tokens cuts a call: the calls before it validate.
        cut = choice.finish_reason == "length" and i % 2 == 0
        assert choice.finish_reason == "tool_calls" or cut, choice
        assert choice.message.tool_calls and not choice.message.content
        valid_calls(choice.message, {"get_weather", "convert"}, cut)

    def named(i: int) -> None:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=user("Convert 50 euros to cedis."),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "convert"}},
            temperature=1.0,
            seed=1000 + i,
            max_tokens=120,
        )
        calls = valid_calls(answer.choices[0].message, {"convert"})
        assert answer.choices[0].finish_reason == "tool_calls" and len(calls) == 1

    with ThreadPoolExecutor(SHARED_ENGINE["max_sequences"]) as pool:
        trials = [pool.submit(trial, i) for i in range(25) for trial in (required, named)]
        for trial in trials:
            trial.result()  # each trial's own assertion, if it failed


def test_fifty_seeded_choices_of_required_and_named_calls_all_validate_on_the_torch_engine(
    torch_region: Node,
):
    pytest.importorskip("torch")
    client = client_of(torch_region)
    # 25 choices of one request, each its own seed (seed + i), batched: 25 required + 25 named trials.
    required = client.chat.completions.create(
        model=MODEL,
        messages=user("What is the weather in Lagos, and what is 100 USD in NGN?"),
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=7,
        n=25,
        max_tokens=120,
    )
    named = client.chat.completions.create(
        model=MODEL,
        messages=user("Convert 50 euros to cedis."),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "convert"}},
        temperature=1.0,
        seed=1007,
        n=25,
        max_tokens=120,
    )
    for answer, allowed in ((required, {"get_weather", "convert"}), (named, {"convert"})):
        assert [c.index for c in answer.choices] == list(range(25))
        for choice in answer.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert len(valid_calls(choice.message, allowed)) == 1 and not choice.message.content


def test_streamed_calls_reassemble_into_the_answers_calls(node: Node):
    client = client_of(node)
    asked = dict(
        model=MODEL,
        messages=user("Weather in Accra please."),
        tools=TOOLS,
        tool_choice="required",
        # Greedy: a sampled draw on llama.cpp can feel what else shares its batch (its logits round apart).
        temperature=0,
        max_tokens=120,
    )
    # The first asks with a cold prompt; the stream and the answer it is compared with both reuse its
    # cached prefix, so they compute alike (llama.cpp's logits round apart with a different batch shape).
    client.chat.completions.create(**asked)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                if delta.id:
                    assert call["id"] is None  # the id and the name come once
                    call["id"], call["name"] = delta.id, delta.function.name
                call["arguments"] += delta.function.arguments or ""
    whole = client.chat.completions.create(**asked)
    assert finish == whole.choices[0].finish_reason  # "tool_calls", or "length" inside a later call
    expected = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_auto_answers_text_or_a_valid_call_and_a_history_with_calls_renders(region: Node):
    client = client_of(region)
    for seed in range(4):
        answer = client.chat.completions.create(
            model=MODEL,
            messages=user("Hello! How are you today?"),
            tools=TOOLS,
            temperature=1.0,
            seed=seed,
            max_tokens=40,
        )
        choice = answer.choices[0]
        if choice.message.tool_calls and choice.finish_reason == "length":  # cut by max_tokens mid-call
            (call,) = choice.message.tool_calls
            assert call.function.name in {"get_weather", "convert"}
            assert call.function.arguments.startswith("{")
        elif choice.message.tool_calls:
            valid_calls(choice.message, {"get_weather", "convert"})
            assert choice.finish_reason == "tool_calls"
        else:
            assert choice.message.content and choice.finish_reason in ("stop", "length")
    history = [
        *user("Weather in Lagos?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Lagos","unit":"celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 31, "sky": "sunny"}'},
    ]
    after = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=20, temperature=0
    )
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls
    assert after.usage.prompt_tokens > 80  # the tools and the call were part of the prompt


@pytest.fixture(scope="module")
def fresh_region(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node of its own: a seed fixes the draws, but llama.cpp's arithmetic depends on the batch a prompt
    (or a reused prefix) was computed in, so reproducing a seeded answer needs the node in the same state
    (the README says so). A node other tests used holds their prefixes in its slots."""
    node = start_region(tmp_path_factory.mktemp("choices-region"), engine=SHARED_ENGINE)
    yield node
    node.process.stop()


def test_three_choices_with_usage_and_seeds_per_choice(fresh_region: Node):
    client = client_of(fresh_region)
    asked = dict(model=MODEL, messages=user("Name a city."), max_tokens=8, temperature=1.0, seed=42)
    three = client.chat.completions.create(**asked, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    again = client.chat.completions.create(**asked, n=3)
    texts = [c.message.content for c in three.choices]
    assert [c.message.content for c in again.choices] == texts  # each choice reproducible by its seed
    assert len(set(texts)) > 1  # and the choices differ (seed + i)
    one = client.chat.completions.create(**asked)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert 3 <= three.usage.completion_tokens <= 3 * 8  # every choice's tokens, each at most max_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens
    streamed: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(
        **asked, n=3, stream=True, stream_options={"include_usage": True}
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts
    assert usage is not None and usage.completion_tokens == three.usage.completion_tokens
    completions = client.completions.create(model=MODEL, prompt="Lagos is", max_tokens=5, n=2, temperature=0)
    assert [c.index for c in completions.choices] == [0, 1]
    assert completions.choices[0].text == completions.choices[1].text  # greedy choices are alike


BAD = {
    "a thousand tools": (
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]},
        "tools",
    ),
    "an odd tool name": (
        {"tools": [{"type": "function", "function": {"name": "get weather; rm -rf", "parameters": {}}}]},
        "name",
    ),
    "two tools of one name": ({"tools": [WEATHER, WEATHER]}, "tools"),
    "a named choice of no tool": (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    "a tool choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "a tool schema that cannot compile": (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
            "tool_choice": "required",
        },
        "tools",
    ),
}


@pytest.mark.parametrize("case", BAD)
async def test_bad_tools_are_400s_and_the_node_serves_on(region: Node, case: str):
    extra, param = BAD[case]
    body = {"model": MODEL, "messages": user("Hi."), "max_tokens": 4, **extra}
    async with aiohttp.ClientSession() as session:
        async with session.post(region.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 400, await r.text()
            error = (await r.json())["error"]
        assert param in (error.get("param") or "") + error["message"]
        async with session.get(region.url + "/health") as r:
            assert (await r.json())["waiting"] == 0
        ok = {"model": MODEL, "messages": user("Hi."), "max_tokens": 2}
        async with session.post(region.url + "/v1/chat/completions", json=ok) as r:
            assert r.status == 200


async def test_logit_bias_forces_or_bans_a_token_and_a_bad_key_is_a_400(region: Node):
    client = client_of(region)
    free = client.completions.create(model=MODEL, prompt="Lagos is", max_tokens=3, temperature=0, logprobs=0)
    first = free.choices[0].logprobs.tokens[0]
    forced = client.completions.create(
        model=MODEL, prompt="Lagos is", max_tokens=3, temperature=0, logprobs=0, logit_bias={"9999": 100}
    )
    assert len(set(forced.choices[0].logprobs.tokens)) == 1  # one token, every time
    assert forced.choices[0].logprobs.tokens[0] != first
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "logit_bias": {"99999999": 5}}
        async with session.post(region.url + "/v1/completions", json=body) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "logit_bias"
