"""Paged KV bookkeeping: which block of which pool holds each token of each sequence.

Pure Python, no tensors: the model's cache (gpu/kv_cache.py) holds the numbers, this module says where.

Layers belong to a *group* by attention kind ("global": full causal, "sliding": a window of W tokens);
each group has its own :class:`BlockPool` of fixed-size blocks. Block id 0 of every pool is the null
block: never handed out, it pads block tables and stands in for sliding-window blocks that were dropped.

Prefix caching: a full block is named by a chained hash of its tokens and its parent block's hash, so
two prompts that start the same way share blocks (by reference count). A hit is checked against the
block's stored tokens and parent hash, so a hash collision can never share a wrong block. Freed blocks
that still hold a named prefix wait in the free queue in LRU order and are revived by a later hit; a
block reused for other tokens loses its name.

The manager speaks in paired verbs over all groups at once: ``can_allocate``/``allocate`` (a newcomer
takes its cached prefix and gets its :class:`BlockTable`), ``can_append``/``append`` (room for a step's new
tokens), ``free``. The manager keeps the pools (reference counts, the free queue, the names) and no table:
each :class:`BlockTable` belongs to its sequence, which hands it to every verb, so what a sequence holds is
reached, and freed, through the sequence alone.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

NULL_BLOCK = 0

Tokens = tuple[int, ...]
# (parent block's hash or None for the first block, the block's tokens) -> the block's hash
HashFn = Callable[[int | None, Tokens], int]


def chain_hash(parent: int | None, tokens: Tokens) -> int:
    """A 128-bit digest of the parent's hash and the block's tokens (blake2b: stable across processes)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"-" if parent is None else parent.to_bytes(16, "little"))
    digest.update(array("q", tokens).tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One pool of blocks for the layers of one attention kind; ``window`` in tokens, None for full."""

    name: str
    num_blocks: int
    window: int | None = None


BlockRef = tuple[int, int]  # (block id, generation): a block's content from one fill to its reuse


@dataclass(frozen=True, slots=True)
class BlockName:
    """What a full block holds: its chained hash, its parent's hash and block, and its tokens."""

    block_hash: int
    parent_hash: int | None
    parent: BlockRef | None  # the parent block in the same pool when it was filled (None: first, dropped)
    tokens: Tokens


class BlockPool:
    """``num_blocks`` blocks of one group: reference counts, the free queue and the prefix-cache names.

    The free queue is reused from its head. Blocks that hold nothing worth keeping go to the head; blocks
    that still hold a named prefix go to the tail, so they are reused least recently freed first. A
    block's generation counts its reuses, so a child block can tell whether its parent still holds what
    it held when the child filled.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError("a pool needs the null block and at least one more")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.generation = [0] * num_blocks
        self.names: list[BlockName | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    def ref(self, block: int) -> BlockRef:
        return block, self.generation[block]

    def lookup(
        self, block_hash: int, parent_hash: int | None, tokens: Tokens, parent: BlockRef | None
    ) -> int | None:
        """The cached block named ``block_hash``, if it really holds ``tokens`` after ``parent_hash``, and
        after the block ``parent`` when both it and the cached block's parent are known (so even a
        colliding chain of hashes cannot splice a wrong tail onto a prefix)."""
        block = self.cached.get(block_hash)
        if block is None:
            return None
        name = self.names[block]
        assert name is not None
        if name.tokens != tokens or name.parent_hash != parent_hash:
            return None
        if name.parent is not None and parent is not None and name.parent != parent:
            return None
        return block

    def take(self) -> int:
        """A fresh block (ref 1); a cached one from the queue's head loses its name."""
        block, _ = self.free.popitem(last=False)
        name = self.names[block]
        if name is not None:
            del self.cached[name.block_hash]
            self.names[block] = None
        self.generation[block] += 1
        self.ref_counts[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more table holds ``block`` (a prefix hit); a cached block is revived from the queue."""
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1

    def release(self, block: int) -> bool:
        """One table less holds ``block``; True when that freed it."""
        assert block != NULL_BLOCK and self.ref_counts[block] > 0, f"release of unheld block {block}"
        self.ref_counts[block] -= 1
        if self.ref_counts[block]:
            return False
        self.free[block] = None
        if self.names[block] is None:
            self.free.move_to_end(block, last=False)  # nothing to keep: reuse it first
        return True

    def name(self, block: int, name: BlockName) -> None:
        """``block`` just filled: cached under ``name.block_hash`` unless another block has that name."""
        if name.block_hash not in self.cached and self.names[block] is None:
            self.cached[name.block_hash] = block
            self.names[block] = name


@dataclass(eq=False, slots=True)
class BlockTable:
    """One sequence's blocks in every group and the tokens whose KV they hold: made by
    :meth:`KvBlockManager.allocate`, owned by the sequence, given back by :meth:`KvBlockManager.free`."""

    block_size: int
    tokens: list[int]  # tokens whose KV is written (or is being written this step), in order
    block_hashes: list[int]  # the chained hash of each full block of ``tokens``
    tables: dict[str, list[int]] = field(default_factory=dict)  # per group, block ids by position // size
    prefill_tokens: int = 0  # the tokens it was admitted to compute: their blocks are promised to it
    num_dropped: dict[str, int] = field(default_factory=dict)  # leading table entries out of the window
    promised: dict[str, int] = field(default_factory=dict)  # per group, blocks still promised to it

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def table(self, group: str) -> list[int]:
        return self.tables[group]

    def slots(self, group: str, start: int, count: int) -> list[int]:
        """Cache slots of positions [start, start + count) in ``group``'s pool."""
        table, size = self.tables[group], self.block_size
        slots = [table[p // size] * size + p % size for p in range(start, start + count)]
        assert count == 0 or table[(start + count - 1) // size] != NULL_BLOCK
        return slots


@dataclass(frozen=True, slots=True)
class KvUsage:
    blocks_used: dict[str, int]  # held by a sequence (cached free blocks are not used)
    blocks_total: dict[str, int]  # without the null block
    blocks_cached: dict[str, int]  # holding a named prefix, held or not
    prefix_query_tokens: int  # prompt tokens looked up at admission
    prefix_hit_tokens: int  # of which found cached


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KvBlockManager:
    """One pool per group, and the blocks promised to the tables it made (see the module's docstring)."""

    def __init__(
        self, groups: Sequence[GroupSpec], block_size: int = 16, hash_fn: HashFn = chain_hash
    ) -> None:
        if not groups or len({g.name for g in groups}) != len(groups):
            raise ValueError("groups need distinct names")
        if block_size < 1 or any(g.window is not None and g.window < 1 for g in groups):
            raise ValueError("block_size and windows must be positive")
        self.groups = {g.name: g for g in groups}
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.pools = {g.name: BlockPool(g.num_blocks) for g in groups}
        # Per group, the blocks the admitted sequences still take to finish their prompts (what their
        # tables promise): room a newcomer cannot have.
        self.promised = dict.fromkeys(self.pools, 0)
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # --- admission ------------------------------------------------------------------------------------

    def can_allocate(self, tokens: Sequence[int], max_cached: int | None = None) -> bool:
        """Room for ``tokens`` (a prompt, or a preempted sequence's prompt and outputs) to be computed:
        its cached prefix revived and blocks for the rest free, beside those the sequences already
        admitted still take to finish their own prompts. Their growth past that is not reserved: when
        blocks run out the scheduler preempts."""
        _hashes, hits = self._prefix_hits(tokens, max_cached)
        for name, pool in self.pools.items():
            revived = sum(1 for b in hits[name] if b != NULL_BLOCK and pool.ref_counts[b] == 0)
            fresh = self._blocks_to_fill(name, len(hits[name]), len(tokens))
            if revived + fresh + self.promised[name] > pool.num_free:
                return False
        return True

    def _blocks_to_fill(self, group: str, num_blocks: int, num_tokens: int) -> int:
        """Blocks a table of ``num_blocks`` still takes to hold ``num_tokens`` (a sliding group's table
        holds at most its window's at once)."""
        fresh = max(0, _blocks_for(num_tokens, self.block_size) - num_blocks)
        window = self.groups[group].window
        return fresh if window is None else min(fresh, _blocks_for(window, self.block_size) + 1)

    def allocate(self, tokens: Sequence[int], max_cached: int | None = None) -> BlockTable:
        """A newcomer's table, holding the longest cached prefix of ``tokens`` (at most ``max_cached``
        tokens): its ``num_tokens`` says how long that is.

        Only the prefix is taken: the rest gets blocks as it is computed (:meth:`append`)."""
        assert self.can_allocate(tokens, max_cached)
        hashes, hits = self._prefix_hits(tokens, max_cached)
        num_blocks = len(next(iter(hits.values())))
        num_cached = num_blocks * self.block_size
        for name, blocks in hits.items():
            for block in blocks:
                if block != NULL_BLOCK:
                    self.pools[name].share(block)
        dropped = {name: self._first_live_block(name, num_cached) for name in self.pools}
        table = BlockTable(
            self.block_size, list(tokens[:num_cached]), hashes[:num_blocks], hits, len(tokens), dropped
        )
        self._promise(table)
        self.prefix_query_tokens += len(tokens)
        self.prefix_hit_tokens += num_cached
        return table

    def _promise(self, table: BlockTable) -> None:
        """Bring ``promised`` up to date with what ``table`` still takes to finish its prompt."""
        for name in self.pools:
            now = self._blocks_to_fill(name, len(table.tables[name]), table.prefill_tokens)
            self.promised[name] += now - table.promised.get(name, 0)
            table.promised[name] = now

    def _prefix_hits(
        self, tokens: Sequence[int], max_cached: int | None
    ) -> tuple[list[int], dict[str, list[int]]]:
        """The chained hashes of ``tokens``' full blocks, and per group the blocks of the longest prefix
        every group holds (null where a sliding group needs no block).

        The prefix is block aligned and leaves at least one token to compute: its logits pick the next."""
        size = self.block_size
        limit = len(tokens) - 1 if max_cached is None else min(len(tokens) - 1, max_cached)
        max_blocks = max(0, limit) // size
        hashes: list[int] = []
        parent: int | None = None
        found = {name: [] for name in self.pools}  # block or None, per block index
        for index in range(max_blocks):
            block_tokens = tuple(tokens[index * size : (index + 1) * size])
            block_hash = self.hash_fn(parent, block_tokens)
            for name, pool in self.pools.items():
                before = found[name][-1] if index else None
                parent_ref = pool.ref(before) if before is not None else None
                found[name].append(pool.lookup(block_hash, parent, block_tokens, parent_ref))
            hashes.append(block_hash)
            parent = block_hash
        best = 0
        for num_blocks in range(max_blocks, 0, -1):
            if all(self._holds_prefix(name, found[name], num_blocks) for name in self.pools):
                best = num_blocks
                break
        hits = {}
        for name in self.pools:
            first = self._first_live_block(name, best * size)
            hits[name] = [NULL_BLOCK] * first + [b for b in found[name][first:best] if b is not None]
        return hashes, hits

    def _holds_prefix(self, group: str, found: list[int | None], num_blocks: int) -> bool:
        first = self._first_live_block(group, num_blocks * self.block_size)
        return all(block is not None for block in found[first:num_blocks])

    def _first_live_block(self, group: str, num_tokens: int) -> int:
        """The first block the next query (at position ``num_tokens``) can read in ``group``.

        A query at p attends keys with p - key < W, so blocks ending at or before p - W + 1 are dead."""
        window = self.groups[group].window
        if window is None:
            return 0
        return max(0, num_tokens - window + 1) // self.block_size

    # --- a step's new tokens --------------------------------------------------------------------------

    def can_append(self, state: BlockTable, num_new: int) -> bool:
        """Room for ``num_new`` more tokens of ``state``'s sequence this step (sliding blocks it drops
        count)."""
        need = _blocks_for(len(state.tokens) + num_new, self.block_size)
        for name, pool in self.pools.items():
            table = state.tables[name]
            freed = sum(1 for b in self._dead_blocks(name, state) if pool.ref_counts[table[b]] == 1)
            if need - len(table) > pool.num_free + freed:
                return False
        return True

    def append(self, state: BlockTable, new_tokens: Sequence[int]) -> None:
        """``new_tokens`` get their KV written this step: drop dead sliding blocks, give blocks to the new
        tokens, and name the blocks they fill (prompt or generated tokens alike)."""
        assert self.can_append(state, len(new_tokens))
        need = _blocks_for(len(state.tokens) + len(new_tokens), self.block_size)
        for name, pool in self.pools.items():
            table = state.tables[name]
            for index in self._dead_blocks(name, state):
                pool.release(table[index])
                table[index] = NULL_BLOCK
                state.num_dropped[name] = index + 1
            table.extend(pool.take() for _ in range(need - len(table)))
        state.tokens.extend(new_tokens)
        self._promise(state)
        self._name_full_blocks(state)

    def _dead_blocks(self, group: str, state: BlockTable) -> range:
        """Indexes of ``group``'s blocks, still held, that the sequence's next query can no longer read."""
        first = self._first_live_block(group, len(state.tokens))
        return range(state.num_dropped[group], min(first, len(state.tables[group])))

    def _name_full_blocks(self, state: BlockTable) -> None:
        size = self.block_size
        for index in range(len(state.block_hashes), len(state.tokens) // size):
            parent = state.block_hashes[-1] if state.block_hashes else None
            block_tokens = tuple(state.tokens[index * size : (index + 1) * size])
            block_hash = self.hash_fn(parent, block_tokens)
            state.block_hashes.append(block_hash)
            for name, pool in self.pools.items():
                table = state.tables[name]
                if table[index] != NULL_BLOCK:
                    before = table[index - 1] if index else NULL_BLOCK
                    parent_ref = pool.ref(before) if before != NULL_BLOCK else None
                    pool.name(table[index], BlockName(block_hash, parent, parent_ref, block_tokens))

    # --- leaving --------------------------------------------------------------------------------------

    def free(self, state: BlockTable) -> None:
        """``state``'s sequence leaves; its named blocks stay cached. Released last block first, so a prefix
        (the part others reuse) outlives its tail in the LRU queue."""
        for name, pool in self.pools.items():
            for block in reversed(state.tables[name]):
                if block != NULL_BLOCK:
                    pool.release(block)
            self.promised[name] -= state.promised.pop(name, 0)
        state.tables = {}  # it holds nothing now: a table freed twice, or used after, fails loudly

    def reset(self) -> None:
        """The model's memory was wiped: no block held, no cached prefix (tables made before are void)."""
        self.pools = {g.name: BlockPool(g.num_blocks) for g in self.groups.values()}
        self.promised = dict.fromkeys(self.pools, 0)

    # --- reading --------------------------------------------------------------------------------------

    def usage(self) -> KvUsage:
        pools = self.pools.items()
        return KvUsage(
            blocks_used={name: pool.num_used for name, pool in pools},
            blocks_total={name: pool.num_blocks - 1 for name, pool in pools},
            blocks_cached={name: len(pool.cached) for name, pool in pools},
            prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
        )

    def check_invariants(self, live: Iterable[BlockTable]) -> None:
        """Assert the books agree with themselves and with ``live``, every table not yet freed (tests call
        this after every operation): a table dropped without :meth:`free` shows as blocks held by no one."""
        live = list(live)
        for state in live:
            assert len(state.block_hashes) == len(state.tokens) // self.block_size
        for name, pool in self.pools.items():
            assert pool.ref_counts == self._holders(name, live), f"{name}: ref counts != tables holding them"
            promised = sum(s.promised[name] for s in live)
            assert self.promised[name] == promised, f"{name}: promised blocks != the tables' promises"
            assert pool.ref_counts[NULL_BLOCK] == 0 and NULL_BLOCK not in pool.free, "null block allocated"
            for block in range(1, pool.num_blocks):
                assert (block in pool.free) == (pool.ref_counts[block] == 0), f"block {block} free and held"
                name = pool.names[block]
                assert name is None or pool.cached[name.block_hash] == block, "a name not in the cache"
            for block_hash, block in pool.cached.items():
                name = pool.names[block]
                assert name is not None and name.block_hash == block_hash
                assert len(name.tokens) == self.block_size
                assert self.hash_fn(name.parent_hash, name.tokens) == block_hash

    def _holders(self, group: str, live: list[BlockTable]) -> list[int]:
        """How many tables hold each block of ``group``, checking each table on the way: its length, no
        block twice, null only where the window dropped a block, and named blocks hold the table's tokens."""
        pool, size = self.pools[group], self.block_size
        holders = [0] * pool.num_blocks
        for state in live:
            table = state.tables[group]
            assert len(table) == _blocks_for(len(state.tokens), size), "table length != tokens"
            dropped = state.num_dropped[group]
            live = table[dropped:]
            assert table[:dropped] == [NULL_BLOCK] * dropped and NULL_BLOCK not in live, "a hole in a table"
            assert len(set(live)) == len(live), "a table holds a block twice"
            first_live = self._first_live_block(group, len(state.tokens))
            for index, block in enumerate(table):
                if block == NULL_BLOCK:
                    assert index < first_live, f"{group}: a live block of the window is missing"
                    continue
                holders[block] += 1
                name = pool.names[block]
                if name is not None:  # a named block holds this table's tokens
                    assert name.block_hash == state.block_hashes[index]
                    assert name.tokens == tuple(state.tokens[index * size : (index + 1) * size])
        return holders
