"""OpenAI-compatible wire types, shared by the edge and the regional node.

Requests forbid unknown fields (OpenAI answers "Unrecognized request argument supplied");
value limits live in ``Annotated`` aliases so the error names the offending ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
TopK = Annotated[int, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
MaxTokens = Annotated[int, Meta(ge=1)]
# vLLM's extra sampling fields: keep tokens at least min_p times as likely as the likeliest; divide
# (multiply) the positive (negative) logits of tokens already seen by repetition_penalty.
MinP = Annotated[float, Meta(ge=0, le=1)]
RepetitionPenalty = Annotated[float, Meta(gt=0)]
# OpenAI's chat allows 0..20 alternatives per token; its legacy completions 0..5, vLLM (and we) up to 20.
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
ChoiceCount = Annotated[int, Meta(ge=1, le=128)]
StopString = Annotated[str, Meta(min_length=1)]
Stop = StopString | Annotated[list[StopString], Meta(max_length=16)]
ModelName = Annotated[str, Meta(min_length=1, max_length=256)]
Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "content_filter", "tool_calls"]
# OpenAI's bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MetadataKey = Annotated[str, Meta(max_length=64)]
MetadataValue = Annotated[str, Meta(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Meta(max_length=16)]
EndUser = Annotated[str, Meta(max_length=256)]  # ``user``, ``safety_identifier``: who asked, for abuse checks
PromptCacheKey = Annotated[str, Meta(max_length=256)]  # the client's hint for prefix caching
ServiceTier = Annotated[str, Meta(max_length=64)]  # auto, default, flex, ...: one tier here
# OpenAI's rule for a function's (and a response format's) name; and its cap on the tools of one request.
FunctionName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
MAX_TOOLS = 128


class TextPart(Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class FunctionCall(Struct, forbid_unknown_fields=True):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Struct, forbid_unknown_fields=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(Struct, forbid_unknown_fields=True, omit_defaults=True):
    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=MAX_TOOLS)] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's answer: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool = False


# --- structured output and tools -----------------------------------------------------------------------


class JsonSchemaFormat(Struct, forbid_unknown_fields=True):
    name: FunctionName
    schema: dict[str, Any] | None = None  # a JSON Schema (the region compiles it, the edge bounds its size)
    description: str | None = None
    strict: bool | None = None


class TextFormat(Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonObjectFormat(Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonSchemaResponseFormat(Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat


class FunctionDefinition(Struct, forbid_unknown_fields=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments (absent: no arguments)
    strict: bool | None = None


class Tool(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class _SamplingFields(Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """The fields chat and completion requests share. Encoded (the body an edge sends a region), a field
    at its default is left out: a region one release behind, which forbids the fields it does not know,
    still takes a request that does not use a newer one."""

    model: ModelName
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: int | None = None
    # OpenAI's: token id (as a string) -> a bias from -100 (never) to 100 (always), added to its logit.
    logit_bias: (
        Annotated[dict[str, Annotated[float, Meta(ge=-100, le=100)]], Meta(max_length=1024)] | None
    ) = None
    stop: Stop | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    min_p: MinP = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    n: ChoiceCount = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: EndUser | None = None
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding, on both APIs: a JSON schema, a regex, a Lark grammar, or one of some strings.
    guided_json: dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: Annotated[list[str], Meta(min_length=1, max_length=1024)] | None = None

    def end_user(self) -> str | None:
        """Who the client says asked (its own id for its user), if it says."""
        return self.user

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def wants_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def output_shape(self) -> str:
        """What shapes the answer (the ledger's ``output``): the response format or guided decoding asked
        for ("json_object", "json_schema", "guided_json", ...), or "" for free text."""
        if self.response_format is not None and not isinstance(self.response_format, TextFormat):
            return "json_object" if isinstance(self.response_format, JsonObjectFormat) else "json_schema"
        for name in ("guided_json", "guided_regex", "guided_grammar", "guided_choice"):
            if getattr(self, name) is not None:
                return name
        return ""


# OpenAI's API caps a request at 2048 messages; the cap also bounds the work of rendering and tokenizing.
MAX_MESSAGES = 2048


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None
    # vLLM's name: the last message (the assistant's) is left open and the answer continues its text,
    # e.g. an edge resuming on another region a stream whose region died mid-answer.
    continue_final_message: bool = False
    # The chosen token's log-probability, and with top_logprobs that many alternatives, per output token.
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's chat fields that do not change what a model writes: taken as OpenAI takes them, and passed on
    # to a provider in a region's place. Nearshore's own regions keep no completions (``store``) and have
    # one tier (``service_tier``); ``metadata`` and ``prompt_cache_key`` are the client's own labels.
    metadata: Metadata | None = None
    store: bool | None = None
    service_tier: ServiceTier | None = None
    safety_identifier: EndUser | None = None
    prompt_cache_key: PromptCacheKey | None = None
    modalities: Annotated[list[Literal["text"]], Meta(min_length=1)] | None = None  # text is all there is

    def top_logprobs_asked(self) -> int | None:
        """Alternatives per output token, or None when no log-probabilities are asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def end_user(self) -> str | None:
        return self.user or self.safety_identifier  # OpenAI's newer name for what ``user`` said

    def output_shape(self) -> str:
        # Tools the model may call come first: with them the answer is a call or text (auto), or a call.
        return "tools" if self.tools and self.tool_choice != "none" else super().output_shape()

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: Annotated[str, Meta(min_length=1)] | Annotated[list[str], Meta(min_length=1, max_length=1)]
    echo: bool = False
    # 0 is allowed with echo: the prompt alone is scored (evaluation harnesses ask for exactly that).
    max_tokens: Annotated[int, Meta(ge=0)] | None = None
    # The legacy API's log-probabilities: the chosen token's and the top N alternatives', per token
    # (with echo, per prompt token too).
    logprobs: TopLogprobs | None = None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def token_limit(self) -> int | None:
        # OpenAI's legacy completions default to 16 tokens.
        return self.max_tokens if self.max_tokens is not None else 16

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# --- responses ---------------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(
            prompt_tokens,
            completion_tokens,
            prompt_tokens + completion_tokens,
            PromptTokensDetails(cached_tokens),
        )


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(Struct):
    """The legacy shape: parallel lists, one entry per token (the first prompt token's are null)."""

    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class AssistantMessage(Struct):
    content: str | None  # null beside tool calls when the model wrote nothing else
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET  # left out of the JSON when unset


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionCallDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A streamed call: its first delta has the id, the type and the name; the others more arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class Completion(Struct):
    """Both the whole answer and each streamed chunk of ``/v1/completions`` have this shape."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | None = None


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "nearshore"
    object: Literal["model"] = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


# --- embeddings --------------------------------------------------------------------------------------

# OpenAI's cap on the inputs of one embeddings request.
MAX_EMBEDDING_INPUTS = 2048
EmbeddingText = Annotated[str, Meta(min_length=1)]


class EmbeddingRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    model: ModelName
    # Strings only: token-id arrays (OpenAI accepts them for its own tokenizer) are refused.
    input: EmbeddingText | Annotated[list[EmbeddingText], Meta(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    encoding_format: Literal["float", "base64"] = "float"
    # Accepted on the wire so that the refusal can name it: no served model can shorten its vectors.
    dimensions: int | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    # As the edge's stages read any request: never streamed, no sampling, nothing generated.
    stream = False
    temperature = None

    def token_limit(self) -> int:
        return 0

    def wants_usage_chunk(self) -> bool:
        return False


class Embedding(Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    # A list of floats, or with encoding_format "base64" the little-endian float32 bytes in base64.
    embedding: list[float] | str


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


chat_request_decoder = msgspec.json.Decoder(ChatCompletionRequest)
completion_request_decoder = msgspec.json.Decoder(CompletionRequest)
embedding_request_decoder = msgspec.json.Decoder(EmbeddingRequest)
json_encoder = msgspec.json.Encoder()
