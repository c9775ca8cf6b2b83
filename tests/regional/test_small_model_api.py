"""The second embedded model, SmolLM2-135M-Instruct, behind a real regional node on both engines, through the
official openai client (issue 22): a sensible greedy answer, its prompt rendered with the GGUF's own ChatML
template, the conformance basics (usage, streams, finish reasons, log-probabilities), structured output
with ``parse``, and tool calls in the project's tool format, valid in every trial."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.conftest import SMALL_MODEL, Node
from tests.regional.structured_models import MODELS
from tests.tool_calls_shared import TOOLS, client_of, user, valid_calls

pytestmark = pytest.mark.slow

CAPITAL = [{"role": "user", "content": "What is the capital of Nigeria?"}]
# The same conversation as SmolLM2's template writes it (its default system turn: the caller sent none).
CAPITAL_CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of Nigeria?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(params=["llama.cpp", "gpu"])
def node(request: pytest.FixtureRequest) -> Node:
    if request.param == "gpu":
        pytest.importorskip("torch")
        return request.getfixturevalue("small_torch_region")
    return request.getfixturevalue("small_region")


async def test_the_node_serves_smollm2_under_its_name_and_alias(node: Node):
    async with aiohttp.ClientSession() as s, s.get(node.url + "/v1/models") as r:
        ids = {m["id"] for m in (await r.json())["data"]}
    assert {"smollm2-135m", "smollm2-135m-instruct"} <= ids and "gemma-3-270m" not in ids
    client = client_of(node)
    by_alias = client.chat.completions.create(model="smollm2-135m-instruct", messages=CAPITAL, max_tokens=2)
    assert by_alias.model == "smollm2-135m-instruct"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gemma-3-270m", messages=CAPITAL, max_tokens=2)


def test_a_greedy_answer_is_sensible(node: Node):
    answer = client_of(node).chat.completions.create(
        model=SMALL_MODEL, messages=CAPITAL, max_tokens=40, temperature=0
    )
    choice = answer.choices[0]
    assert "Abuja" in choice.message.content, choice.message.content
    assert choice.finish_reason == "stop"  # it ended its turn (<|im_end|>), not max_tokens
    assert 0 < answer.usage.completion_tokens < 40
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_the_chat_is_rendered_with_the_ggufs_chatml_template(small_region: Node):
    """A chat and a completion of the same conversation written out in ChatML are one prompt: the same
    prompt tokens (no BOS added, the first <|im_start|> kept) and, greedy, the same answer."""
    client = client_of(small_region)
    chat = client.chat.completions.create(model=SMALL_MODEL, messages=CAPITAL, max_tokens=24, temperature=0)
    text = client.completions.create(model=SMALL_MODEL, prompt=CAPITAL_CHATML, max_tokens=24, temperature=0)
    assert chat.usage.prompt_tokens == text.usage.prompt_tokens
    assert chat.choices[0].message.content == text.choices[0].text
    assert chat.choices[0].finish_reason == text.choices[0].finish_reason == "stop"


def test_a_stream_has_its_finish_and_usage_and_logprobs_name_tokens(node: Node):
    client = client_of(node)
    pieces, finishes, usage = [], [], None
    for chunk in client.chat.completions.create(
        model=SMALL_MODEL,
        messages=user("Describe Lagos in two sentences."),
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finishes.append(choice.finish_reason)
    assert "".join(pieces).strip() and finishes[-1] == "length" and not any(finishes[:-1])
    assert usage is not None and usage.completion_tokens == 8 and usage.prompt_tokens > 10
    scored = client.chat.completions.create(
        model=SMALL_MODEL, messages=CAPITAL, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = scored.choices[0].logprobs.content
    assert len(content) == 6 and "".join(t.token for t in content) == scored.choices[0].message.content
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen token is the likeliest


def test_parse_returns_a_valid_object_for_several_schemas(node: Node):
    client = client_of(node)
    for model, question in MODELS[:6]:
        answer = client.chat.completions.parse(
            model=SMALL_MODEL,
            messages=user(f"{question} Answer in JSON."),
            response_format=model,
            max_tokens=200,
            temperature=0,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (model.__name__, choice.message.content)
        assert isinstance(choice.message.parsed, model), model.__name__


def test_required_and_named_tool_choices_give_valid_calls(node: Node):
    client = client_of(node)
    for seed in range(4):
        required = client.chat.completions.create(
            model=SMALL_MODEL,
            messages=user("What is the weather in Lagos?"),
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        choice = required.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
        assert len(valid_calls(choice.message, {"get_weather", "convert"})) == 1
        named = client.chat.completions.create(
            model=SMALL_MODEL,
            messages=user("Convert 50 euros to cedis."),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "convert"}},
            temperature=1.0,
            seed=100 + seed,
            max_tokens=120,
        )
        assert named.choices[0].finish_reason == "tool_calls"
        assert len(valid_calls(named.choices[0].message, {"convert"})) == 1
    greedy = client.chat.completions.create(
        model=SMALL_MODEL,
        messages=user("What is the weather in Lagos?"),
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
    )
    # An instruction-tuned model picks the function that fits and fills it from the question.
    [(name, arguments)] = valid_calls(greedy.choices[0].message, {"get_weather", "convert"})
    assert name == "get_weather" and "lagos" in arguments["city"].lower()


def test_a_tool_result_in_the_history_is_answered_in_text(small_region: Node):
    client = client_of(small_region)
    history = [
        *user("What is the weather in Lagos?"),
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
        model=SMALL_MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0
    )
    assert not after.choices[0].message.tool_calls
    assert "31" in after.choices[0].message.content  # it read the tool's answer
    assert after.usage.prompt_tokens > 80  # the call and its result were in the prompt
