"""The Gemma turn format: how chat messages become one prompt for models without a template of their own.

Shared by the regional node (which renders prompts) and the edge (which counts their tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

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
