"""Paged KV bookkeeping on its own: prefix sharing, the collision check, LRU reuse, sliding windows,
paired verbs that change nothing when they say no, and a random walk of every verb with the invariants
(and a simulated KV store: every slot a sequence reads holds what its own tokens would have written)
checked after each step."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu.kv_blocks import NULL_BLOCK, BlockName, BlockPool, GroupSpec, KvBlockManager


def manager(num_blocks: int = 32, block_size: int = 4, window: int | None = None, **kw) -> KvBlockManager:
    groups = [GroupSpec("global", num_blocks)]
    if window is not None:
        groups.append(GroupSpec("sliding", num_blocks, window=window))
    return KvBlockManager(groups, block_size=block_size, **kw)


def admit(m: KvBlockManager, seq_id: int, tokens: list[int]) -> int:
    """Allocate and compute ``tokens`` in one step, as a prompt's prefill would."""
    cached = m.allocate(seq_id, tokens)
    m.append(seq_id, tokens[cached:])
    m.check_invariants()
    return cached


def fingerprint(m: KvBlockManager) -> object:
    pools = {
        name: (list(p.ref_counts), list(p.generation), list(p.names), dict(p.cached), list(p.free))
        for name, p in m.pools.items()
    }
    seqs = {i: (list(s.tokens), list(s.block_hashes), {g: list(t) for g, t in s.tables.items()})
            for i, s in m.seqs.items()}  # fmt: skip
    return pools, seqs, m.prefix_query_tokens, m.prefix_hit_tokens


def test_sequences_with_a_common_prefix_share_its_blocks():
    m = manager()
    system = list(range(100, 112))  # three full blocks
    assert admit(m, 1, [*system, 1, 2]) == 0
    assert admit(m, 2, [*system, 3, 4, 5]) == 12
    a, b = m.block_table(1, "global"), m.block_table(2, "global")
    assert a[:3] == b[:3] and a[3] != b[3]
    pool = m.pools["global"]
    assert [pool.ref_counts[x] for x in a[:3]] == [2, 2, 2] and pool.ref_counts[a[3]] == 1
    usage = m.usage()
    assert usage.prefix_hit_tokens == 12 and usage.prefix_query_tokens == 14 + 15
    assert usage.blocks_used["global"] == 5  # 3 shared + one tail each
    m.free(1)
    assert [pool.ref_counts[x] for x in b[:3]] == [1, 1, 1]
    m.check_invariants()


