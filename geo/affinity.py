"""Prefix affinity: requests whose prompts start alike go where that start is already in a KV cache.

A prompt's leading text is cut into fixed-size blocks and each block hashed together with the hash before
it, so one hash names a whole prefix (as a paged KV cache names its blocks). The table maps prefix hashes to
the replica that last served them, least recently used out first; the longest known prefix of a new prompt
says where its KV cache most likely already is, and how long that shared part is.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_BLOCKS = 64  # prefixes longer than this many blocks share their first MAX_BLOCKS anyway


def prefix_chain(text: str, block_chars: int, min_chars: int) -> tuple[int, ...]:
    """Chained hashes of ``text``'s whole leading blocks; empty when it is shorter than ``min_chars``."""
    if len(text) < min_chars:
        return ()
    chain: list[int] = []
    h = 0
    for i in range(min(len(text) // block_chars, MAX_BLOCKS)):
        h = hash((h, text[i * block_chars : (i + 1) * block_chars]))
        chain.append(h)
    return tuple(chain)


class AffinityTable:
    def __init__(self, entries: int, block_chars: int, min_chars: int) -> None:
        self.entries = entries
        self.block_chars = block_chars
        self.min_blocks = max(1, -(-min_chars // block_chars))
        self._owner: OrderedDict[int, str] = OrderedDict()

    def lookup(self, chain: tuple[int, ...]) -> tuple[str, int] | None:
        """The replica holding the longest known prefix of ``chain``, and its length in characters."""
        for n in range(len(chain), self.min_blocks - 1, -1):
            owner = self._owner.get(chain[n - 1])
            if owner is not None:
                return owner, n * self.block_chars
        return None

    def record(self, chain: tuple[int, ...], replica: str) -> None:
        owner = self._owner
        for h in chain[self.min_blocks - 1 :]:
            owner[h] = replica
            owner.move_to_end(h)
        while len(owner) > self.entries:
            owner.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A replica restarted or was ejected: what it held is gone."""
        for h in [h for h, r in self._owner.items() if r == replica]:
            del self._owner[h]
