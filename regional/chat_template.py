"""Turn chat messages into one prompt: the GGUF's own Jinja template, or the Gemma turn format.

The embedded model is a base model without a template, so the Gemma turn format is the default.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nearshore.protocol.chat_format import gemma_turns
from nearshore.protocol.schemas import ChatMessage

__all__ = ["ChatFormatter", "ChatTemplateError", "gemma_turns"]


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
        if self._jinja is None:
            return gemma_turns(messages)
        payload = [
            {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages
        ]
        try:
            text = self._jinja.render(messages=payload, add_generation_prompt=True, **self.special_tokens)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template rejected the messages: {exc}") from exc
        bos = self.special_tokens.get("bos_token", "")
        # The tokenizer adds BOS itself; a template that writes it too would double it.
        return text[len(bos) :] if bos and text.startswith(bos) else text


def _raise(message: str) -> None:
    raise TemplateError(message)
