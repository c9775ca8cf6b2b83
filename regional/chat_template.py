"""Turn chat messages into prompt segments: the GGUF's own Jinja template, or the Gemma turn format.

The embedded model is a base model without a template, so the Gemma turn format is the default.

Only the template's own text may hold control tokens; what callers wrote (message content and names) is
plain text. A Jinja template is rendered with each caller-written string replaced by a unique sentinel,
and the output is cut at the sentinels: template text on one side, the caller's strings on the other.
A template that trims content (``| trim``, common: Gemma's and Llama's do) trims the sentinel's padding,
which is whitespace, so the same trim is applied to the content. A template that transforms content any
other way (slicing, case, escaping) breaks its sentinel; that is detected and refused, never guessed at.
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


class ChatFormatter:
    """Renders a conversation with the chosen template; ``bos_token`` is left to the tokenizer."""

    def __init__(self, template: str | None, special_tokens: dict[str, str]) -> None:
        self.special_tokens = special_tokens
        self._jinja = None
        if template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._jinja = env.from_string(template)

    @property
    def kind(self) -> str:
        return "gguf" if self._jinja is not None else "gemma"

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt as one string (without BOS)."""
        return joined(self.segments(messages))

    def segments(self, messages: Sequence[ChatMessage]) -> list[Segment]:
        if self._jinja is None:
            return gemma_segments(messages)
        nonce = secrets.token_hex(8)  # unguessable: a caller cannot write a sentinel into its content
        written: list[str] = []

        def hide(text: str) -> str:
            written.append(text)
            return f"{_PAD}ns{nonce}x{len(written) - 1}x{_PAD}"

        payload = [
            {"role": m.role, "content": hide(m.text()), **({"name": hide(m.name)} if m.name else {})}
            for m in messages
        ]
        try:
            text = self._jinja.render(messages=payload, add_generation_prompt=True, **self.special_tokens)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template rejected the messages: {exc}") from exc
        bos = self.special_tokens.get("bos_token", "")
        # The tokenizer adds BOS itself; a template that writes it too would double it.
        text = text[len(bos) :] if bos and text.startswith(bos) else text
        return _cut_at_sentinels(text, nonce, written)


def _cut_at_sentinels(text: str, nonce: str, written: list[str]) -> list[Segment]:
    sentinel = re.compile(f"({re.escape(_PAD)})?ns{nonce}x(\\d+)x({re.escape(_PAD)})?")
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


def _raise(message: str) -> None:
    raise TemplateError(message)
