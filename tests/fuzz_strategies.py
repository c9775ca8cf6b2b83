"""Hypothesis strategies for request bodies: near-valid OpenAI requests with one or more fields gone wrong,
arbitrary JSON, and raw bytes; plus a small keep-alive HTTP client that never hides a hang.

Generation stays cheap for a real model: a body that could be valid always carries a small ``max_tokens``
(or a broken one), so a fuzz case costs a few decode steps at most.
"""

from __future__ import annotations

import gzip
import http.client
import json
import ssl
from dataclasses import dataclass

from hypothesis import strategies as st

MODEL = "gemma-3-270m"
SPECIAL_TEXT = ["<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>", "<pad>", "<|endoftext|>", "\x00"]

# Values of every JSON type, including the edges of each.
INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30]),
)
FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, -0.0, 1e-320]))
TEXTS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(SPECIAL_TEXT),
    st.lists(st.sampled_from([*SPECIAL_TEXT, "hi", " ", "\n", "é", "🙂"]), max_size=20).map("".join),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXTS)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXTS, inner, max_size=4)),
    max_leaves=12,
)


VALID_CONTENT = st.one_of(
    TEXTS, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}), min_size=1, max_size=3)
)
VALID_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": VALID_CONTENT},
    optional={"name": st.text(min_size=1, max_size=20)},
)
STOP = st.text(min_size=1, max_size=10)
# Valid values across their whole range (a negative seed froze the region once); max_tokens small, so a
# case costs a few decode steps of the real model at most.
VALID_SAMPLING = {
    "max_tokens": st.integers(1, 3),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.001, 1),
    "top_k": st.integers(0, 300_000),
    "seed": INTS,
    "stop": st.one_of(STOP, st.lists(STOP, max_size=4)),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "n": st.just(1),
    "stream": st.booleans(),
    "user": st.text(max_size=30),
}
# OpenAI's chat fields that change nothing a model writes (an SDK or a framework may send any of them).
CHAT_LABELS = {
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "store": st.booleans(),
    "service_tier": st.sampled_from(["auto", "default", "flex"]),
    "safety_identifier": st.text(max_size=30),
    "prompt_cache_key": st.text(max_size=30),
    "modalities": st.just(["text"]),
}
VALID_CHAT = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "messages": st.lists(VALID_MESSAGE, min_size=1, max_size=4),
        "max_completion_tokens": st.integers(1, 3),
    },
    optional={**VALID_SAMPLING, **CHAT_LABELS},
)
VALID_COMPLETION = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "prompt": st.one_of(TEXTS.filter(bool), st.lists(TEXTS.filter(bool), max_size=1)),
    },
    optional={**VALID_SAMPLING, "echo": st.booleans()},
).map(lambda body: {**body, "max_tokens": body.get("max_tokens", 3)})


def _mutated(valid: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    """A valid body with one field set to anything (or a field added), so the error is that one field's."""
    fields = st.sampled_from(
        [
            *("model", "messages", "prompt", *VALID_SAMPLING, *CHAT_LABELS),
            *("stream_options", "echo", "logprobs", "frobnicate"),
        ]
    )
    return st.tuples(valid, fields, ANY_JSON).map(lambda t: _cheap({**t[0], t[1]: t[2]}))


def _cheap(body: dict) -> dict:
    """A broken token limit could leave the default (hundreds of tokens): keep a case's work small."""
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and 4 <= value <= 10**6:
            body[field] = 3
    return body


# The Responses API: input as text or items (messages, function calls and their outputs), its settings.
_PART = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": TEXTS})
VALID_ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant"])},
        optional={"type": st.just("message"), "content": st.one_of(TEXTS, st.lists(_PART, max_size=3))},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(min_size=1, max_size=10),
            "name": st.sampled_from(["get_weather", "f", "x-y_z"]),
            "arguments": st.one_of(TEXTS, st.just("{}")),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.text(min_size=1, max_size=10),
            "output": st.one_of(TEXTS, st.lists(_PART, max_size=2)),
        }
    ),
)
_FORMAT = st.one_of(
    st.just({"type": "text"}),
    st.just({"type": "json_object"}),
    st.just({"type": "json_schema", "name": "out", "schema": {"type": "object"}}),
)
_TOOL = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.sampled_from(["get_weather", "f"])},
    optional={"description": TEXTS, "parameters": st.just({"type": "object"})},
)
VALID_RESPONSES = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "input": st.one_of(TEXTS.filter(bool), st.lists(VALID_ITEM, min_size=1, max_size=4)),
        "max_output_tokens": st.integers(1, 3),
    },
    optional={
        "instructions": TEXTS,
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.001, 1),
        "stream": st.booleans(),
        "store": st.booleans(),
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
        "text": st.fixed_dictionaries({"format": _FORMAT}),
        "tools": st.lists(_TOOL, max_size=2),
        "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]),
        "user": st.text(max_size=30),
    },
)


