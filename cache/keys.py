"""What a cached answer is keyed by: its partition, its exact key, and the question that is embedded.

A cached answer may only ever be returned for a request that would have produced it: the same tenant (or a
shared scope the keys opt into), the same model, every parameter that changes the output, and the same
conversation up to the last user turn. All of that makes the **partition**; semantic search never leaves it.
Inside a partition, the **exact key** adds the last user turn, and the **query** (that turn's text) is what
the semantic level embeds. The turn is normalised for the exact key only where that cannot change what is
asked: in prose (case, runs of spaces, the closing ? . !), never in code, indented or long text, where
spacing and case carry meaning (Python differing only in indentation is two questions), nor inside quotes:
"keep every space: 'a      b'" and "... 'a b'" are two questions (issue 34, N12).

Parameters are taken from the request's own fields, all of them except those that cannot change the text
(``stream``, ``stream_options``, ``user``, the client's labels such as ``metadata``, and ``seed`` at
temperature 0) and the conversation itself, so a field added to the schema later partitions by default
instead of being shared by mistake. ``temperature`` is as sent, with OpenAI's default 1.0 when omitted; the
token limit is the effective one.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass

import msgspec

from cache.verify import MAX_COMPARED_CHARS, QUOTED, is_prose
from nearshore.protocol.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

# Fields that do not change the answer's text, and the conversation, which is keyed on its own.
_NOT_PARAMETERS = frozenset(
    {
        *("stream", "stream_options", "user", "messages", "prompt", "max_tokens", "max_completion_tokens"),
        # the client's labels and hints, none of which a model reads
        *("metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "modalities"),
    }
)
_SPACE = re.compile(r"\s+")
_CLOSING = re.compile(r"[\s?.!]+$")
OPENAI_DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True, slots=True)
class CacheKey:
    partition: str  # hex digest of scope + model + parameters + the conversation before the last turn
    exact: str  # hex digest of the partition + the normalised last turn
    query: str  # the last user turn, as sent: what the semantic level embeds and the verifier reads
    scope: str = ""  # the tenant or shared scope hashed into the partition (kept on the entry for operators)


def normalise(text: str) -> str:
    """The same question typed twice is one exact key: Unicode NFC always; in prose that the verifier reads
    (not code, not indented, not longer than it compares) also casefolded, runs of spaces collapsed and the
    closing punctuation dropped, except inside quotes ("...", '...', “...”): a quoted part is kept as sent,
    its spacing and case being what is asked about. Anything else is kept as sent."""
    text = unicodedata.normalize("NFC", text)
    if len(text) > MAX_COMPARED_CHARS or not is_prose(text):
        return text
    # QUOTED has one group: split keeps the quoted parts, at the odd places.
    parts = QUOTED.split(text)
    folded = "".join(part if i % 2 else _SPACE.sub(" ", part).casefold() for i, part in enumerate(parts))
    return _CLOSING.sub("", folded.strip())


def parameters(body: ChatCompletionRequest | CompletionRequest) -> dict[str, object]:
    """Every output-affecting parameter, normalised (the default temperature spelled out)."""
    fields = msgspec.structs.asdict(body)
    params = {name: value for name, value in fields.items() if name not in _NOT_PARAMETERS}
    if params.get("temperature") is None:
        params["temperature"] = OPENAI_DEFAULT_TEMPERATURE
    if params["temperature"] == 0:
        # Greedy decoding draws nothing: a seed cannot change the answer, and one partition per seed let a
        # client varying it fill the cache with partitions.
        params.pop("seed", None)
    params["token_limit"] = body.token_limit()
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    return params


def _earlier(m: ChatMessage) -> tuple:
    """An earlier message as its partition reads it: a tool call or a tool's answer by what it says too."""
    if m.tool_calls or m.tool_call_id:
        return (m.role, m.name or "", m.text(), m.tool_call_id or "", m.tool_calls or [])
    return (m.role, m.name or "", m.text())


def cache_key(body: ChatCompletionRequest | CompletionRequest, scope: str) -> CacheKey | None:
    """The request's key in ``scope`` (a tenant, or a shared scope); None when it has no question to key
    on (a chat whose last message is not the user's: a continuation, an assistant prefill) or asks for
    what a cached answer does not keep (log-probabilities)."""
    if body.top_logprobs_asked() is not None:
        return None  # a cached answer keeps its text, not the log-probabilities the request asks for
    if body.n > 1:
        return None  # a cached answer is one choice
    if isinstance(body, ChatCompletionRequest) and body.tools and body.tool_choice != "none":
        return None  # a call acts on the world: the same question later may need a new call
    if isinstance(body, ChatCompletionRequest):
        last = body.messages[-1]
        if last.role != "user" or body.continue_final_message:
            return None
        earlier = [_earlier(m) for m in body.messages[:-1]]
        query = last.text()
    else:
        if body.echo:
            return None  # the answer repeats the prompt: nothing to gain, and echo changes the shape
        earlier = []
        query = body.prompt_text()
    head = msgspec.json.encode(
        {
            "scope": scope,
            "kind": type(body).__name__,
            "model": body.model,
            "params": parameters(body),
            "earlier": earlier,
        }
    )
    partition = hashlib.blake2b(head, digest_size=16).hexdigest()
    exact = hashlib.blake2b(
        partition.encode() + b"\0" + normalise(query).encode(), digest_size=16
    ).hexdigest()
    return CacheKey(partition, exact, query, scope)
