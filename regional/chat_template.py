"""Turn chat messages into one prompt: the GGUF's own Jinja template, or the Gemma turn format.

The embedded model is a base model without a template, so the Gemma turn format is the default.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nearshore.protocol.schemas import ChatMessage

# Gemma has no system role: system (and developer) text opens the first user turn.
_GEMMA_ROLE = {"user": "user", "assistant": "model"}


def gemma_turns(messages: Sequence[ChatMessage]) -> str:
    system = "\n\n".join(m.text() for m in messages if m.role in ("system", "developer"))
    parts: list[str] = []
    for message in messages:
        role = _GEMMA_ROLE.get(message.role)
        if role is None:
            continue
        text = message.text()
        if system and role == "user":
            text, system = f"{system}\n\n{text}", ""
        parts.append(f"<start_of_turn>{role}\n{text}<end_of_turn>\n")
    if system:  # only system messages: they become the user's turn
        parts.append(f"<start_of_turn>user\n{system}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


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
