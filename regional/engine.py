"""The engine interface: what the HTTP layer needs from anything that decodes tokens.

Implementations: :mod:`regional.llama_engine` (llama.cpp, the CPU fallback) and :mod:`regional.torch_engine`
(the batched engine of ``gpu/``, on CUDA when present, else the CPU). The HTTP layer knows nothing about which
one runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from nearshore.protocol.prompt_segments import Segment
from nearshore.sampling import SamplingParams

EngineState = Literal["loading", "ready", "unloaded", "failed"]
# "stop": the model emitted an end-of-generation token; "length": max_tokens reached;
# "abort": the request was aborted; "error": the engine failed this request; "failed": the engine failed
# for good (generate() raises EngineFailed on it).
EngineFinish = Literal["stop", "length", "abort", "error", "failed"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int  # 0: the prompt is only scored (with prompt_logprobs), nothing is generated
    sampling: SamplingParams = SamplingParams()
    # Log-probabilities: of each sampled token with this many alternatives (0: the token's alone), and of
    # each prompt token after the first. None: not asked for, nothing is computed.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Whose share of the node it uses: the edge's opaque per-key id (x-nearshore-share-key); the scheduler
    # admits and prefills round-robin across them. "": everyone without one shares one.
    share_key: str = ""
    # A checked grammar (regional.grammar.check) the output must follow: a JSON schema, a tool call's
    # shape, a regex. None: unconstrained.
    grammar: str | None = None
    # With a grammar: the output text after which it applies (free before it: ``auto`` tool calls).
    grammar_trigger: str | None = None


class Logprobs(msgspec.Struct, array_like=True):
    """One position's log-probabilities: of the token there (None for the first prompt token, which
    nothing predicts) and of the most likely tokens, likeliest first."""

    token_id: int
    logprob: float | None
    top: list[tuple[int, float]]


class TokenEvent(msgspec.Struct, array_like=True, omit_defaults=True):
    """One decoded token of one request, or the request's end.

    ``text`` is the token's share of the output; it is empty while a multi-byte character is incomplete.
    The first event of a request also carries its queue and prefill times and the prompt tokens
    that were reused from the prefix cache, and the prompt's log-probabilities when they were asked for.
    A request with ``max_tokens`` 0 has one event, its end, with no token (``token_id`` -1).
    """

    token_id: int = -1
    text: str = ""
    finish_reason: EngineFinish | None = None
    error: str | None = None
    # With finish "error": the request's grammar failed it (it allowed no next token): the request's own
    # error, a 400 naming the parameter that asked for the grammar, never the engine's.
    grammar_failed: bool = False
    cached_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    logprobs: Logprobs | None = None
    prompt_logprobs: list[Logprobs] | None = None
    # The first event: seconds its grammar took to build before it was queued (the request's own setup).
    grammar_s: float = 0.0


class EngineStats(msgspec.Struct):
    state: EngineState
    running: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    steps: int
    model_load_s: float
    failure: str = ""  # why the engine state is "failed"
    capacity: int = 0  # the most sequences decoded at once (0: unknown)
    tokens_per_s: float = 0.0  # generated tokens per second, over a recent window
    engine: str = ""  # which engine decodes, on what ("llama.cpp", "gpu (cuda, bfloat16)")
    num_preemptions: int = 0  # sequences whose KV was freed for others' (they recompute)
    prefill_tokens: int = 0  # prompt (and recomputed) tokens the steps have computed, as they ran
    step_s: float = 0.0  # seconds the steps ran (model, sampling, grammars)
    grammar_s: float = 0.0  # of which computing grammar masks (beside the model) and advancing grammars
    grammar_tokens: int = 0  # tokens drawn under a grammar (response_format, guided_*, a tool call)
    # The most sequences one request may ever have (its ``n`` choices): those decoded at once plus those
    # allowed to wait (0: unknown). A request asking more is refused as the client's error, whatever the load.
    max_choices: int = 0
    prefill_ms_per_token: float = 0.0  # a prompt token's prefill, as the steps cost (0: not measured yet)


class EngineOverloaded(Exception):
    """The waiting queue is full; the caller should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("engine queue is full")
        self.retry_after_s = retry_after_s


class PromptTooLong(Exception):
    """The prompt has more tokens than allowed; counting stopped once that was certain."""

    def __init__(self, at_least_tokens: int) -> None:
        super().__init__(f"the prompt has at least {at_least_tokens} tokens")
        self.at_least_tokens = at_least_tokens


class EngineFailed(Exception):
    """The engine cannot go on (its worker died, or its steps kept failing); the process should exit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Told once, on the event loop, when the engine fails for good; the node exits so its supervisor restarts it.
FatalHandler = Callable[[str], None]


class Engine(Protocol):
    model_name: str
    context_window: int
    on_fatal: FatalHandler | None

    @property
    def state(self) -> EngineState: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> None:
        """Return once the model is in memory, loading it first if it is not; raises
        :class:`EngineFailed` once the engine has failed for good."""
        ...

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    async def tokenize_prompt(self, segments: Sequence[Segment], limit_tokens: int) -> list[int]:
        """BOS, then the segments' tokens (content as plain text, special segments with control tokens),
        off the event loop; raises :class:`PromptTooLong` as soon as the prompt is sure to exceed
        ``limit_tokens``, before tokenizing at all when its length in bytes says so."""
        ...

    def detokenize(self, tokens: list[int]) -> str: ...

    @property
    def vocab_size(self) -> int:
        """Tokens in the model's vocabulary (the model is loaded)."""
        ...

    def token_piece(self, token: int) -> bytes:
        """The bytes one token stands for, control tokens spelled out (``<end_of_turn>``): how
        log-probabilities name tokens."""
        ...

    def chat_template(self) -> str | None:
        """The model's own chat template (Jinja), when its file carries one."""
        ...

    def special_tokens(self) -> dict[str, str]:
        """``bos_token`` and ``eos_token`` text, for chat templates."""
        ...

    def adds_bos(self) -> bool:
        """Whether :meth:`tokenize_prompt` puts BOS before the prompt itself (Gemma's vocabulary asks for it;
        SmolLM2's does not, and its template's first token is its BOS text)."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Stream the request's tokens; raises :class:`EngineOverloaded` before the first event, and
        :class:`EngineFailed` (at any point) once the engine has failed for good."""
        ...

    def abort(self, request_id: str) -> None: ...

    def room(self) -> int:
        """How many more sequences :meth:`generate` accepts now, before it raises
        :class:`EngineOverloaded` (a request of ``n`` choices needs ``n``)."""
        ...

    def stats(self) -> EngineStats: ...
