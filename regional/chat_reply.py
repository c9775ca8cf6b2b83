"""How one chat generation becomes its answer, whole or streamed: its content, its log-probabilities when
asked for, and, when tools were offered, the calls read out of its text (:mod:`regional.tool_calls`), with
``finish_reason: "tool_calls"`` when the model ended after calling."""

from __future__ import annotations

from nearshore.protocol import sse
from nearshore.protocol.answers import ChatAnswer
from nearshore.protocol.schemas import ChatCompletion, FinishReason, FunctionCall, ToolCall, Usage
from regional.engine import Logprobs
from regional.logprob_wire import TokenNames, chat_logprobs
from regional.tool_calls import CallArguments, CallStarted, Event, ToolCallReader


class ChatReply:
    """One chat answer's shaping. ``tool_names``: the functions offered (None: no tools, the text is all
    content)."""

    def __init__(
        self,
        answer: ChatAnswer,
        include_usage: bool,
        names: TokenNames | None,
        tool_names: frozenset[str] | None = None,
    ) -> None:
        self.answer, self.include_usage, self.names = answer, include_usage, names
        self.reader = ToolCallReader(tool_names) if tool_names else None

    # --- a stream -----------------------------------------------------------------------------------

    def first(self, _generation: object) -> bytes:
        return sse.event(self.answer.opener())

    def text(self, text: str, scored: list[Logprobs]) -> bytes:
        logprobs = chat_logprobs(scored, self.names) if self.names is not None else None
        if self.reader is None:
            return sse.event(self.answer.content(text, logprobs))
        return self._events(self.reader.feed(text), logprobs)

    def end(self, finish: FinishReason) -> bytes:
        held = self._events(self.reader.finish(), None) if self.reader is not None else b""
        return held + sse.event(self.answer.finish(self.finish_reason(finish)))

    def usage(self, usage: Usage) -> bytes:
        return sse.event(self.answer.usage(usage))

    def _events(self, events: list[Event], logprobs) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, str):
                if event:
                    out.append(sse.event(self.answer.content(event, logprobs)))
                    logprobs = None
            elif isinstance(event, CallStarted):
                out.append(sse.event(self.answer.tool_call_opened(event.index, event.id, event.name)))
            elif isinstance(event, CallArguments):
                out.append(sse.event(self.answer.tool_call_arguments(event.index, event.fragment)))
        if logprobs is not None and logprobs.content:  # tokens inside a call: their scores still go out
            out.append(sse.event(self.answer.content("", logprobs)))
        return b"".join(out)

    # --- a whole answer -------------------------------------------------------------------------------

    def whole(self, text: str, finish: FinishReason, usage: Usage, scored: list[Logprobs]) -> ChatCompletion:
        logprobs = chat_logprobs(scored, self.names) if self.names is not None else None
        if self.reader is None:
            return self.answer.whole(text, finish, usage, logprobs)
        events = [*self.reader.feed(text), *self.reader.finish()]
        content = "".join(e for e in events if isinstance(e, str))
        calls = [ToolCall(c.id, FunctionCall(c.name, c.arguments)) for c in self.reader.calls]
        shown = content if content or not calls else None  # OpenAI: null content beside calls
        return self.answer.whole(shown, self.finish_reason(finish), usage, logprobs, calls)

    def finish_reason(self, finish: FinishReason) -> FinishReason:
        called = self.reader is not None and bool(self.reader.calls)
        return "tool_calls" if called and finish == "stop" else finish
