"""What the regional node does with one API request, apart from HTTP: prompt, limits, engine, output gate.

``RegionService.prepare_*`` checks the request and builds the prompt (errors are :class:`ApiError`);
:class:`Generation` runs it and yields released text with, at the end, the finish reason and usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from nearshore.protocol.checks import check_supported
from nearshore.protocol.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    ENGINE_FAILED,
    INTERNAL,
    INVALID_REQUEST,
    MODEL_NOT_FOUND,
    NO_ROOM_FOR_CHOICES,
    OVERLOADED,
    UNSUPPORTED_PARAMETER,
    ApiError,
)
from nearshore.protocol.prompt_segments import Segment
from nearshore.protocol.schemas import ChatCompletionRequest, CompletionRequest, FinishReason, Usage
from nearshore.protocol.tool_prompt import prompt_messages, tools_offered
from regional.chat_template import ChatFormatter, ChatTemplateError, OpenTurnError
from regional.config import RegionConfig
from regional.engine import (
    Engine,
    EngineFailed,
    EngineOverloaded,
    GenerationRequest,
    Logprobs,
    PromptTooLong,
    SamplingParams,
)
from regional.grammar import GrammarError, GrammarSpec, check
from regional.logprob_wire import TokenNames
from regional.metrics import RegionMetrics
from regional.output_gate import OutputGate
from regional.safety import SafetyFilter
from regional.structured import ConflictingFormats, requested_grammar
from regional.tool_grammar import UnknownTool, tool_grammar

log = logging.getLogger("nearshore.region.requests")


@dataclass(frozen=True, slots=True)
class AskedGrammar:
    """The checked grammar a request's output follows, the parameter that asked for it (for an error to
    name) and the text after which it applies (None: from the first token; ``auto`` tool calls: the call's
    opening tag)."""

    text: str
    param: str
    trigger: str | None = None


@dataclass(slots=True)
class Prepared:
    request_id: str
    model: str
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    stops: list[str]
    prompt_text: str = ""  # echoed back by completions with echo=true
    logprobs: int | None = None  # alternatives per output token (0: the chosen token's alone)
    prompt_logprobs: int | None = None  # alternatives per prompt token (completions with echo)
    share_key: str = ""  # whose share of the node (the edge's opaque per-key id; scheduler.py)
    grammar: AskedGrammar | None = None  # response_format, guided_*, or the tool choice's
    tool_names: frozenset[str] | None = None  # the functions offered, whose calls the answer reads out


@dataclass(slots=True)
class Timings:
    """Seconds since the request arrived, split the way the Server-Timing header reports them."""

    arrived: float = field(default_factory=time.perf_counter)
    tokenize_s: float = 0.0
    grammar_s: float = 0.0  # building the request's grammar, before it was queued
    queue_s: float = 0.0
    prefill_s: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0

    def server_timing(self) -> str:
        parts = [f"tokenize;dur={self.tokenize_s * 1000:.1f}"]
        if self.grammar_s:  # the edge leaves it out of what it learns of the node's speed
            parts.append(f"grammar;dur={self.grammar_s * 1000:.1f}")
        parts += [f"queue;dur={self.queue_s * 1000:.1f}", f"prefill;dur={self.prefill_s * 1000:.1f}"]
        if self.first_token_at:
            parts.append(f"ttft;dur={(self.first_token_at - self.arrived) * 1000:.1f}")
        if self.finished_at:
            parts.append(f"total;dur={(self.finished_at - self.arrived) * 1000:.1f}")
        return ", ".join(parts)


class RegionService:
    def __init__(self, config: RegionConfig, engine: Engine, safety: SafetyFilter | None) -> None:
        self.config = config
        self.engine = engine
        self.safety = safety
        self.metrics = RegionMetrics(engine)
        self.model_names = {config.model.name, *config.model.aliases}
        self._formatter: ChatFormatter | None = None
        self.token_names = TokenNames(engine.token_piece)  # how log-probabilities name tokens
        # The engine keys sequences by these, never by a caller's id: two callers sending the same
        # x-request-id must not be able to abort each other.
        self._sequence_numbers = itertools.count()

    def sequence_id(self, request_id: str) -> str:
        return f"{request_id}#{next(self._sequence_numbers)}"

    def check_model(self, model: str) -> None:
        if model not in self.model_names:
            raise ApiError(
                MODEL_NOT_FOUND,
                f"The model `{model}` does not exist on this node; it serves {self.config.model.name!r}.",
                param="model",
            )

    def formatter(self) -> ChatFormatter:
        if self._formatter is None:
            choice = self.config.model.chat_template
            template = self.engine.chat_template() if choice in ("auto", "gguf") else None
            if choice == "gguf" and not template:
                raise ApiError(INTERNAL, "chat_template = 'gguf' but the model file carries no chat template")
            self._formatter = ChatFormatter(
                template, self.engine.special_tokens(), adds_bos=self.engine.adds_bos()
            )
        return self._formatter

    async def prepare_chat(self, body: ChatCompletionRequest, request_id: str, timings: Timings) -> Prepared:
        self._check_common(body)
        continuing = body.continue_final_message
        if continuing and body.messages[-1].role != "assistant":
            raise ApiError(
                INVALID_REQUEST,
                "continue_final_message needs the last message to be the assistant's: the text to continue.",
                param="continue_final_message",
            )
        await self._ready()  # the template comes from the model file
        parallel = body.parallel_tool_calls is not False
        messages = prompt_messages(body.messages, body.tools, body.tool_choice, parallel)
        try:
            segments = self.formatter().segments(messages, continue_final=continuing)
        except OpenTurnError as exc:
            raise ApiError(UNSUPPORTED_PARAMETER, str(exc), param="continue_final_message") from None
        except ChatTemplateError as exc:
            raise ApiError(UNSUPPORTED_PARAMETER, str(exc), param="messages") from None
        grammar = await self._tool_grammar(body, parallel) or await self._grammar(body)
        tokens = await self._tokenize(segments, timings, "messages")
        prepared = self._prepared(request_id, body.model, tokens, body.token_limit(), body, "messages")
        prepared.logprobs = body.top_logprobs_asked()
        prepared.grammar = grammar
        if tools_offered(body.tools, body.tool_choice):
            prepared.tool_names = frozenset(t.function.name for t in body.tools or ())
        return prepared

    async def prepare_completion(
        self, body: CompletionRequest, request_id: str, timings: Timings
    ) -> Prepared:
        self._check_common(body)
        await self._ready()
        grammar = await self._grammar(body)
        text = body.prompt_text()
        # The caller owns the whole prompt (no roles to forge), so its control tokens are parsed: prompts
        # pre-rendered in the turn format keep their meaning. The cost is bounded as for chats.
        tokens = await self._tokenize([Segment(text, special=True)], timings, "prompt")
        prepared = self._prepared(request_id, body.model, tokens, body.token_limit(), body, "prompt")
        prepared.prompt_text = text if body.echo else ""
        prepared.logprobs = body.logprobs
        prepared.prompt_logprobs = body.logprobs if body.echo else None
        prepared.grammar = grammar
        return prepared

    def _check_common(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        self.check_model(body.model)
        check_supported(body)
        e = self.config.engine
        if body.n > (most := e.max_sequences + e.max_waiting):
            raise ApiError(
                INVALID_REQUEST,
                f"n = {body.n} choices cannot be served here: this node holds at most {most} sequences of "
                f"one request ({e.max_sequences} decoded at once, {e.max_waiting} waiting).",
                param="n",
            )

    def check_room(self, n: int) -> None:
        """A request of ``n`` choices needs ``n`` sequences: when the node has room for some but not all
        of them, this request (not the node) is refused, so that it never counts against the node's health.
        A full node is refused by the engine itself (``overloaded``)."""
        if n > 1 and 0 < (room := self.engine.room()) < n:
            raise ApiError(
                NO_ROOM_FOR_CHOICES,
                f"The node has room for {room} more sequences now, not for n = {n} choices; retry shortly "
                "or ask for fewer.",
                param="n",
                retry_after_s=1.0,
            )

    async def _grammar(self, body: ChatCompletionRequest | CompletionRequest) -> AskedGrammar | None:
        """The checked grammar ``response_format`` or ``guided_*`` asks for, or None; a 400 naming the
        parameter and the part of the schema at fault."""
        try:
            asked = requested_grammar(body)
        except ConflictingFormats as exc:
            raise ApiError(INVALID_REQUEST, str(exc), param=exc.params[-1]) from None
        return None if asked is None else await _checked(*asked)

    async def _tool_grammar(self, body: ChatCompletionRequest, parallel: bool) -> AskedGrammar | None:
        """The checked grammar of the request's tool choice, or None when it constrains nothing."""
        try:
            text = requested_grammar(body) if tools_offered(body.tools, body.tool_choice) else None
        except ConflictingFormats as exc:
            raise ApiError(INVALID_REQUEST, str(exc), param=exc.params[-1]) from None
        if text is not None and text[0].kind not in ("json_schema", "json_object"):
            raise ApiError(
                UNSUPPORTED_PARAMETER,
                f"{text[1]} and tools cannot be used together here; a response_format can (its JSON is the "
                'text answer), or send tools with tool_choice "none" to constrain the text.',
                param=text[1],
            )
        try:
            asked = tool_grammar(body.tools, body.tool_choice, parallel, text[0] if text else None)
        except UnknownTool as exc:
            raise ApiError(INVALID_REQUEST, f"{exc}.", param="tool_choice") from None
        if asked is None:
            return None
        spec, trigger = asked
        return await _checked(spec, "tools", trigger)

    async def _ready(self) -> None:
        try:
            await self.engine.ready()
        except EngineFailed as exc:
            raise engine_failed(exc) from None

    async def _tokenize(self, segments: list[Segment], timings: Timings, prompt_param: str) -> list[int]:
        """The prompt's tokens, counted no further than the context window."""
        window = self.engine.context_window
        started = time.perf_counter()
        try:
            tokens = await self.engine.tokenize_prompt(segments, window)
        except PromptTooLong as exc:
            raise ApiError(
                CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {window} tokens. However, your prompt is at least "
                f"{exc.at_least_tokens} tokens, leaving no room for a completion. Please shorten the prompt.",
                param=prompt_param,
            ) from None
        except EngineFailed as exc:
            raise engine_failed(exc) from None
        finally:
            timings.tokenize_s = time.perf_counter() - started
        return tokens

    def _prepared(
        self,
        request_id: str,
        model: str,
        tokens: list[int],
        asked_max: int | None,
        body: ChatCompletionRequest | CompletionRequest,
        prompt_param: str,
    ) -> Prepared:
        window = self.engine.context_window
        if asked_max is None:
            if len(tokens) >= window:
                raise ApiError(
                    CONTEXT_LENGTH_EXCEEDED,
                    f"This model's maximum context length is {window} tokens. However, your prompt is "
                    f"{len(tokens)} tokens, leaving no room for a completion. Please shorten the prompt.",
                    param=prompt_param,
                )
            max_tokens = min(self.config.engine.default_max_tokens, window - len(tokens))
        else:
            if len(tokens) + asked_max > window:
                raise ApiError(
                    CONTEXT_LENGTH_EXCEEDED,
                    f"This model's maximum context length is {window} tokens. However, you requested "
                    f"{len(tokens) + asked_max} tokens ({len(tokens)} in the prompt, {asked_max} in the "
                    "completion). Please reduce the length of the prompt or the completion.",
                    param=prompt_param if len(tokens) >= window else "max_tokens",
                )
            max_tokens = asked_max
        sampling = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            min_p=body.min_p,
            repetition_penalty=body.repetition_penalty,
            seed=body.seed,
            logit_bias=self._logit_bias(body),
        )
        return Prepared(request_id, model, tokens, max_tokens, sampling, body.stop_list())

    def _logit_bias(self, body: ChatCompletionRequest | CompletionRequest) -> tuple[tuple[int, float], ...]:
        """OpenAI's ``logit_bias``, its keys checked against the vocabulary (a 400 naming the key)."""
        if not body.logit_bias:
            return ()
        size = self.engine.vocab_size
        bias = []
        for key, value in body.logit_bias.items():
            if not key.isdigit() or int(key) >= size:
                raise ApiError(
                    INVALID_REQUEST,
                    f"logit_bias keys are token ids from 0 to {size - 1}; {key!r} is not one.",
                    param="logit_bias",
                )
            bias.append((int(key), float(value)))
        return tuple(bias)

    def run(self, prepared: Prepared, timings: Timings) -> Generation:
        return Generation(self, prepared, timings)


