"""llama.cpp's KV memory as sequence slots: which slot a sequence gets and which cached prefix it reuses.

Every running sequence owns one slot (a llama.cpp sequence id). A slot keeps its KV cells after its
sequence finishes, so a later prompt with the same beginning (a shared system prompt) starts from there;
prefixes of running sequences are shared too, by reference, in the unified KV pool. Idle caches are
dropped, oldest first, when a newcomer needs their room.

Pure bookkeeping: what the model's memory must do comes back as :class:`Admission` values and evicted
slot ids, which the scheduler's plan carries to the engine. This is the :class:`KvMemory` the llama.cpp
engine gives its scheduler; a paged block manager can stand in for the GPU engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from regional.kv_memory import Admission
from regional.sequence import Sequence


@dataclass(eq=False)
class Slot:
    index: int
    owner: Sequence | None = None
    cached: list[int] = field(default_factory=list)  # tokens in KV while the slot is idle
    released_at: float = 0.0

    def tokens(self) -> list[int]:
        return self.owner.computed_tokens() if self.owner is not None else self.cached


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotMemory:
    def __init__(self, num_slots: int, total_tokens: int) -> None:
        self.total_tokens = total_tokens
        self.slots = [Slot(i) for i in range(num_slots)]

    def used_tokens(self) -> int:
        idle = sum(len(s.cached) for s in self.slots if s.owner is None)
        return idle + sum(s.owner.reserved_tokens for s in self.slots if s.owner is not None)

    def allocate(self, seq: Sequence) -> Admission | None:
        free = [s for s in self.slots if s.owner is None]
        if not free:
            return None
        # The last prompt token is always computed again: its logits pick the first output token.
        limit = seq.reusable_prefix
        source, prefix = max(
            ((s, min(limit, common_prefix_len(s.tokens(), seq.prompt))) for s in self.slots),
            key=lambda sp: (sp[1], sp[0].owner is None),
        )
        # Reuse the source's own slot when it is idle; otherwise the free slot whose cache matters least.
        if source.owner is None and prefix > 0:
            slot = source
        else:
            slot = min(
                free, key=lambda s: (common_prefix_len(s.cached, seq.prompt), len(s.cached), s.released_at)
            )
        keep = {slot.index, source.index} if prefix else {slot.index}
        evicted = self._make_room(seq.reserved_tokens, keep=keep, target=slot)
        if evicted is None:
            return None
        slot.owner, slot.cached = seq, []
        seq.slot = slot.index
        return Admission(seq, slot.index, source.index, prefix, evicted)

    def _make_room(self, need: int, keep: set[int], target: Slot) -> tuple[int, ...] | None:
        """Drop idle caches, oldest first, until ``need`` cells fit; None, dropping none, if they never do."""
        # The target's idle cache is replaced by the new sequence, so it does not count against the room.
        used = self.used_tokens() - len(target.cached)
        idle = sorted(
            (s for s in self.slots if s.owner is None and s.cached and s.index not in keep),
            key=lambda s: s.released_at,
        )
        victims: list[Slot] = []
        while used + need > self.total_tokens and len(victims) < len(idle):
            victim = idle[len(victims)]
            victims.append(victim)
            used -= len(victim.cached)
        if used + need > self.total_tokens:
            return None
        for victim in victims:
            victim.cached = []
        return tuple(victim.index for victim in victims)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return True  # admission reserved the prompt and max_tokens: a slot's sequence never runs short

    def append(self, seq: Sequence, num_tokens: int) -> None:
        pass

    def release(self, seq: Sequence, now: float) -> None:
        slot = self.slots[seq.slot]
        slot.owner = None
        slot.cached = seq.computed_tokens()
        slot.released_at = now

    def evict_idle(self) -> list[int]:
        dropped = [s.index for s in self.slots if s.owner is None and s.cached]
        for index in dropped:
            self.slots[index].cached = []
        return dropped

    def reset(self) -> None:
        for slot in self.slots:
            slot.owner, slot.cached = None, []