def test_generated_tokens_fill_blocks_that_a_later_prompt_reuses():
    m = manager()
    admit(m, 1, [1, 2, 3, 4, 5, 6])
    m.append(1, [7])  # a sampled token fed back
    m.append(1, [8])  # fills block 1: named now
    m.check_invariants()
    m.free(1)
    assert admit(m, 2, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8


def test_the_hit_leaves_one_token_to_compute():
    m = manager()
    admit(m, 1, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.allocate(2, [1, 2, 3, 4, 5, 6, 7, 8]) == 4  # not 8: the last token's logits are needed
    assert m.allocate(3, [1, 2, 3, 4, 5, 6, 7, 8], max_cached=3) == 0  # and at most max_cached
    m.check_invariants()


def test_a_hash_collision_never_shares_a_wrong_block():
    m = manager(hash_fn=lambda parent, tokens: 42)  # every block has the same name
    admit(m, 1, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.allocate(2, [9, 9, 9, 9, 5, 6, 7, 8, 9]) == 0  # same name, other tokens
    assert m.allocate(3, [1, 2, 3, 4, 1, 2, 3, 4, 9]) == 4  # block 1 holds 1 2 3 4, but after nothing
    assert m.block_table(2, "global") == [] and m.block_table(3, "global") == m.block_table(1, "global")[:1]
    m.check_invariants()


def test_a_tail_is_never_spliced_onto_another_parent_with_the_same_name():
    pool = BlockPool(3)
    parent, child = pool.take(), pool.take()
    pool.name(parent, BlockName(11, None, None, (1,)))
    pool.name(child, BlockName(22, 11, pool.ref(parent), (2,)))
    assert pool.lookup(22, 11, (2,), pool.ref(parent)) == child
    pool.release(parent)
    pool.release(child)
    assert pool.take() == parent  # the least recently freed goes first, and loses its name
    pool.name(parent, BlockName(11, None, None, (1,)))  # the same name, refilled by another prefix
    assert pool.lookup(22, 11, (2,), pool.ref(parent)) is None  # the child was filled after the old one


def test_freed_cached_blocks_are_reused_least_recently_freed_first():
    m = manager(num_blocks=9)  # 8 usable
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19]
    admit(m, 1, a)  # 3 blocks: 2 full (named), 1 partial
    admit(m, 2, b)
    pool = m.pools["global"]
    a_blocks, b_blocks = list(m.block_table(1, "global")), list(m.block_table(2, "global"))
    m.free(1)
    m.free(2)
    # Unnamed blocks first (never used, then the partial tails), then a's, then b's: a tail before its prefix.
    order = list(pool.free)
    named = [x for x in order if pool.names[x] is not None]
    assert named == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    assert order.index(a_blocks[2]) < order.index(a_blocks[1])
    # A newcomer needing 5 fresh blocks takes the 4 unnamed ones and a's tail block.
    admit(m, 3, list(range(50, 70)))
    assert m.block_table(3, "global")[4] == a_blocks[1]
    m.free(3)
    assert m.allocate(4, [*a, 0]) == 4  # a's first block is still cached: revived
    assert m.allocate(5, [*b, 0]) == 8
    assert pool.ref_counts[b_blocks[0]] == 1 and b_blocks[0] not in pool.free
    m.check_invariants()


def test_a_sliding_window_keeps_only_the_blocks_it_can_read():
    m = manager(num_blocks=64, window=8)  # 4-token blocks: a query reads its 8 latest positions
    m.allocate(1, [1])
    for token in range(1, 41):
        m.append(1, [token])
        m.check_invariants()
        table = m.block_table(1, "sliding")
        live = [x for x in table if x != NULL_BLOCK]
        assert len(live) <= 3  # ceil(8 / 4) + 1
    n = m.num_tokens(1)  # 40: the next query at 40 reads 33..39, in blocks 8 and 9
    assert m.block_table(1, "sliding")[:8] == [NULL_BLOCK] * 8
    assert all(x != NULL_BLOCK for x in m.block_table(1, "global")) and n == 40
    assert m.usage().blocks_used == {"global": 10, "sliding": 2}


def test_a_sliding_prefix_hit_needs_only_the_window():
    # The sliding pool is small: while the prompt is computed, its dropped blocks are reused for its later
    # ones, so only the window's blocks stay cached; a hit still covers the whole prompt but its last token.
    groups = [GroupSpec("global", 64), GroupSpec("sliding", 5, window=8)]  # 4 usable sliding blocks
    m = KvBlockManager(groups, block_size=4)
    prompt = list(range(1, 42))  # 41 tokens
    m.allocate(1, prompt)
    for start in range(0, 41, 4):  # prefill in 4-token chunks
        m.append(1, prompt[start : start + 4])
        m.check_invariants()
    m.free(1)
    sliding = m.pools["sliding"]
    assert len(sliding.cached) < 10  # the early blocks lost their names
    assert m.allocate(2, prompt) == 40  # the query at 40 reads 33..39: blocks 8 and 9
    assert m.block_table(2, "sliding")[:8] == [NULL_BLOCK] * 8
    assert len(m.block_table(2, "global")) == 10 and NULL_BLOCK not in m.block_table(2, "global")
    m.check_invariants()
    m.free(2)
    # Another sequence takes every sliding block: the global pool still holds the whole prompt, but no
    # window is whole any more, so nothing is a hit.
    m.allocate(3, [99])
    m.append(3, [99] * 12)  # 4 blocks: every sliding block
    m.free(3)
    assert m.allocate(4, prompt) == 0
    m.check_invariants()


def test_can_allocate_and_can_append_say_no_without_changing_anything():
    m = manager(num_blocks=5, window=None)  # 4 usable blocks: 16 tokens
    admit(m, 1, list(range(12)))  # 3 blocks
    before = fingerprint(m)
    assert not m.can_allocate(2, list(range(100, 108)))  # needs 2, 1 free
    assert not m.can_append(1, 5)  # 17 tokens need 5 blocks
    assert fingerprint(m) == before
    assert m.can_append(1, 4) and m.can_allocate(2, [100, 101, 102])
    assert fingerprint(m) == before  # asking is free, saying yes too


def test_a_cached_prefix_counts_against_room_only_when_it_must_be_revived():
    m = manager(num_blocks=5)  # 4 usable
    admit(m, 1, list(range(9)))  # 3 blocks, 2 named
    m.free(1)
    # 2 cached blocks to revive + 2 fresh for 9..15 = 4: fits.
    assert m.can_allocate(2, list(range(16)))
    assert not m.can_allocate(2, list(range(17)))


# --- a random walk over every verb -------------------------------------------------------------------

TOKENS = st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=14)


class BlockWalk(RuleBasedStateMachine):
    """Random allocate / append / free, invariants after each; a simulated KV store checks that every
    slot a sequence can read holds what its own tokens wrote there (so no wrong or stale sharing)."""

    hash_fn = None  # the real chained hash
    window: int | None = 6

    @initialize(num_blocks=st.integers(min_value=3, max_value=24), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks: int, block_size: int) -> None:
        kw = {"hash_fn": self.hash_fn} if self.hash_fn is not None else {}
        self.m = manager(num_blocks=num_blocks, block_size=block_size, window=self.window, **kw)
        self.kv: dict[tuple[str, int], tuple[int, ...]] = {}  # (group, slot) -> the prefix it was written for
        self.next_id = 0

    @rule(tokens=TOKENS)
    def allocate(self, tokens: list[int]) -> None:
        seq_id = self.next_id
        before = fingerprint(self.m)
        if not self.m.can_allocate(seq_id, tokens):
            assert fingerprint(self.m) == before
            return
        self.next_id += 1
        cached = self.m.allocate(seq_id, tokens)
        assert cached % self.m.block_size == 0 and cached < len(tokens)
        assert self.m.num_tokens(seq_id) == cached

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data(), new=TOKENS)
    def append(self, data: st.DataObject, new: list[int]) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.m.seqs)))
        before = fingerprint(self.m)
        if not self.m.can_append(seq_id, len(new)):
            assert fingerprint(self.m) == before
            return
        start = self.m.num_tokens(seq_id)
        self.m.append(seq_id, new)
        tokens = self.m.seqs[seq_id].tokens
        for group in self.m.groups:  # the model writes this step's keys
            for offset, slot in enumerate(self.m.slots(seq_id, group, start, len(new))):
                self.kv[group, slot] = tuple(tokens[: start + offset + 1])

    @precondition(lambda self: self.m.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.m.free(data.draw(st.sampled_from(sorted(self.m.seqs))))

    @invariant()
    def books_agree(self) -> None:
        self.m.check_invariants()

    @invariant()
    def every_readable_slot_holds_this_sequences_prefix(self) -> None:
        m, size = self.m, self.m.block_size
        for seq_id, state in m.seqs.items():
            for group in m.groups:
                table = state.tables[group]
                for position in range(len(state.tokens)):
                    if table[position // size] == NULL_BLOCK:
                        continue  # dropped from the window: never read again
                    slot = m.slots(seq_id, group, position, 1)[0]
                    assert self.kv.get((group, slot)) == tuple(state.tokens[: position + 1])


class WeakHashWalk(BlockWalk):
    """Names from a 2-bit hash that ignores the parent: collisions everywhere, on full-attention pools
    (whose chains are checked block by block from the start)."""

    hash_fn = staticmethod(lambda parent, tokens: hash(tokens) % 4)
    window = None


WALK_SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBlockWalk = BlockWalk.TestCase
TestBlockWalk.settings = WALK_SETTINGS
TestWeakHashWalk = WeakHashWalk.TestCase
TestWeakHashWalk.settings = WALK_SETTINGS


def test_bad_pool_shapes_are_refused():
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("global", 1)])
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("a", 4), GroupSpec("a", 4)])
    with pytest.raises(ValueError):
        KvBlockManager([GroupSpec("a", 4, window=0)])