async def _checked(spec: GrammarSpec, param: str, trigger: str | None = None) -> AskedGrammar:
    """``spec`` checked off the event loop (a large schema takes milliseconds); a 400 naming ``param``."""
    try:
        return AskedGrammar(await asyncio.to_thread(check, spec), param, trigger)
    except GrammarError as exc:
        raise ApiError(INVALID_REQUEST, f"Invalid {param}: {exc}.", param=param) from None


def engine_failed(exc: EngineFailed) -> ApiError:
    return ApiError(
        ENGINE_FAILED,
        f"This node's engine failed ({exc.reason}); the node is restarting. Retry on another node.",
        retry_after_s=5,
    )


class Generation:
    """One request's run. Iterate it for ``(text, finish_reason, logprobs)``: released text, the finish
    once known, and the log-probabilities of the tokens that arrived with it (when asked for: the
    end-of-generation token, which has no text, has none). ``usage`` is set once it ends, and
    ``prompt_logprobs`` (when asked for) with the first item."""

    def __init__(self, service: RegionService, prepared: Prepared, timings: Timings) -> None:
        self.service = service
        self.prepared = prepared
        self.timings = timings
        self.gate = OutputGate(prepared.stops, service.safety)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.started = False  # the engine produced its first token
        self.prompt_logprobs: list[Logprobs] | None = None

    @property
    def usage(self) -> Usage:
        return Usage.of(len(self.prepared.prompt_tokens), self.completion_tokens, self.cached_tokens)

    async def __aiter__(self) -> AsyncIterator[tuple[str, FinishReason | None, list[Logprobs]]]:
        p, t, m = self.prepared, self.timings, self.service.metrics
        model = self.service.config.model.name
        sequence_id = self.service.sequence_id(p.request_id)
        request = GenerationRequest(
            sequence_id,
            p.prompt_tokens,
            p.max_tokens,
            p.sampling,
            p.logprobs,
            p.prompt_logprobs,
            p.share_key,
            p.grammar.text if p.grammar is not None else None,
            p.grammar.trigger if p.grammar is not None else None,
        )
        last_token_at = 0.0
        events = self.service.engine.generate(request)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    now = time.perf_counter()
                    if event.grammar_failed:  # the request's grammar allowed no next token: its own error
                        raise GrammarError(event.error or "the grammar allows no next token")
                    if event.finish_reason in ("error", "abort"):
                        raise ApiError(INTERNAL, f"Generation failed: {event.error or event.finish_reason}")
                    if event.token_id >= 0:  # max_tokens 0 ends with no token
                        self.completion_tokens += 1
                    if not self.started:
                        self.started = True
                        self.cached_tokens = event.cached_tokens
                        self.prompt_logprobs = event.prompt_logprobs
                        t.queue_s, t.prefill_s, t.first_token_at = event.queue_s, event.prefill_s, now
                        t.grammar_s = event.grammar_s
                        m.ttft.labels(model).observe(now - t.arrived)
                        m.queue.labels(model).observe(event.queue_s)
                        m.prefill.labels(model).observe(event.prefill_s)
                    else:
                        m.itl.labels(model).observe(now - last_token_at)
                    last_token_at = now
                    text, blocked = self.gate.feed(event.text)
                    if blocked is None and event.finish_reason is not None:
                        text += self.gate.flush()
                        self.finish_reason = event.finish_reason  # "stop" or "length"
                    else:
                        self.finish_reason = blocked
                    # The end-of-generation token comes without log-probabilities: not part of the answer.
                    scored = [event.logprobs] if event.logprobs else []
                    yield text, self.finish_reason, scored
                    if self.finish_reason is not None:
                        return  # leaving the aclosing block aborts the sequence if it still runs
        except GrammarError as exc:
            # The grammar allows no output at all (refused before anything was queued), or dead-ended after
            # some tokens: the request's error, a 400 while nothing was sent (else the stream's error event),
            # which the edge neither retries nor counts against this node.
            param = p.grammar.param if p.grammar is not None else "response_format"
            raise ApiError(INVALID_REQUEST, f"Invalid {param}: {exc}.", param=param) from None
        except EngineOverloaded as exc:
            m.request_errors.labels("503").inc()
            raise ApiError(
                OVERLOADED, "The node's queue is full; retry shortly.", retry_after_s=exc.retry_after_s
            ) from None
        except EngineFailed as exc:
            m.request_errors.labels("503").inc()
            raise engine_failed(exc) from None
        finally:
            t.finished_at = time.perf_counter()
            self._record(model)

    def _record(self, model: str) -> None:
        t = self.timings
        log.info(
            "request %s prompt=%d cached=%d completion=%d finish=%s queue=%.1fms prefill=%.1fms total=%.1fms",
            self.prepared.request_id,
            len(self.prepared.prompt_tokens),
            self.cached_tokens,
            self.completion_tokens,
            self.finish_reason or "abort",
            t.queue_s * 1000,
            t.prefill_s * 1000,
            (t.finished_at - t.arrived) * 1000,
        )
        m = self.service.metrics
        m.prompt_tokens.labels(model).inc(len(self.prepared.prompt_tokens))
        m.generation_tokens.labels(model).inc(self.completion_tokens)
        m.request_prompt_tokens.labels(model).observe(len(self.prepared.prompt_tokens))
        m.request_generation_tokens.labels(model).observe(self.completion_tokens)
        m.e2e.labels(model).observe(self.timings.finished_at - self.timings.arrived)
        m.request_success.labels(model, self.finish_reason or "abort").inc()