def _mutated_responses() -> st.SearchStrategy[dict]:
    fields = st.sampled_from(
        [
            "model",
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "text",
            "max_output_tokens",
            "metadata",
            "previous_response_id",
            "store",
            "stream",
            "reasoning",
            "include",
            "background",
            "frobnicate",
        ]
    )
    return st.tuples(VALID_RESPONSES, fields, ANY_JSON).map(lambda t: _cheap({**t[0], t[1]: t[2]}))


CHAT_BODY = st.one_of(VALID_CHAT, VALID_CHAT, _mutated(VALID_CHAT))
RESPONSES_BODY = st.one_of(VALID_RESPONSES, VALID_RESPONSES, _mutated_responses())
COMPLETION_BODY = st.one_of(VALID_COMPLETION, VALID_COMPLETION, _mutated(VALID_COMPLETION))


# The attack pass's bodies (issue 34): many choices, grammars that cannot end or cannot start, and JSON
# nested past any parser's patience, in every place a grammar can come from.
_ENDLESS = [
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"type": "string", "enum": []},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}},
]


def _nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = {"type": "array", "items": value} if isinstance(value, dict) else [value]
    return value


GRAMMARS = st.one_of(
    st.sampled_from(_ENDLESS),
    st.integers(60, 1200).map(lambda d: _nested(d, {"type": "integer"})),
    st.integers(60, 1200).map(_nested),
)


def _with_grammar(body: dict, where: str, grammar: object) -> dict:
    if where == "response_format":
        return {**body, where: {"type": "json_schema", "json_schema": {"name": "x", "schema": grammar}}}
    if where == "tools":
        tool = {"type": "function", "function": {"name": "f", "parameters": grammar}}
        return {**body, "tools": [tool], "tool_choice": "required"}
    return {**body, where: grammar}


ATTACK_CHAT = st.one_of(
    st.tuples(VALID_CHAT, st.integers(1, 128)).map(lambda t: {**t[0], "n": t[1]}),
    st.tuples(VALID_CHAT, st.sampled_from(["response_format", "tools", "guided_json"]), GRAMMARS).map(
        lambda t: _with_grammar(*t)
    ),
    CHAT_BODY,
)


@dataclass(frozen=True)
class Case:
    body: bytes
    content_type: str = "application/json"
    encoding: str | None = None


def cases(body: st.SearchStrategy[dict]) -> st.SearchStrategy[Case]:
    """Mostly JSON bodies of the endpoint's shape; also any JSON, raw bytes, odd types and encodings."""
    as_json = body.map(lambda b: Case(json.dumps(b).encode()))
    return st.one_of(
        as_json,
        as_json,
        as_json,
        ANY_JSON.map(lambda v: Case(json.dumps(v).encode())),
        st.binary(max_size=200).map(Case),
        st.tuples(as_json, st.sampled_from(["text/plain", "", "application/x-www-form-urlencoded"])).map(
            lambda t: Case(t[0].body, t[1])
        ),
        st.tuples(as_json, st.sampled_from(["gzip", "deflate", "br", "x-unknown"])).map(
            lambda t: Case(t[0].body, encoding=t[1])
        ),
        as_json.map(lambda c: Case(gzip.compress(c.body), encoding="gzip")),
    )


class Client:
    """One keep-alive HTTP(S) connection; reconnects after a close, and every call has a hard timeout."""

    def __init__(self, url: str, context: ssl.SSLContext | None = None, timeout_s: float = 30.0) -> None:
        scheme, _, rest = url.partition("://")
        self.host, _, port = rest.partition(":")
        self.port = int(port)
        self.https = scheme == "https"
        self.context = context
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout_s, context=self.context
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def post(self, path: str, case: Case, headers: dict[str, str]) -> tuple[int, bytes, str]:
        """(status, body, content type). A timeout raises: a hang is a failure, never a retry."""
        all_headers = {**headers, "Content-Type": case.content_type} if case.content_type else dict(headers)
        if case.encoding:
            all_headers["Content-Encoding"] = case.encoding
        for attempt in range(2):
            conn = self._connection()
            try:
                conn.request("POST", path, body=case.body, headers=all_headers)
                response = conn.getresponse()
                data = response.read()
            except TimeoutError:
                self.close()
                raise AssertionError(f"no answer within {self.timeout_s:g}s: a hang") from None
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.close()
                if attempt:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            if response.will_close:
                self.close()
            return response.status, data, response.getheader("Content-Type", "")
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
