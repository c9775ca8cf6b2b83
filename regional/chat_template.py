"""Turn chat messages into prompt segments: the GGUF's own Jinja template, or the Gemma turn format.

``chat_template = "auto"`` takes the GGUF's template when the file has one, the Gemma turn format when not:
the embedded Gemma 3 270M is a base model without a template (the Gemma format it is); the embedded
SmolLM2-135M-Instruct carries its ChatML template (``<|im_start|>role ... <|im_end|>``), rendered here.

Only the template's own text may hold control tokens; what callers wrote (message content and names) is
plain text. A Jinja template is rendered with each caller-written string replaced by a unique sentinel,
and the output is cut at the sentinels: template text on one side, the caller's strings on the other.
A template that trims content (``| trim``, common: Gemma's and Llama's do) trims the sentinel's padding,
which is whitespace, so the same trim is applied to the content. A template that transforms content any
other way (slicing, case, escaping) breaks its sentinel; that is detected and refused, never guessed at.

A continuation (``continue_final``) leaves the last message, the assistant's, open: the template renders the
conversation without a generation prompt, and the prompt is cut right after that message's sentinel (its
end-of-turn markers dropped). Its text goes in verbatim, untrimmed: it is what the model already said.
A template that does not render that message last is refused (:class:`OpenTurnError`).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nearshore.protocol.chat_format import gemma_segments, gemma_turns
from nearshore.protocol.prompt_segments import Segment, joined, merged
from nearshore.protocol.schemas import ChatMessage

__all__ = ["ChatFormatter", "ChatTemplateError", "gemma_turns"]

# Whitespace on both sides of a sentinel: ``trim`` removes it, showing that the content was trimmed.
_PAD = "\x0b\x0c"


class ChatTemplateError(ValueError):
    pass


class OpenTurnError(ChatTemplateError):
    """The template cannot leave the last assistant turn open."""


class ChatFormatter:
    """Renders a conversation with the chosen template. ``adds_bos``: the tokenizer puts BOS before the
    prompt, so a template that writes ``bos_token`` first has it cut (it would be doubled); a tokenizer that
    adds none (SmolLM2's, whose BOS text ``<|im_start|>`` opens every turn) keeps the template's text
    whole."""

    def __init__(
        self, template: str | None, special_tokens: dict[str, str], *, adds_bos: bool = True
    ) -> None:
        self.special_tokens = special_tokens
        self.adds_bos = adds_bos
        self._jinja = None
        if template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._jinja = env.from_string(template)

    @property
    def kind(self) -> str:
        return "gguf" if self._jinja is not None else "gemma"

    def render(self, messages: Sequence[ChatMessage], *, continue_final: bool = False) -> str:
        """The prompt as one string (without BOS)."""
        return joined(self.segments(messages, continue_final=continue_final))

    def segments(self, messages: Sequence[ChatMessage], *, continue_final: bool = False) -> list[Segment]:
        """``continue_final``: the last message is the assistant's and its turn stays open (the caller has
        checked the role)."""
        if self._jinja is None:
            return gemma_segments(messages, continue_final=continue_final)
        nonce = secrets.token_hex(8)  # unguessable: a caller cannot write a sentinel into its content
        written: list[str] = []

        def hide(text: str) -> str:
            written.append(text)
            return f"{_PAD}ns{nonce}x{len(written) - 1}x{_PAD}"

        payload: list[dict[str, str]] = []
        opened = -1
        for m in messages:
            payload.append({"role": m.role, "content": hide(m.text())})
            opened = len(written) - 1  # the last message's content, when continuing
            if m.name:
                payload[-1]["name"] = hide(m.name)
        try:
            text = self._jinja.render(
                messages=payload, add_generation_prompt=not continue_final, **self.special_tokens
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template rejected the messages: {exc}") from exc
        bos = self.special_tokens.get("bos_token", "") if self.adds_bos else ""
        # The tokenizer adds BOS itself; a template that writes it too would double it.
        text = text[len(bos) :] if bos and text.startswith(bos) else text
        if not continue_final:
            return _cut_at_sentinels(text, nonce, written)
        return _open_last_turn(text, nonce, written, opened)


def _sentinel(nonce: str) -> re.Pattern[str]:
    return re.compile(f"({re.escape(_PAD)})?ns{nonce}x(\\d+)x({re.escape(_PAD)})?")


def _cut_at_sentinels(text: str, nonce: str, written: list[str]) -> list[Segment]:
    sentinel = _sentinel(nonce)
    segments: list[Segment] = []
    at = 0
    for match in sentinel.finditer(text):
        segments.append(Segment(text[at : match.start()], True))
        content = written[int(match.group(2))]
        if match.group(1) is None:  # the template trimmed the left side
            content = content.lstrip()
        if match.group(3) is None:
            content = content.rstrip()
        segments.append(Segment(content, False))
        at = match.end()
    segments.append(Segment(text[at:], True))
    if any(s.special and nonce in s.text.lower() for s in segments):
        raise ChatTemplateError(
            "the model's chat template transforms message content in a way that cannot be kept apart "
            "from its own text; set model.chat_template = 'gemma' or use another template"
        )
    return merged(segments)


def _open_last_turn(text: str, nonce: str, written: list[str], opened: int) -> list[Segment]:
    """The prompt up to message content ``opened``, which must be the last caller text rendered, then that
    content verbatim and as a segment of its own (the template may trim it; the model said it as it is)."""
    sentinels = list(_sentinel(nonce).finditer(text))
    if not sentinels or int(sentinels[-1].group(2)) != opened:
        raise OpenTurnError(
            "the model's chat template does not render the last assistant message at the end of the "
            "conversation, so its turn cannot be left open to continue; set model.chat_template = 'gemma' "
            "or send the request without continue_final_message"
        )
    before = _cut_at_sentinels(text[: sentinels[-1].start()], nonce, written)
    return [*before, *([Segment(written[opened], False)] if written[opened] else [])]


def _raise(message: str) -> None:
    raise TemplateError(message)
