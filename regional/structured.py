"""What a request asks its output to be, as a grammar the engine can apply (:mod:`regional.grammar`).

OpenAI's ``response_format`` (``json_object``; ``json_schema`` with its schema, read as an answer's shape:
:func:`answer_schema`), and vLLM's guided decoding on both
APIs (``guided_json``, ``guided_regex``, ``guided_grammar`` in Lark, ``guided_choice``; the schema taken
as written). At most one may be given; ``{"type": "text"}`` asks for nothing.
"""

from __future__ import annotations

import json
from typing import Any

from nearshore.protocol.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
)
from regional.grammar import GrammarSpec


class ConflictingFormats(ValueError):
    """More than one way of constraining the output was given."""

    def __init__(self, params: list[str]) -> None:
        super().__init__(f"Only one of {', '.join(params)} may be given.")
        self.params = params


def requested_grammar(body: ChatCompletionRequest | CompletionRequest) -> tuple[GrammarSpec, str] | None:
    """The grammar ``body`` asks for and the parameter that asked (for an error to name), or None."""
    asked: list[tuple[GrammarSpec, str]] = []
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        asked.append((GrammarSpec("json_object"), "response_format"))
    elif isinstance(fmt, JsonSchemaResponseFormat):
        schema = fmt.json_schema.schema
        shape = GrammarSpec.json_schema(answer_schema(schema)) if schema is not None else None
        asked.append((shape or GrammarSpec("json_object"), "response_format"))
    if body.guided_json is not None:
        asked.append((GrammarSpec.json_schema(body.guided_json), "guided_json"))
    if body.guided_regex is not None:
        asked.append((GrammarSpec("regex", body.guided_regex), "guided_regex"))
    if body.guided_grammar is not None:
        asked.append((GrammarSpec("lark", body.guided_grammar), "guided_grammar"))
    if body.guided_choice is not None:
        asked.append((GrammarSpec("lark", choice_grammar(body.guided_choice)), "guided_choice"))
    if len(asked) > 1:
        raise ConflictingFormats([param for _, param in asked])
    return asked[0] if asked else None


# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_LIST = ("anyOf", "allOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPENS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# I-JSON's interoperable integers (RFC 7493): every JSON parser reads them exactly.
SAFE_INTEGER = 2**53 - 1
# Decimal places of a number whose schema gives no multipleOf.
NUMBER_PLACES = 9


def answer_schema(schema: Any) -> Any:
    """``schema`` as an answer's shape (a copy; the client's is not changed), with two defaults where it
    says nothing, each because a small model left free runs on until ``max_tokens``:

    - an object that lists its ``properties`` is closed to others (OpenAI's strict schemas must say so;
      left open, a model fills the answer with properties nobody asked for);
    - a number is within I-JSON's safe integers and has at most :data:`NUMBER_PLACES` decimal places
      (left free, a model can write ``1.000000...`` or ``100000...`` one digit per token).
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if key in out:
            out[key] = answer_schema(out[key])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = answer_schema(out["additionalProperties"])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [answer_schema(item) for item in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: answer_schema(value) for name, value in out[key].items()}
    if isinstance(out.get("properties"), dict) and not any(key in out for key in _OPENS):
        out["additionalProperties"] = False
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "number" in types or "integer" in types:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = 10.0**-NUMBER_PLACES
    return out


def choice_grammar(choices: list[str]) -> str:
    """A Lark grammar whose only sentences are ``choices``, each written as it is (JSON-escaped literals)."""
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)
