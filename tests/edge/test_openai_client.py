"""The official openai client, unchanged, against a regional node."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MODEL, Node

pytestmark = pytest.mark.slow


@pytest.fixture
def client(region: Node) -> openai.OpenAI:
    return openai.OpenAI(base_url=region.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streamed(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=10, temperature=0
    )
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert answer.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streamed_with_usage(client: openai.OpenAI):
    pieces, usage, finish = [], None, None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces).strip()
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens >= 1


def test_completions_both_ways(client: openai.OpenAI):
    answer = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=6, temperature=0)
    assert answer.choices[0].text and answer.usage.completion_tokens == 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="One, two, three,", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == answer.choices[0].text


def test_seeded_sampling_is_repeatable(client: openai.OpenAI):
    def ask() -> str:
        return (
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=12,
                temperature=0.9,
                top_p=0.95,
                seed=1234,
            )
            .choices[0]
            .message.content
        )

    assert ask() == ask()


def test_errors_map_to_openai_exceptions(client: openai.OpenAI):
    assert client.models.retrieve(MODEL).id == MODEL and client.models.retrieve(MODEL).created > 0
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert bad.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=5
        )
