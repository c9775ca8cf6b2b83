"""Exact prompt counts (edge/token_count.py) never hold the event loop: a long text is tokenized in the
tokenizer's threads while the loop goes on relaying every other user's stream; a short one is counted where
it is asked. The counts are the same either way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from edge.token_count import INLINE_CHARS, EstimatingCounter, GgufCounter
from nearshore.protocol.schemas import ChatMessage
from regional.model_store import resolve_model_path
from tests.loop_turns import loop_turns_during

# Long enough that the tokenizer takes a while (about 40 ms here), and over INLINE_CHARS by far.
LONG = " ".join(f"Lagos {i} naira, the cable and the ocean" for i in range(3000))


@pytest.fixture(scope="module")
def counter() -> Iterator[GgufCounter]:
    counter = GgufCounter(str(resolve_model_path("")))
    yield counter
    counter.close()


async def test_a_long_prompt_is_counted_while_the_loop_goes_on(counter: GgufCounter):
    assert len(LONG) > 10 * INLINE_CHARS
    tokens, turns = await loop_turns_during(lambda: counter.text_tokens(LONG))
    assert tokens == counter.count_text(LONG)
    assert turns >= 2  # on the loop, the count would have run to its end in one turn

    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content=LONG)]
    tokens, turns = await loop_turns_during(lambda: counter.chat_tokens(messages))
    assert tokens == counter.count_chat(messages)
    assert turns >= 2


async def test_a_short_prompt_is_counted_at_once(counter: GgufCounter):
    messages = [ChatMessage(role="user", content="Write a haiku about Lagos.")]
    tokens, turns = await loop_turns_during(lambda: counter.chat_tokens(messages))
    assert tokens == 16 and turns == 0  # no thread hop for what takes microseconds


async def test_many_long_prompts_at_once_are_all_counted(counter: GgufCounter):
    texts = [LONG + f" {i}" for i in range(6)]  # more than the tokenizer's threads: they queue
    counts = await asyncio.gather(*(counter.text_tokens(t) for t in texts))
    assert counts == [counter.count_text(t) for t in texts]


async def test_the_estimate_needs_no_thread():
    estimate = EstimatingCounter()
    tokens, _ = await loop_turns_during(lambda: estimate.text_tokens(LONG))
    assert tokens == estimate.count_text(LONG)
