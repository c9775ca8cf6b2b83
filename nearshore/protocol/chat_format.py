"""The Gemma turn format: how chat messages become one prompt for models without a template of their own.

Shared by the regional node (which tokenizes prompts) and the edge (which counts their tokens). Only the
turn markers are control tokens; what the messages say is plain text (see ``prompt_segments``).
"""

from __future__ import annotations

from collections.abc import Sequence

from nearshore.protocol.prompt_segments import Segment, joined, merged
from nearshore.protocol.schemas import ChatMessage

# Gemma has no system role: system (and developer) text opens the first user turn.
_GEMMA_ROLE = {"user": "user", "assistant": "model"}
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"


def gemma_segments(messages: Sequence[ChatMessage], *, continue_final: bool = False) -> list[Segment]:
    """The turns, then the model's turn opened for its answer.

    ``continue_final``: the last message, the assistant's, is the start of that answer: the prompt is the one
    that asked for it, then its text (a segment of its own: the tokens before it are those the answer began
    from), and no end of turn, so the model continues the text. Empty, it is the generation prompt itself.
    (A last message that is not the assistant's leaves the flag without effect: the region refuses that.)
    """
    if continue_final and messages and messages[-1].role == "assistant":
        opened = messages[-1].text()
        return [*gemma_segments(messages[:-1]), *([Segment(opened, False)] if opened else [])]
    system = "\n\n".join(m.text() for m in messages if m.role in ("system", "developer"))
    parts: list[Segment] = []
    for message in messages:
        role = _GEMMA_ROLE.get(message.role)
        if role is None:
            continue
        text = message.text()
        if system and role == "user":
            text, system = f"{system}\n\n{text}", ""
        parts += _turn(role, text)
    if system:  # only system messages: they become the user's turn
        parts += _turn("user", system)
    parts += [Segment(START_OF_TURN, True), Segment("model\n", False)]
    # The role names and newlines hold no control token: as plain text they join the content beside them,
    # so a prompt without control text in it tokenizes exactly as the joined string does.
    return merged(parts)


def _turn(role: str, text: str) -> list[Segment]:
    return [
        Segment(START_OF_TURN, True),
        Segment(f"{role}\n", False),
        Segment(text, False),
        Segment(END_OF_TURN, True),
        Segment("\n", False),
    ]


def gemma_turns(messages: Sequence[ChatMessage]) -> str:
    """The prompt as one string, for callers that show or send it whole (benchmarks)."""
    return joined(gemma_segments(messages))
