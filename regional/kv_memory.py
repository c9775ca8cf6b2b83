"""What the scheduler asks of a KV memory (:class:`KvMemory`), and what an admission changes in the
model's memory (:class:`Admission`).

Two memories implement it: llama.cpp's slots with prefix reuse (:mod:`regional.kv_slots`) and paged blocks
(:mod:`regional.kv_paged`). A memory only keeps books; what the model's memory must do comes back as values
that the step's plan carries to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from regional.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Admission:
    """A sequence joins the batch in ``slot``, reusing the first ``prefix_len`` KV cells of ``source``.

    First the idle caches of the ``evicted`` slots are cleared (to make room for it). Then, when
    ``source == slot``, the slot's own idle cache is trimmed to the prefix; otherwise the slot is cleared
    and then shares the source's cells.
    """

    sequence: Sequence
    slot: int
    source: int
    prefix_len: int
    evicted: tuple[int, ...] = ()


class KvMemory(Protocol):
    """Where the sequences' KV cells live, and which cached prefix a newcomer reuses.

    It only keeps books; what the model's memory must do comes back as values that the plan carries.
    """

    total_tokens: int

    def used_tokens(self) -> int: ...

    def allocate(self, seq: Sequence) -> Admission | None:
        """Place ``seq`` (its ``slot``) with the longest cached prefix it can reuse, dropping idle caches
        if that makes room; None, with nothing changed, when it must wait."""
        ...

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Room for the KV of ``seq``'s next ``num_tokens`` tokens (from ``num_computed`` on) this step."""
        ...

    def append(self, seq: Sequence, num_tokens: int) -> None:
        """Take that room: the step writes those tokens' KV."""
        ...

    def release(self, seq: Sequence, now: float) -> None:
        """``seq`` left (or was preempted): the one place its KV is freed; what it computed stays cached
        for a later prompt that starts the same way."""
        ...

    def evict_idle(self) -> list[int]:
        """Drop every idle cache; returns the slots whose cells must be cleared."""
        ...

    def reset(self) -> None:
        """The model's memory was wiped: every slot is free and empty."""
        ...
