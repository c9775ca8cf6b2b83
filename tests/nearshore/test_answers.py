"""The one builder of OpenAI answers (nearshore/protocol/answers.py): byte for byte what the region and
the edge's cache replies sent before it existed (answer_bytes.json, captured from their own code), and
objects that decode into the schema's Structs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from nearshore.protocol import sse
from nearshore.protocol.answers import ChatAnswer, TextAnswer, answer_for, stream_chunks
from nearshore.protocol.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    Completion,
    CompletionLogprobs,
    Usage,
    json_encoder,
)

PINNED = json.loads((Path(__file__).parent / "answer_bytes.json").read_text())
CREATED = 1_700_000_000
USAGE = Usage.of(12, 3, 4)
TEXT = " Lagos é"


def pinned(name: str) -> bytes:
    return PINNED[name].encode()


def logprobs_of(name: str, kind: type[msgspec.Struct]) -> msgspec.Struct:
    """The log-probabilities the region sent in a pinned chunk, back as the Struct it built them as."""
    (payload,) = map(json.loads, sse.parse(pinned(name)))
    return msgspec.convert(payload["choices"][0]["logprobs"], kind)


def chat() -> ChatAnswer:
    return ChatAnswer("chatcmpl-req-1", "gemma-3-270m", created=CREATED)


def text() -> TextAnswer:
    return TextAnswer("cmpl-req-2", "gemma-3-270m", created=CREATED)


def test_a_chat_streams_chunks_are_the_regions_bytes():
    answer = chat()
    assert sse.event(answer.opener()) == pinned("region_chat_role")
    assert sse.event(answer.content(TEXT)) == pinned("region_chat_content")
    logprobs = logprobs_of("region_chat_content_logprobs", ChatLogprobs)
    assert sse.event(answer.content(TEXT, logprobs)) == pinned("region_chat_content_logprobs")
    assert sse.event(answer.finish("stop")) == pinned("region_chat_finish")
    assert sse.event(answer.usage(USAGE)) == pinned("region_chat_usage")


def test_a_text_completion_streams_chunks_are_the_regions_bytes():
    answer = text()
    assert answer.opener() is None  # its first chunk carries text
    assert sse.event(answer.content(TEXT)) == pinned("region_text_content")
    echo = logprobs_of("region_text_first_logprobs", CompletionLogprobs)
    assert sse.event(answer.content("Say: ", echo)) == pinned("region_text_first_logprobs")
    logprobs = logprobs_of("region_text_content_logprobs", CompletionLogprobs)
    assert sse.event(answer.content(TEXT, logprobs)) == pinned("region_text_content_logprobs")
    assert sse.event(answer.finish("length")) == pinned("region_text_finish")
    assert sse.event(answer.usage(USAGE)) == pinned("region_text_usage")


def test_whole_answers_are_the_regions_bytes():
    # A whole answer names the model as the client asked for it (here an alias).
    answer = ChatAnswer.for_request("req-1", "gemma-alias", created=CREATED)
    assert json_encoder.encode(answer.whole(TEXT, "stop", USAGE)) == pinned("region_chat_whole")
    logprobs = json.loads(pinned("region_chat_whole_logprobs"))["choices"][0]["logprobs"]
    whole = answer.whole(TEXT, "stop", USAGE, msgspec.convert(logprobs, ChatLogprobs))
    assert json_encoder.encode(whole) == pinned("region_chat_whole_logprobs")
    answer = TextAnswer.for_request("req-2", "gemma-alias", created=CREATED)
    assert json_encoder.encode(answer.whole(TEXT, "length", USAGE)) == pinned("region_text_whole")
    logprobs = json.loads(pinned("region_text_whole_logprobs"))["choices"][0]["logprobs"]
    whole = answer.whole("Say: " + TEXT, "length", USAGE, msgspec.convert(logprobs, CompletionLogprobs))
    assert json_encoder.encode(whole) == pinned("region_text_whole_logprobs")


# The words edge/cache_reply.py cut "Lagos is a city.  Big one\n" into.
PIECES = ["Lagos", " is", " a", " city.", "  Big", " one", "\n"]


@pytest.mark.parametrize("kind", ["chat", "text"])
@pytest.mark.parametrize("with_usage", [True, False])
def test_a_whole_known_stream_is_the_edges_cache_reply(kind: str, with_usage: bool):
    answer = answer_for(kind == "chat", "req-7", "gemma-3-270m", created=CREATED)
    chunks = stream_chunks(answer, PIECES, "stop", USAGE if with_usage else None)
    body = b"".join(map(sse.event, chunks)) + sse.DONE
    assert body == pinned(f"edge_cache_{kind}_stream{'_usage' if with_usage else ''}")


def test_the_edges_cached_chat_answer():
    answer = ChatAnswer.for_request("req-7", "gemma-3-270m", created=CREATED)
    whole = answer.whole("Lagos is a city.", "stop", USAGE)
    assert json_encoder.encode(whole) == pinned("edge_cache_chat_whole")


def test_a_requests_answer_has_the_regions_id_and_is_created_now():
    assert ChatAnswer.for_request("abc", "m").id == "chatcmpl-abc"
    assert TextAnswer.for_request("abc", "m").id == "cmpl-abc"
    assert isinstance(answer_for(True, "abc", "m"), ChatAnswer)
    assert isinstance(answer_for(False, "abc", "m"), TextAnswer)
    before = int(time.time())
    assert before <= answer_for(True, "abc", "m").created <= int(time.time())
    assert answer_for(False, "abc", "m", created=5).created == 5


def test_every_object_decodes_into_its_schema_struct():
    logprobs = logprobs_of("region_chat_content_logprobs", ChatLogprobs)
    c = chat()
    for chunk in (c.opener(), c.content(TEXT), c.content(TEXT, logprobs), c.finish("length"), c.usage(USAGE)):
        assert msgspec.json.decode(json_encoder.encode(chunk), type=ChatCompletionChunk) == chunk
    whole = c.whole(TEXT, "stop", USAGE, logprobs)
    assert msgspec.json.decode(json_encoder.encode(whole), type=ChatCompletion) == whole
    t = text()
    text_logprobs = logprobs_of("region_text_content_logprobs", CompletionLogprobs)
    for obj in (t.content(TEXT), t.content(TEXT, text_logprobs), t.finish("stop"), t.usage(USAGE)):
        assert msgspec.json.decode(json_encoder.encode(obj), type=Completion) == obj
    whole = t.whole(TEXT, "length", USAGE)
    assert msgspec.json.decode(json_encoder.encode(whole), type=Completion) == whole
    assert whole.usage == USAGE and whole.object == "text_completion"  # usage in its field, not in object


def test_a_chunks_choice_says_only_what_that_chunk_carries():
    c = chat()
    role, content, finish, usage = c.opener(), c.content("x"), c.finish("stop"), c.usage(USAGE)
    assert (role.choices[0].delta.role, role.choices[0].delta.content) == ("assistant", "")
    assert (content.choices[0].delta.role, content.choices[0].delta.content) == (None, "x")
    assert finish.choices[0].finish_reason == "stop" and finish.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage == USAGE
    assert all(x.usage is None for x in (role, content, finish))
